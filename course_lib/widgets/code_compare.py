"""Two pieces of source side by side, syntax-highlighted (for kernel vs reference)."""

from __future__ import annotations

import inspect

from IPython.display import HTML
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer


def side_by_side(left, right, left_title: str = "", right_title: str = "") -> HTML:
    """Show the source of two functions (or strings, or tuples of them shown one after another) in two columns."""
    # No wrapping: a wrapped line would split identifiers; a column scrolls sideways instead.
    formatter = HtmlFormatter(noclasses=True, style="friendly",
                              prestyles="white-space:pre;word-break:normal;overflow-wrap:normal;overflow-x:auto")

    def text(obj) -> str:
        return obj if isinstance(obj, str) else inspect.getsource(getattr(obj, "fn", obj))  # .fn: a Triton kernel

    def column(objs, title: str) -> str:
        source = "\n\n".join(text(obj) for obj in (objs if isinstance(objs, tuple) else (objs,)))
        return (f"<div style='flex:1 1 40em;min-width:0;overflow-x:auto'><b>{title}</b>"
                f"{highlight(source, PythonLexer(), formatter)}</div>")

    return HTML(f"<div style='display:flex;flex-wrap:wrap;gap:1em;font-size:85%'>{column(left, left_title)}"
                f"{column(right, right_title)}</div>")
