"""A bank's text as MyST Markdown that shows exactly that text on the website.

A bank's prompts and options are plain text whose only markup is `code` spans (``INLINE_CODE``,
the quiz widget's rule too). MyST would read much more into them: emphasis, links, raw HTML and
entities, ``$math$``, ``{role}`...```, ``{{substitutions}}``, and at the start of a block a heading,
quote, list, target ``(label)=``, ``%`` comment or ``:::`` fence. So ``myst_inline`` keeps each code
span as it is and backslash-escapes every other character that could begin markup (CommonMark
lets any ASCII punctuation be escaped, and MyST's extensions honour the escapes). Line breaks in
the text become spaces, as they do in the widget's HTML. ``myst_fence`` shows code verbatim.

Invariant: the result is one line, safe anywhere in a paragraph or a list item, first place too.
"""

from __future__ import annotations

import re
import string

from course_lib.quiz.text import INLINE_CODE

# Markup wherever it stands: escapes, code, emphasis, links and images, HTML, entities, math, roles,
# substitutions, strikethrough, table cells and a heading's closing hashes.
_MARKUP_ANYWHERE = re.compile(r"([\\`*_\[\]<>&${}~|#])")
# A number then "." or ")" opens an ordered list at a block's start.
_LIST_NUMBER = re.compile(r"^(\d+)([.)])")


def _escape_text(text: str) -> str:
    """Plain text (no code span) with its markup characters escaped and its lines joined."""
    return _MARKUP_ANYWHERE.sub(r"\\\1", re.sub(r"\s*\n\s*", " ", text))


def myst_inline(text: str) -> str:
    """``text`` as MyST that renders as the same text, its `code` spans as code."""
    pieces, end = [], 0
    for span in INLINE_CODE.finditer(text):
        pieces += [_escape_text(text[end:span.start()]), span.group(0)]
        end = span.end()
    pieces.append(_escape_text(text[end:]))
    myst = "".join(pieces).strip()
    if myst and myst[0] in string.punctuation and myst[0] not in "\\`":
        return "\\" + myst  # whatever a block may start with: #, >, -, +, =, %, :, (, ...
    return _LIST_NUMBER.sub(r"\1\\\2", myst)


def myst_fence(code: str) -> str:
    """``code`` in a fenced block of plain text, the fence longer than any run of backticks in it."""
    longest = max((len(run) for run in re.findall(r"`+", code)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{code}\n{fence}"
