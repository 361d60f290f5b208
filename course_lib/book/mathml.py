"""A Sphinx math renderer that writes MathML at build time, so the website's formulas need no
script from a CDN (Sphinx's default, MathJax, loads one; the site must work offline).

Browsers draw MathML themselves (Chromium since version 109, Firefox and Safari for longer).
``latex2mathml`` turns each formula's TeX into MathML; a formula it cannot read is shown as its
TeX source in a code span, never dropped. Enable it with ``extensions = [..., "course_lib.book.mathml"]``.
"""

from __future__ import annotations

import html

from docutils import nodes
from latex2mathml.converter import convert


def _mathml(tex: str, display: str) -> str:
    try:
        return convert(tex, display=display)
    except Exception:  # latex2mathml raises its own errors and plain ones on TeX it cannot parse
        return f"<code class='course-tex'>{html.escape(tex)}</code>"


def visit_inline(translator, node) -> None:
    translator.body.append(_mathml(node.astext(), "inline"))
    raise nodes.SkipNode


def visit_block(translator, node) -> None:
    translator.body.append(f"<div class='math-block'>{_mathml(node.astext(), 'block')}</div>")
    raise nodes.SkipNode


def setup(app) -> dict:
    app.add_html_math_renderer("mathml", (visit_inline, None), (visit_block, None))
    return {"parallel_read_safe": True, "parallel_write_safe": True}
