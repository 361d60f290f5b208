"""Write your answer, then compare it with a model answer: a text box and a button that reveals."""

from __future__ import annotations

import html

import ipywidgets as w


class StaffAnswer(w.VBox):
    """The question, a box for the learner's answer, and the model answer behind a button, with
    ``compare``: what to check in one's own answer. The button stays disabled until something is
    written: the comparison is the point."""

    def __init__(self, question: str, answer: str, compare: str) -> None:
        self.answer, self.compare = answer, compare
        self.box = w.Textarea(placeholder="Your answer, in two or three sentences", layout=w.Layout(width="95%", height="6em"))
        self.button = w.Button(description="Compare with the staff answer", disabled=True,
                               layout=w.Layout(width="auto"))
        self.reveal = w.HTML()
        self.box.observe(self._typed, names="value")
        self.button.on_click(self._show)
        super().__init__([w.HTML(f"<b>{html.escape(question)}</b>"), self.box, self.button, self.reveal])

    def _typed(self, change) -> None:
        self.button.disabled = not change["new"].strip()

    def _show(self, _button=None) -> None:
        self.reveal.value = (f"<blockquote><i>{html.escape(self.answer)}</i></blockquote>"
                             f"<p>Compare: {html.escape(self.compare)}</p>")
