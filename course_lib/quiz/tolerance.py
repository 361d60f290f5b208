"""How close to a numeric question's answer a learner's value must be to count as right.

A bank states the kind of every tolerance, so no one has to guess what a bare number means
(``tolerance: 0.5`` once meant ±50 %, and accepted the classic wrong answer)::

    tolerance: {absolute: 0.5}   # within 0.5 of the answer, in the question's unit
    tolerance: {percent: 1}      # within 1 % of the answer

Invariant: ``Tolerance.accepts(value, target)`` is symmetric around ``target`` and its width
never depends on the value given, only on the target (for ``percent``, a share of the target).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KINDS = ("absolute", "percent")
_SLACK = 1e-9  # relative slack, so that a value exactly on the edge (175.5 against 175 ± 0.5) counts


@dataclass(frozen=True)
class Tolerance:
    """``amount`` in the answer's unit (``absolute``) or in percent of the answer (``percent``)."""

    kind: str
    amount: float

    def width(self, target: float) -> float:
        """How far from ``target`` a value may lie, in the answer's unit."""
        return self.amount if self.kind == "absolute" else self.amount / 100 * abs(target)

    def accepts(self, value: float, target: float) -> bool:
        width = self.width(target)
        return abs(value - target) <= width + _SLACK * max(abs(target), width)

    def describe(self, unit: str) -> str:
        """The tolerance in words, e.g. 'within 0.5 GB/s' or 'within 1 % of the answer'."""
        if self.kind == "absolute":
            return "exactly" if self.amount == 0 else f"within {self.amount:g} {unit}"
        return f"within {self.amount:g} % of the answer"


def how_to_write(unit: str) -> str:
    """The two ways to write a tolerance, for error messages."""
    return (f"write `tolerance: {{absolute: X}}` (within X {unit}, the answer's unit; 0 for an exact count) "
            f"or `tolerance: {{percent: X}}` (within X % of the answer)")


def parse_tolerance(raw: Any, answer: float, unit: str) -> Tolerance | str:
    """The Tolerance that ``raw`` (a question's ``tolerance`` field) states, or a sentence saying
    what is wrong with it and what to write instead."""
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return (f"`tolerance: {raw:g}` does not say whether it is absolute or relative (read as a fraction, "
                f"it meant ±{raw * 100:g} % = ±{raw * abs(answer):g} {unit}); {how_to_write(unit)}.")
    if not isinstance(raw, dict) or len(raw) != 1 or next(iter(raw)) not in KINDS:
        return f"tolerance must be a mapping with one key, 'absolute' or 'percent', got {raw!r}; {how_to_write(unit)}."
    kind, amount = next(iter(raw.items()))
    if isinstance(amount, bool) or not isinstance(amount, (int, float)) or amount < 0:
        return f"tolerance {kind} must be a number of at least 0, got {amount!r}; {how_to_write(unit)}."
    if kind == "percent" and amount >= 100:
        return f"tolerance percent must be below 100, got {amount:g}; {how_to_write(unit)}."
    return Tolerance(kind, float(amount))
