"""The scorecard: every answer a learner gives, kept in the kernel and exportable for grading."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from course_lib.quiz.bank import QuizBank
from course_lib.quiz.questions import Feedback


@dataclass
class AnswerRecord:
    """The latest answer to one question. Invariant: ``attempts >= 1``."""

    question_id: str
    answer: Any
    correct: bool
    attempts: int


class Scorecard:
    """Checks answers against a bank and records the latest one per question.

    Answers are in the bank's terms (option indices into the bank's list, matching choices by
    text), whatever order the learner was shown; ``learner`` names whose order that was."""

    def __init__(self, bank: QuizBank, learner: str | None = None) -> None:
        self.bank, self.learner = bank, learner
        self.records: dict[str, AnswerRecord] = {}

    def answer(self, question_id: str, answer: Any) -> Feedback:
        """Check ``answer`` (in the bank's terms), record it (counting attempts) and return the feedback."""
        feedback = self.bank.question(question_id).check(answer)
        previous = self.records.get(question_id)
        stored = sorted(answer) if isinstance(answer, (set, frozenset)) else answer
        self.records[question_id] = AnswerRecord(
            question_id, stored, feedback.correct, (previous.attempts if previous else 0) + 1
        )
        return feedback

    @property
    def score(self) -> int:
        """Questions whose latest answer is correct."""
        return sum(r.correct for r in self.records.values())

    @property
    def total(self) -> int:
        return len(self.bank.questions)

    def summary(self) -> str:
        unanswered = self.total - len(self.records)
        return f"{self.bank.title}: {self.score}/{self.total} correct, {unanswered} unanswered."

    def to_dict(self) -> dict[str, Any]:
        return {
            "quiz": self.bank.source,
            "title": self.bank.title,
            "learner": self.learner,
            "score": self.score,
            "total": self.total,
            "answers": [asdict(r) for r in self.records.values()],
        }

    def export(self, path: str | Path) -> Path:
        """Write the scorecard as JSON (what an instructor collects) and return the path."""
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=2), encoding="utf-8")
        return path
