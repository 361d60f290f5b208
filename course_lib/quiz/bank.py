"""Question banks: YAML files of questions (kinds in questions.py), validated on load.

A bank file looks like::

    title: PagedAttention and the KV cache
    questions:
      - id: paged-win          # unique within the file
        kind: single           # single | multi | numeric | matching | spot_the_bug
        prompt: What does PagedAttention improve?
        options:
          - {text: ..., correct: true, why: ...}
      - id: busbw
        kind: numeric
        prompt: ...
        answer: 175
        unit: GB/s
        tolerance: {percent: 1}      # or {absolute: 0.5}, in the unit; a bare number is refused
        wrong:                       # classic wrong values, each with what to tell the learner
          - {value: 100, why: That is the algbw ...}

Each kind's fields are listed on its class in questions.py. Any mistake raises QuizFileError naming
the file and the question. ``tests/test_quiz_bank_lint.py`` checks what loading cannot: no cue in
the options' lengths or places, and every numeric question probed with its classic wrong values.

Scorecards store answers as option indices in the bank's order. So once a bank is in learners'
hands, an option keeps its place and its meaning (rewording it is fine); reordering a question's
options, or changing which are right, makes it a new question with a new id.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from course_lib.paths import QUIZ_DIR
from course_lib.quiz.fields import Fields, QuizFileError
from course_lib.quiz.questions import QUESTION_KINDS, Question


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
    top = Fields(data, source)
    title = top.get("title", str)
    raw_questions = top.get("questions", list)
    if not raw_questions:
        raise QuizFileError(f"{source}: 'questions' is empty.")
    questions: list[Question] = []
    for n, raw in enumerate(raw_questions, start=1):
        label = raw.get("id", f"#{n}") if isinstance(raw, dict) else f"#{n}"
        fields = Fields(raw if isinstance(raw, dict) else {}, f"{source}, question {label!r}")
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
