"""Plain-text rendering of a bank, for terminals, printouts and non-interactive runs, and the one
piece of markup a bank's text may hold: `code` spans (INLINE_CODE), shown as code by the quiz widget
and the website alike."""

from __future__ import annotations

import re

from course_lib.quiz.bank import QuizBank
from course_lib.quiz.questions import (
    Matching,
    MultiSelect,
    Numeric,
    SingleChoice,
    SpotTheBug,
)

# A `code` span in a bank's text: one backtick on each side, on one line; any other backtick is text.
INLINE_CODE = re.compile(r"`([^`\n]+)`")


def render_text(bank: QuizBank, show_answers: bool = False, learner: str | None = None) -> str:
    """The bank as numbered plain text; with ``show_answers`` each question ends with its answer.
    Options and matching choices come in the order ``learner`` sees them, or the bank's for None."""
    out = [bank.title, "=" * len(bank.title)]
    for n, q in enumerate(bank.questions, start=1):
        out.append(f"\n{n}. [{q.kind}] {q.prompt}")
        if isinstance(q, (SingleChoice, MultiSelect)):
            out += [f"   {chr(ord('a') + k)}) {q.options[i].text}" for k, i in enumerate(q.option_order(learner))]
        elif isinstance(q, Numeric):
            out.append(f"   Answer in {q.unit}.")
        elif isinstance(q, Matching):
            out += [f"   - {left}" for left, _ in q.pairs]
            out.append(f"   Match each with one of: {' | '.join(q.choice_order(learner))}")
        elif isinstance(q, SpotTheBug):
            out += [f"   {i:>2} | {line}" for i, line in enumerate(q.lines, start=1)]
        if show_answers:
            out.append(f"   Answer: {q.solution_text()}")
    return "\n".join(out)
