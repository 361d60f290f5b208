"""Question banks: the five kinds of question, loaded from YAML and validated on load.

A bank file looks like::

    title: PagedAttention and the KV cache
    questions:
      - id: paged-win          # unique within the file
        kind: single           # single | multi | numeric | matching | spot_the_bug
        prompt: What does PagedAttention improve?
        options:
          - {text: ..., correct: true, why: ...}

Each kind's fields are listed on its class. Any mistake raises QuizFileError naming
the file and the question.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import yaml

from course_lib.paths import QUIZ_DIR


class QuizFileError(ValueError):
    """A quiz file is malformed; the message names the file, the question and the fix."""


@dataclass(frozen=True)
class Feedback:
    """The verdict on one answer, with the explanation to show the learner."""

    correct: bool
    message: str


class _Fields:
    """Reads one question's fields, raising QuizFileError that names where the problem is."""

    def __init__(self, data: dict[str, Any], where: str) -> None:
        self.data, self.where = data, where

    def fail(self, problem: str) -> QuizFileError:
        return QuizFileError(f"{self.where}: {problem}")

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        if key not in self.data:
            if default is ...:
                raise self.fail(f"missing field '{key}'.")
            return default
        value = self.data[key]
        numeric = kind in (int, (int, float))
        if not isinstance(value, kind) or (numeric and isinstance(value, bool)):
            raise self.fail(f"field '{key}' must be {_TYPE_WORDS[kind]}, got {value!r}.")
        return value


_TYPE_WORDS = {str: "text", bool: "true or false", int: "a whole number", (int, float): "a number",
               list: "a list", dict: "a mapping"}


@dataclass(frozen=True)
class Option:
    text: str
    correct: bool
    why: str


def _options(fields: _Fields) -> tuple[Option, ...]:
    raw = fields.get("options", list)
    if len(raw) < 2:
        raise fields.fail("needs at least two options.")
    options = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise fields.fail(f"option {i + 1} must be a mapping with text, correct and why.")
        option_fields = _Fields(item, f"{fields.where}, option {i + 1}")
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

    def check(self, answer: Any) -> Feedback:
        raise NotImplementedError

    def solution_text(self) -> str:
        """The correct answer in words."""
        raise NotImplementedError

    def _verdict(self, correct: bool, detail: str) -> Feedback:
        message = ("Correct. " if correct else "Not quite. ") + detail
        if self.explanation:
            message += " " + self.explanation
        return Feedback(correct, message.strip())


@dataclass(frozen=True)
class _ChoiceQuestion(Question):
    """Shared by the kinds that list ``options`` (each with ``text``, ``correct`` and ``why``)."""

    options: tuple[Option, ...]

    @classmethod
    def parse(cls, fields: _Fields, **common: str) -> "_ChoiceQuestion":
        options = _options(fields)
        problem = cls._problem_with(sum(o.correct for o in options))
        if problem:
            raise fields.fail(problem)
        return cls(options=options, **common)

    @staticmethod
    def _problem_with(num_correct: int) -> str | None:
        raise NotImplementedError


@dataclass(frozen=True)
class SingleChoice(_ChoiceQuestion):
    """Exactly one option has ``correct: true``. Answer: the chosen option's index."""

    kind: ClassVar[str] = "single"

    @staticmethod
    def _problem_with(num_correct: int) -> str | None:
        return None if num_correct == 1 else "a single-choice question needs exactly one option with 'correct: true'."

    def check(self, answer: int) -> Feedback:
        if not isinstance(answer, int) or not 0 <= answer < len(self.options):
            raise ValueError(f"Choose one option by index 0..{len(self.options) - 1}, got {answer!r}.")
        option = self.options[answer]
        return self._verdict(option.correct, option.why)

    def solution_text(self) -> str:
        return next(o.text for o in self.options if o.correct)


@dataclass(frozen=True)
class MultiSelect(_ChoiceQuestion):
    """One or more options are correct. Answer: the set of chosen indices."""

    kind: ClassVar[str] = "multi"

    @staticmethod
    def _problem_with(num_correct: int) -> str | None:
        return None if num_correct else "a multiple-select question needs at least one option with 'correct: true'."

    def check(self, answer: set[int]) -> Feedback:
        chosen = set(answer)
        if not chosen <= set(range(len(self.options))):
            raise ValueError(f"Choose options by index 0..{len(self.options) - 1}, got {sorted(chosen)}.")
        correct = chosen == {i for i, o in enumerate(self.options) if o.correct}
        notes = [
            f"[{'picked' if i in chosen else 'not picked'}, {'right' if o.correct else 'wrong'}] {o.why}"
            for i, o in enumerate(self.options)
            if i in chosen or o.correct
        ]
        return self._verdict(correct, " ".join(notes))

    def solution_text(self) -> str:
        return "; ".join(o.text for o in self.options if o.correct)


@dataclass(frozen=True)
class Numeric(Question):
    """``answer`` (a number), ``tolerance`` (relative, default 0.01) and ``unit``."""

    answer: float
    tolerance: float
    unit: str
    kind: ClassVar[str] = "numeric"

    @classmethod
    def parse(cls, fields: _Fields, **common: str) -> "Numeric":
        tolerance = float(fields.get("tolerance", (int, float), 0.01))
        if not 0 <= tolerance < 1:
            raise fields.fail(f"tolerance is relative and must be in [0, 1), got {tolerance}.")
        return cls(
            answer=float(fields.get("answer", (int, float))),
            tolerance=tolerance,
            unit=fields.get("unit", str),
            **common,
        )

    def check(self, answer: float) -> Feedback:
        value = float(answer)
        correct = abs(value - self.answer) <= self.tolerance * abs(self.answer)
        return self._verdict(correct, f"You gave {value:g} {self.unit}; the answer is {self.solution_text()}.")

    def solution_text(self) -> str:
        return f"{self.answer:g} {self.unit}"


@dataclass(frozen=True)
class Matching(Question):
    """``pairs``: a list of ``{left, right}``; each left item has one right item.
    Answer: a dict from every left item to the chosen right item."""

    pairs: tuple[tuple[str, str], ...]
    kind: ClassVar[str] = "matching"

    @classmethod
    def parse(cls, fields: _Fields, **common: str) -> "Matching":
        pairs = []
        for i, item in enumerate(fields.get("pairs", list)):
            pair = _Fields(item if isinstance(item, dict) else {}, f"{fields.where}, pair {i + 1}")
            pairs.append((pair.get("left", str), pair.get("right", str)))
        if len(pairs) < 2:
            raise fields.fail("a matching question needs at least two pairs.")
        if len({left for left, _ in pairs}) != len(pairs):
            raise fields.fail("each left item of a matching question must be different.")
        return cls(pairs=tuple(pairs), **common)

    @property
    def choices(self) -> list[str]:
        """The right-hand items, in a stable order that does not give the pairing away."""
        return sorted({right for _, right in self.pairs})

    def check(self, answer: dict[str, str]) -> Feedback:
        expected = dict(self.pairs)
        if set(answer) != set(expected):
            raise ValueError(f"Match every item: {sorted(expected)}.")
        wrong = [left for left in expected if answer[left] != expected[left]]
        detail = "All pairs match." if not wrong else f"Check: {', '.join(wrong)}."
        return self._verdict(not wrong, detail)

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
    def parse(cls, fields: _Fields, **common: str) -> "SpotTheBug":
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

    def check(self, answer: int) -> Feedback:
        if not isinstance(answer, int) or not 1 <= answer <= len(self.lines):
            raise ValueError(f"Pick a line between 1 and {len(self.lines)}, got {answer!r}.")
        if answer == self.bug_line:
            return self._verdict(True, f"Line {answer} is the fault.")
        hint = self.line_hints.get(answer, "That line is fine.")
        return Feedback(False, f"Not quite. Line {answer}: {hint} Look again.")

    def solution_text(self) -> str:
        return f"line {self.bug_line}: {self.lines[self.bug_line - 1].strip()}"


QUESTION_KINDS: dict[str, type[Question]] = {
    k.kind: k for k in (SingleChoice, MultiSelect, Numeric, Matching, SpotTheBug)
}


@dataclass(frozen=True)
class QuizBank:
    """A validated question bank. Invariant: question ids are unique."""

    title: str
    questions: tuple[Question, ...]
    source: str

    def question(self, question_id: str) -> Question:
        for q in self.questions:
            if q.id == question_id:
                return q
        raise KeyError(f"No question {question_id!r} in {self.source}; ids: {[q.id for q in self.questions]}.")


def parse_bank(data: Any, source: str) -> QuizBank:
    """Validate parsed YAML ``data``; ``source`` names it in errors."""
    if not isinstance(data, dict):
        raise QuizFileError(f"{source}: the file must be a mapping with 'title' and 'questions'.")
    top = _Fields(data, source)
    title = top.get("title", str)
    raw_questions = top.get("questions", list)
    if not raw_questions:
        raise QuizFileError(f"{source}: 'questions' is empty.")
    questions: list[Question] = []
    for n, raw in enumerate(raw_questions, start=1):
        label = raw.get("id", f"#{n}") if isinstance(raw, dict) else f"#{n}"
        fields = _Fields(raw if isinstance(raw, dict) else {}, f"{source}, question {label!r}")
        if not isinstance(raw, dict):
            raise fields.fail("each question must be a mapping of fields.")
        kind = fields.get("kind", str)
        if kind not in QUESTION_KINDS:
            raise fields.fail(f"unknown kind {kind!r}; use one of {sorted(QUESTION_KINDS)}.")
        common = dict(id=fields.get("id", str), prompt=fields.get("prompt", str), explanation=fields.get("explanation", str, ""))
        if any(q.id == common["id"] for q in questions):
            raise fields.fail("this id is used twice in the file; ids must be unique.")
        questions.append(QUESTION_KINDS[kind].parse(fields, **common))
    return QuizBank(title, tuple(questions), source)


def load_bank(name_or_path: str | Path) -> QuizBank:
    """Load ``quizzes/NAME.yaml`` (given NAME) or a path to a YAML file."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = QUIZ_DIR / f"{name_or_path}.yaml"
    if not path.exists():
        raise FileNotFoundError(f"No quiz file at {path}; the banks are in {QUIZ_DIR}.")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise QuizFileError(f"{path.name}: not valid YAML: {error}") from error
    return parse_bank(data, path.name)
