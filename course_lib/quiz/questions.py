"""The five kinds of question. Each parses its own fields and judges an answer.

single:        options (text, correct, why), exactly one correct; answer = option index
multi:         options, one or more correct; answer = set of option indices
numeric:       answer, unit, tolerance (absolute or percent), wrong values; answer = a number
matching:      pairs (left, right); answer = {left: right}
spot_the_bug:  code, bug_line (1-based), line_hints; answer = a line number

Answers are always in the bank's terms (indices into the bank's options, right-hand texts), never
in the shuffled order a learner is shown (``option_order``, ``choice_order``; see order.py).

Feedback never gives the right answer away on a wrong try (``Question.check``): it speaks only of
what the learner gave (the picked option's ``why``; which multi-select picks are wrong and that
some right ones are missing; how many pairs match; for a number, the ``why`` of the classic wrong
value it is near, the unit it looks like it was given in, or else too high or too low; why a
clicked line is fine). The right answer, its reasons and the explanation come with a right
answer, or when the caller asks to ``reveal`` them (the scorecard does after a few wrong tries).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from course_lib.perf.units import format_number
from course_lib.quiz.fields import Fields
from course_lib.quiz.order import display_order
from course_lib.quiz.tolerance import Tolerance, how_to_write, parse_tolerance
from course_lib.quiz.unit_slips import unit_slip


@dataclass(frozen=True)
class Feedback:
    """The verdict on one answer, with the explanation to show the learner."""

    correct: bool
    message: str


def _bare(text: str) -> str:
    """An option's text without its closing full stop, to quote it inside a sentence."""
    return text.rstrip(".")


@dataclass(frozen=True)
class Option:
    text: str
    correct: bool
    why: str


def _options(fields: Fields) -> tuple[Option, ...]:
    raw = fields.get("options", list)
    if len(raw) < 2:
        raise fields.fail("needs at least two options.")
    options = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise fields.fail(f"option {i + 1} must be a mapping with text, correct and why.")
        option_fields = Fields(item, f"{fields.where}, option {i + 1}")
        options.append(
            Option(
                option_fields.get("text", str),
                option_fields.get("correct", bool, False),
                option_fields.get("why", str),
            )
        )
    return tuple(options)


@dataclass(frozen=True)
class Question:
    """Fields every kind has: ``id``, ``prompt`` and an optional ``explanation``."""

    id: str
    prompt: str
    explanation: str
    kind: ClassVar[str]

    def check(self, answer: Any, reveal: bool = False) -> Feedback:
        """Judge ``answer`` (in the bank's terms; a malformed one raises ValueError). A right
        answer gets its reasons and the explanation; a wrong one only feedback on what was given,
        unless ``reveal``, which adds the right answer, its reasons and the explanation."""
        correct, said = self._judge(answer)
        parts = ["Correct." if correct else "Not quite.", said]
        if reveal and not correct:
            solution = self.solution_text()
            parts += [f"The right answer: {solution}" + ("" if solution.endswith((".", "?", "!")) else "."),
                      self._reasons()]
        if correct or reveal:
            parts.append(self.explanation)
        return Feedback(correct, " ".join(part for part in parts if part))

    def solution_text(self) -> str:
        """The correct answer in words."""
        raise NotImplementedError

    def _judge(self, answer: Any) -> tuple[bool, str]:
        """Whether ``answer`` is right, and what to say about the answer given and nothing else
        (for a right answer that is its reasons)."""
        raise NotImplementedError

    def _reasons(self) -> str:
        """Why the right answer is right, shown when a wrong try reveals it."""
        return ""


@dataclass(frozen=True)
class _ChoiceQuestion(Question):
    """Shared by the kinds that list ``options`` (each with ``text``, ``correct`` and ``why``)."""

    options: tuple[Option, ...]

    @classmethod
    def parse(cls, fields: Fields, **common: str) -> "_ChoiceQuestion":
        options = _options(fields)
        problem = cls._problem_with(sum(o.correct for o in options))
        if problem:
            raise fields.fail(problem)
        return cls(options=options, **common)

    @staticmethod
    def _problem_with(num_correct: int) -> str | None:
        raise NotImplementedError

    def option_order(self, learner: str | None) -> list[int]:
        """Bank indices of the options in the order ``learner`` sees them (bank order for None)."""
        if learner is None:
            return list(range(len(self.options)))
        return display_order([o.text for o in self.options], self.id, learner)


@dataclass(frozen=True)
class SingleChoice(_ChoiceQuestion):
    """Exactly one option has ``correct: true``. Answer: the chosen option's index."""

    kind: ClassVar[str] = "single"

    @staticmethod
    def _problem_with(num_correct: int) -> str | None:
        return None if num_correct == 1 else "a single-choice question needs exactly one option with 'correct: true'."

    def _judge(self, answer: int) -> tuple[bool, str]:
        if not isinstance(answer, int) or not 0 <= answer < len(self.options):
            raise ValueError(f"Choose one option by index 0..{len(self.options) - 1}, got {answer!r}.")
        option = self.options[answer]
        return option.correct, option.why

    def _reasons(self) -> str:
        return next(o.why for o in self.options if o.correct)

    def solution_text(self) -> str:
        return next(o.text for o in self.options if o.correct)


@dataclass(frozen=True)
class MultiSelect(_ChoiceQuestion):
    """One or more options are correct. Answer: the set of chosen indices."""

    kind: ClassVar[str] = "multi"

    @staticmethod
    def _problem_with(num_correct: int) -> str | None:
        return None if num_correct else "a multiple-select question needs at least one option with 'correct: true'."

    def _judge(self, answer: set[int]) -> tuple[bool, str]:
        """A wrong answer hears which of its picks are wrong and why, and whether right options
        are missing, never which ones."""
        chosen = set(answer)
        if not chosen <= set(range(len(self.options))):
            raise ValueError(f"Choose options by index 0..{len(self.options) - 1}, got {sorted(chosen)}.")
        right = {i for i, o in enumerate(self.options) if o.correct}
        if chosen == right:
            return True, self._reasons()
        notes = [f"Wrong pick, “{_bare(o.text)}”: {o.why}" for i, o in enumerate(self.options) if i in chosen - right]
        if right - chosen:
            notes.append("Some right options are missing." if notes else
                         "Every option you picked is right, but some right options are missing.")
        return False, " ".join(notes)

    def _reasons(self) -> str:
        return " ".join(o.why for o in self.options if o.correct)

    def solution_text(self) -> str:
        return "; ".join(_bare(o.text) for o in self.options if o.correct)


@dataclass(frozen=True)
class WrongValue:
    """A classic wrong answer to a numeric question, and what to tell a learner who gives it."""

    value: float
    why: str


@dataclass(frozen=True)
class Numeric(Question):
    """``answer`` (a number), ``unit``, ``tolerance`` (``{absolute: X}`` in the unit, or
    ``{percent: X}`` of the answer; see tolerance.py) and ``wrong``, the classic wrong values
    (each ``{value, why}``). Invariant: no wrong value is accepted as the answer. A value given
    near a wrong one (within the same tolerance) hears its ``why``; one off by a unit factor
    hears so (unit_slips.py); any other, whether it is too high or too low."""

    answer: float
    tolerance: Tolerance
    unit: str
    wrong: tuple[WrongValue, ...]
    kind: ClassVar[str] = "numeric"

    @classmethod
    def parse(cls, fields: Fields, **common: str) -> "Numeric":
        answer = float(fields.get("answer", (int, float)))
        unit = fields.get("unit", str)
        if "tolerance" not in fields.data:
            raise fields.fail(f"missing field 'tolerance'; {how_to_write(unit)}.")
        tolerance = parse_tolerance(fields.data["tolerance"], answer, unit)
        if isinstance(tolerance, str):
            raise fields.fail(tolerance)
        wrong = []
        for i, item in enumerate(fields.get("wrong", list, [])):
            entry = Fields(item if isinstance(item, dict) else {}, f"{fields.where}, wrong value {i + 1}")
            value = float(entry.get("value", (int, float)))
            if tolerance.accepts(value, answer):
                raise entry.fail(f"{value:g} {unit} is accepted as the answer {answer:g} {unit} "
                                 f"({tolerance.describe(unit)}): narrow the tolerance or drop this value.")
            wrong.append(WrongValue(value, entry.get("why", str)))
        return cls(answer=answer, tolerance=tolerance, unit=unit, wrong=tuple(wrong), **common)

    def _judge(self, answer: float) -> tuple[bool, str]:
        value = float(answer)
        given = f"You gave {format_number(value, 6)} {self.unit}"
        if self.tolerance.accepts(value, self.answer):
            return True, f"{given}; the answer is {self.solution_text()}."
        near = [w for w in self.wrong if self.tolerance.accepts(value, w.value)]
        if near:
            return False, f"{given}. {min(near, key=lambda w: abs(value - w.value)).why}"
        slip = unit_slip(value, self.answer, self.unit, self.tolerance.accepts)
        if slip:
            return False, f"{given}, {slip}"
        return False, f"{given}, which is too {'high' if value > self.answer else 'low'}."

    def solution_text(self) -> str:
        return f"{format_number(self.answer, 6)} {self.unit}"


@dataclass(frozen=True)
class Matching(Question):
    """``pairs``: a list of ``{left, right}``; each left item has one right item.
    Answer: a dict from every left item to the chosen right item."""

    pairs: tuple[tuple[str, str], ...]
    kind: ClassVar[str] = "matching"

    @classmethod
    def parse(cls, fields: Fields, **common: str) -> "Matching":
        pairs = []
        for i, item in enumerate(fields.get("pairs", list)):
            pair = Fields(item if isinstance(item, dict) else {}, f"{fields.where}, pair {i + 1}")
            pairs.append((pair.get("left", str), pair.get("right", str)))
            stray = sorted(set(pair.data) - {"left", "right"}, key=str)
            if stray:  # in {left: a, right: b, c} the text after a comma becomes a key of its own
                raise pair.fail(f"unexpected field {stray[0]!r}; a pair has only 'left' and 'right' "
                                "(quote a text that holds a comma).")
        if len(pairs) < 2:
            raise fields.fail("a matching question needs at least two pairs.")
        if len({left for left, _ in pairs}) != len(pairs):
            raise fields.fail("each left item of a matching question must be different.")
        return cls(pairs=tuple(pairs), **common)

    @property
    def choices(self) -> list[str]:
        """The right-hand items, sorted, so their order does not give the pairing away."""
        return sorted({right for _, right in self.pairs})

    def choice_order(self, learner: str | None) -> list[str]:
        """The right-hand items in the order ``learner`` sees them (sorted for None)."""
        choices = self.choices
        return choices if learner is None else [choices[i] for i in display_order(choices, self.id, learner)]

    def _judge(self, answer: dict[str, str]) -> tuple[bool, str]:
        """A wrong answer hears how many pairs match, not which."""
        expected = dict(self.pairs)
        if set(answer) != set(expected):
            raise ValueError(f"Match every item: {sorted(expected)}.")
        matched = sum(answer[left] == right for left, right in expected.items())
        if matched == len(expected):
            return True, f"All {matched} pairs match."
        return False, f"Pairs right: {matched} of {len(expected)}."

    def solution_text(self) -> str:
        return "; ".join(f"{left} -> {right}" for left, right in self.pairs)


@dataclass(frozen=True)
class SpotTheBug(Question):
    """``code`` (a snippet), ``bug_line`` (1-based line of the fault) and optional
    ``line_hints`` (line number -> why that line is fine). Answer: the clicked line number."""

    code: str
    bug_line: int
    line_hints: dict[int, str]
    kind: ClassVar[str] = "spot_the_bug"

    @classmethod
    def parse(cls, fields: Fields, **common: str) -> "SpotTheBug":
        code = fields.get("code", str).rstrip("\n")
        bug_line = fields.get("bug_line", int)
        num_lines = len(code.splitlines())
        if not 1 <= bug_line <= num_lines:
            raise fields.fail(f"bug_line must be between 1 and {num_lines} (the snippet's lines), got {bug_line}.")
        hints = fields.get("line_hints", dict, {})
        if not all(isinstance(k, int) and isinstance(v, str) for k, v in hints.items()):
            raise fields.fail("line_hints must map line numbers to text.")
        return cls(code=code, bug_line=bug_line, line_hints=hints, **common)

    @property
    def lines(self) -> list[str]:
        return self.code.splitlines()

    def _judge(self, answer: int) -> tuple[bool, str]:
        if not isinstance(answer, int) or not 1 <= answer <= len(self.lines):
            raise ValueError(f"Pick a line between 1 and {len(self.lines)}, got {answer!r}.")
        if answer == self.bug_line:
            return True, f"Line {answer} is the fault."
        return False, f"Line {answer}: {self.line_hints.get(answer, 'That line is fine.')}"

    def solution_text(self) -> str:
        return f"line {self.bug_line}: {self.lines[self.bug_line - 1].strip()}"


QUESTION_KINDS: dict[str, type[Question]] = {
    k.kind: k for k in (SingleChoice, MultiSelect, Numeric, Matching, SpotTheBug)
}
