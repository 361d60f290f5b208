"""A generated text with speculative decoding's accepted drafts highlighted, token by token.

The engine stamps every token a step emits with that step's time, so tokens sharing a time
came from one target step: in a verification step of m tokens, the first m - 1 are accepted
drafts and the last is the target's own (its correction, or the bonus when every draft passed).
A request's first token comes from its prefill.
"""

from __future__ import annotations

import html
import itertools

from course_lib.engine.outputs import RequestOutput

ACCEPTED_STYLE = "background:#b7e4c7"
TARGET_STYLE = "border-bottom:2px solid #7f7f7f"


def steps_of(output: RequestOutput) -> list[list[int]]:
    """The request's output tokens grouped by the target step that emitted them."""
    tokens = output.outputs[0].token_ids
    times = output.metrics[0].token_times
    groups, start = [], 0
    for _, same in itertools.groupby(times):
        size = len(list(same))
        groups.append(tokens[start:start + size])
        start += size
    return groups


def highlight_drafts(output: RequestOutput, decode) -> str:
    """HTML of the output: accepted drafts on green, each step's own target token underlined.
    ``decode`` turns a list of token ids into text (the engine's tokenizer's ``decode``)."""
    spans = []
    for group in steps_of(output):
        *drafts, own = group
        spans += [f'<span style="{ACCEPTED_STYLE}">{_visible(decode([t]))}</span>' for t in drafts]
        spans.append(f'<span style="{TARGET_STYLE}">{_visible(decode([own]))}</span>')
    return f'<div style="font-family:monospace;line-height:1.9;white-space:pre-wrap">{"".join(spans)}</div>'


def _visible(text: str) -> str:
    """Escaped for HTML, with a newline shown as a return arrow so every token has a width."""
    return html.escape(text).replace("\n", "\u21b5\n")
