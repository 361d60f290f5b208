"""Interactive quiz: one card per question, immediate feedback, answers kept in a Scorecard.

The score is the first-try score: each question's first answer counts, later tries are for
learning (see course_lib.quiz.scorecard). Feedback on a wrong try speaks only of what was picked;
the full answer shows once the question is solved or after REVEAL_AFTER wrong tries. The widget
says so above the cards. ``show_quiz`` keeps the tries in the learner's home folder, so running
the cell again continues them rather than offering a fresh first try.

Each card exposes its controls (``control``, ``check_button``, ``feedback``, and for
spot-the-bug ``line_buttons``) so tests and graders can drive it like a learner would.
Options and matching choices are shown in the learner's own order (``card.order``, see
``course_lib.quiz.order``); the controls' values, and so the scorecard, stay in the bank's terms.
Inline `code` in a bank's text is shown as <code> wherever the front end renders HTML (prompts,
feedback, checkboxes, matching items) and without its backticks in plain-text controls (radio
options, drop-downs).
"""

from __future__ import annotations

import html
import math
import re
from pathlib import Path

import ipywidgets as w

from course_lib.quiz.bank import QuizBank, load_bank
from course_lib.quiz.learner import answers_path, learner_id
from course_lib.quiz.questions import (
    Feedback,
    Matching,
    MultiSelect,
    Numeric,
    Question,
    SingleChoice,
    SpotTheBug,
)
from course_lib.quiz.scorecard import REVEAL_AFTER, Scorecard
from course_lib.quiz.text import INLINE_CODE, render_text

UNCHOSEN = "(choose)"
RULES = (f"Only your first answer to each question counts (the first-try score). Try again as often "
         f"as you like to learn: the full answer shows once you get it right, or after {REVEAL_AFTER} wrong tries.")
# Long texts wrap within the card: ipywidgets gives a radio item a fixed height and keeps a
# checkbox's description, or a button's, on one line. Here an option's text wraps, and its further
# lines start under its first, beside the radio or checkbox, which stays level with the first line.
# A code line too long for the card (a narrow window) wraps too, its further lines indented past
# the code's start, rather than being cut off. One-line options and code lines keep ipywidgets' own
# size and place: radio items 20px high, checkboxes and buttons 28px. Every QuizWidget holds this
# style, and so does a spot-the-bug card's control.
_STYLE = w.HTML(
    "<style>.course-code-line{text-align:left!important;font-family:monospace!important;"
    "white-space:pre-wrap!important;overflow-wrap:anywhere;height:auto!important;"
    "min-height:var(--jp-widgets-inline-height);line-height:20px!important;"
    "padding:4px 10px 4px calc(10px + 6ch)!important;text-indent:-6ch}"
    ".course-quiz-option .widget-radio-box label{display:flex!important;align-items:flex-start;"
    "height:auto!important;white-space:normal!important;overflow-wrap:anywhere}"
    ".course-quiz-option .widget-radio-box input{order:-1;flex:none;float:none!important}"
    ".course-quiz-option.widget-checkbox{height:auto!important;min-height:var(--jp-widgets-inline-height)}"
    ".course-quiz-option .widget-label-basic{flex:0 1 auto!important;min-width:0;white-space:normal!important;"
    "line-height:20px!important;padding:4px 0 4px 21px;text-indent:-21px;overflow-wrap:anywhere}"
    ".course-quiz-option .widget-label-basic span{white-space:normal!important}</style>",
    layout=w.Layout(display="none"),  # a <style> applies where it is hidden too; this takes no room
)
# As wide as its content, at most the card's width less the control's own margins (ipywidgets
# gives checkboxes and drop-downs a margin each side; 100% plus that overflows the card).
_FIT_WIDTH = dict(width="max-content", max_width="calc(100% - 2 * var(--jp-widgets-margin))")


def as_html(text: str) -> str:
    """``text`` escaped for HTML, with `code` spans as <code>. Safe for any text: escaping runs
    first, and it leaves backticks alone, so only the <code> tags added here are markup."""
    return INLINE_CODE.sub(r"<code>\1</code>", html.escape(text))


def as_plain(text: str) -> str:
    """``text`` for controls that show plain text: `code` spans lose their backticks."""
    return INLINE_CODE.sub(r"\1", text)


_THOUSANDS = re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d*)?")


def typed_number(text: str) -> float | None:
    """The number typed into a numeric answer box, or None when the box is empty (nothing to judge).
    Commas between thousands are read as such (131,072); anything else that is not a finite number
    raises ValueError saying what to type."""
    text = text.strip()
    if not text:
        return None
    if _THOUSANDS.fullmatch(text):
        text = text.replace(",", "")
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ValueError("Type a number alone, such as 131072 or 0.5: the unit is given beside the box.")
    return value


def _word(correct: bool) -> str:
    return "right" if correct else "wrong"


class QuestionCard(w.VBox):
    """Prompt, answer control, check button and feedback for one question.

    ``order`` lists, for a single- or multiple-choice card, the bank index of each option in
    the order shown (empty for other kinds)."""

    def __init__(self, number: int, question: Question, scorecard: Scorecard, on_answer, learner: str) -> None:
        self.question, self.scorecard, self._on_answer, self.learner = question, scorecard, on_answer, learner
        self.feedback = w.HTML()
        self.check_button = w.Button(description="Check", button_style="primary")
        self.check_button.on_click(lambda _: self.submit())
        self.line_buttons: list[w.Button] = []
        self.order = question.option_order(learner) if isinstance(question, (SingleChoice, MultiSelect)) else []
        self.control = self._build_control()
        prompt = w.HTML(f"<b>{number}. {as_html(question.prompt)}</b>")
        buttons = [] if isinstance(question, SpotTheBug) else [self.check_button]
        record = scorecard.records.get(question.id)
        if record is not None:  # tries saved in an earlier session
            tries = f"{record.attempts} {'try' if record.attempts == 1 else 'tries'}"
            self.feedback.value = f"<i>Answered before: {tries}, the first one {_word(record.first_correct)}.</i>"
        super().__init__([prompt, self.control, *buttons, self.feedback], layout=w.Layout(margin="0 0 14px 0"))

    def _build_control(self) -> w.Widget:
        q = self.question
        if isinstance(q, SingleChoice):
            radios = w.RadioButtons(options=[(as_plain(q.options[i].text), i) for i in self.order], value=None,
                                    layout=w.Layout(**_FIT_WIDTH))
            radios.add_class("course-quiz-option")
            return radios
        if isinstance(q, MultiSelect):
            boxes = [w.Checkbox(description=as_html(q.options[i].text), description_allow_html=True,
                                tooltip=as_plain(q.options[i].text),  # else the hover shows the HTML's escapes
                                value=False, indent=False, layout=w.Layout(**_FIT_WIDTH))
                     for i in self.order]
            for box in boxes:
                box.add_class("course-quiz-option")
            return w.VBox(boxes)
        if isinstance(q, Numeric):  # a text box: it starts empty, so an untouched box answers nothing
            return w.HBox([w.Text(value="", placeholder="a number", layout=w.Layout(width="14em")), w.Label(q.unit)])
        if isinstance(q, Matching):
            choices = [(UNCHOSEN, UNCHOSEN), *((as_plain(c), c) for c in q.choice_order(self.learner))]
            # A drop-down shows one line and never wraps: size it to its longest choice (the
            # select's own width at max-content), and let it move below the item when too narrow.
            fit = w.Layout(**_FIT_WIDTH)
            return w.VBox([
                w.HBox([w.HTML(as_html(left), layout=w.Layout(width="22em")),
                        w.Dropdown(options=choices, value=UNCHOSEN, layout=fit)],
                       layout=w.Layout(flex_flow="row wrap", align_items="center"))
                for left, _ in q.pairs
            ])
        if isinstance(q, SpotTheBug):
            for number, line in enumerate(q.lines, start=1):
                # width auto, stretched: the card's width less the button's margins (100% plus the
                # margins would overflow the card and give it a horizontal scrollbar)
                button = w.Button(description=f"{number:>2}  {line}",
                                  layout=w.Layout(width="auto", align_self="stretch"), tooltip="Click the faulty line")
                button.add_class("course-code-line")
                button.on_click(lambda _, n=number: self.submit(n))
                self.line_buttons.append(button)
            return w.VBox([_STYLE, *self.line_buttons])
        raise TypeError(f"No card for question kind {q.kind!r}.")

    def current_answer(self):
        """The answer the controls hold now, in the bank's terms, or None if there is none yet;
        ValueError, saying what to type, for a numeric box that holds no number."""
        q, c = self.question, self.control
        if isinstance(q, SingleChoice):
            return c.value
        if isinstance(q, MultiSelect):
            return {i for i, box in zip(self.order, c.children) if box.value}
        if isinstance(q, Numeric):
            return typed_number(c.children[0].value)
        if isinstance(q, Matching):
            chosen = {left: row.children[1].value for (left, _), row in zip(q.pairs, c.children)}
            return None if UNCHOSEN in chosen.values() else chosen
        raise TypeError("spot-the-bug cards are answered by clicking a line")

    def submit(self, answer=None) -> Feedback | None:
        """Check the given answer (or the controls' current one), show and record the feedback.
        No answer yet (nothing picked, an empty number box) or text that is no number is neither
        judged nor recorded: the feedback says what to do first."""
        try:
            answer = self.current_answer() if answer is None else answer
        except ValueError as error:
            return self._ask(str(error))
        if answer is None or answer == set():
            return self._ask("Type a number first." if isinstance(self.question, Numeric) else "Pick an answer first.")
        feedback = self.scorecard.answer(self.question.id, answer)
        color, mark = ("#1a7f37", "✓") if feedback.correct else ("#cf222e", "✗")
        record = self.scorecard.records[self.question.id]
        note = "" if record.attempts == 1 else (
            f"<br><small>Try {record.attempts}, for practice: the score keeps your first try, which was "
            f"{_word(record.first_correct)}.</small>")
        self.feedback.value = f"<span style='color:{color}'>{mark} {as_html(feedback.message)}</span>{note}"
        self._on_answer()
        return feedback

    def _ask(self, request: str) -> None:
        self.feedback.value = f"<span style='color:#a15c00'>{as_html(request)}</span>"


class QuizWidget(w.VBox):
    """A whole bank as cards, then an "N / M answered" counter and the running first-try score.
    ``scorecard`` holds the answers; ``learner`` (default: ``learner_id()``) fixes the order options
    are shown in; with a ``path`` the scorecard resumes from, and saves to, that file."""

    def __init__(self, bank: QuizBank, learner: str | None = None, path: str | Path | None = None) -> None:
        self.bank = bank
        self.learner = learner_id() if learner is None else learner
        self.scorecard = Scorecard(bank, self.learner, path)
        self.score_label = w.HTML()
        self.answered_label = w.HTML()  # "N / M answered", under the last card
        self.cards = {q.id: QuestionCard(n, q, self.scorecard, self._refresh, self.learner)
                      for n, q in enumerate(bank.questions, start=1)}
        self._refresh()
        super().__init__([w.HTML(f"<h3>{as_html(bank.title)}</h3><p>{as_html(RULES)}</p>"),
                          *self.cards.values(), self.answered_label, self.score_label, _STYLE])

    def _refresh(self) -> None:
        self.answered_label.value = f"<b>{as_html(self.scorecard.progress())}</b>"
        self.score_label.value = f"<b>{as_html(self.scorecard.summary())}</b>"

    def as_text(self, show_answers: bool = False) -> str:
        """The same quiz as plain text, options in the order this learner sees them."""
        return render_text(self.bank, show_answers, self.learner)

    def _repr_mimebundle_(self, **kwargs):
        """Widget view where a front end can show it; the quiz as text everywhere else."""
        bundle = super()._repr_mimebundle_(**kwargs)
        bundle["text/plain"] = self.as_text()
        return bundle


def show_quiz(name_or_path: str | Path, learner: str | None = None, keep_answers: bool = True) -> QuizWidget:
    """Load ``quizzes/NAME.yaml`` (or a path) as an interactive quiz; display the result in a cell.
    ``learner`` defaults to ``learner_id()``. With ``keep_answers`` the tries are kept in
    ``answers_path`` (under the home folder) and picked up again the next time."""
    bank = load_bank(name_or_path)
    learner = learner_id() if learner is None else learner
    return QuizWidget(bank, learner, answers_path(bank.source, learner) if keep_answers else None)
