"""The scorecard: every try at every question, kept in the kernel and exportable for grading.

Scoring is on the first try. A learner may answer a question again as often as they like, and
every try is kept, but the score, the exported ``score`` and the gradebook count a question as
right only when its first answer was right; otherwise instant feedback would let anyone reach
100% by retrying.

Feedback on a wrong try speaks only of what was given (see questions.py). The full answer comes
with a right answer, or after ``REVEAL_AFTER`` wrong tries, so a learner who is stuck is not
left without one; neither changes the score, which the first try has already fixed.

A scorecard given a ``path`` starts from the tries saved there and saves after every answer, so
running the quiz cell again, or coming back another day, continues the same record instead of
offering a fresh first try. Saved tries are judged again by the bank on loading, so a question
fixed since (a tolerance that accepted a wrong value) scores as the gradebook scores it.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from course_lib.quiz.bank import QuizBank
from course_lib.quiz.questions import Feedback, Question

REVEAL_AFTER = 3  # wrong tries after which feedback shows the full answer


@dataclass(frozen=True)
class Try:
    answer: Any  # in the bank's terms; a multi-select answer as a sorted list
    correct: bool


@dataclass
class AnswerRecord:
    """Every try at one question, oldest first. Invariant: ``tries`` is never empty and only
    grows, so ``first_correct`` (what is scored) never changes once the first answer is in."""

    question_id: str
    tries: list[Try]

    @property
    def first_correct(self) -> bool:
        return self.tries[0].correct

    @property
    def answer(self) -> Any:
        """The latest answer."""
        return self.tries[-1].answer

    @property
    def correct(self) -> bool:
        """Whether the latest answer is right."""
        return self.tries[-1].correct

    @property
    def attempts(self) -> int:
        return len(self.tries)

    @property
    def wrong(self) -> int:
        return sum(not t.correct for t in self.tries)

    @property
    def solved(self) -> bool:
        """Right on some try (not necessarily the first)."""
        return any(t.correct for t in self.tries)

    def to_dict(self) -> dict[str, Any]:
        return {"question_id": self.question_id, "first_correct": self.first_correct,
                "attempts": self.attempts, "solved": self.solved, "tries": [asdict(t) for t in self.tries]}


def first_try_correct(entry: dict[str, Any]) -> bool:
    """Whether an exported answer (one item of a scorecard's ``answers``) was right on its first
    try. Scorecards from before first-try scoring hold only the latest answer's ``correct`` and
    the number of ``attempts``; such an answer counts only when it was the one and only try."""
    if "first_correct" in entry:
        return bool(entry["first_correct"])
    return bool(entry["correct"]) and entry.get("attempts", 1) == 1


def _judged_again(question: Question, answer: Any) -> bool:
    """Whether a saved ``answer`` (as JSON holds it: a multi-select one as a list) is right by
    ``question`` now; one it cannot judge (the bank changed its options) counts as wrong."""
    try:
        return question.check(answer).correct
    except (ValueError, TypeError, KeyError):
        return False


class Scorecard:
    """Checks answers against a bank and records every try per question.

    Answers are in the bank's terms (option indices into the bank's list, matching choices by
    text), whatever order the learner was shown; ``learner`` names whose order that was. With a
    ``path``, tries saved there for this quiz and learner are loaded, and every answer is saved."""

    def __init__(self, bank: QuizBank, learner: str | None = None, path: str | Path | None = None) -> None:
        self.bank, self.learner = bank, learner
        self.path = None if path is None else Path(path)
        self.records: dict[str, AnswerRecord] = {}
        if self.path is not None and self.path.exists():
            self._load()

    def answer(self, question_id: str, answer: Any) -> Feedback:
        """Check ``answer`` (in the bank's terms), record the try and return the feedback: the
        full answer once the question was solved or after REVEAL_AFTER wrong tries."""
        question = self.bank.question(question_id)
        record = self.records.get(question_id)
        reveal = (record is not None and record.solved) or (record.wrong if record else 0) + 1 >= REVEAL_AFTER
        feedback = question.check(answer, reveal)
        attempt = Try(sorted(answer) if isinstance(answer, (set, frozenset)) else answer, feedback.correct)
        if record is None:
            self.records[question_id] = AnswerRecord(question_id, [attempt])
        else:
            record.tries.append(attempt)
        if self.path is not None:
            self._save()
        return feedback

    @property
    def score(self) -> int:
        """Questions whose first answer was right: the first-try score."""
        return sum(r.first_correct for r in self.records.values())

    @property
    def solved(self) -> int:
        """Questions answered right on some try."""
        return sum(r.solved for r in self.records.values())

    @property
    def total(self) -> int:
        return len(self.bank.questions)

    @property
    def answered(self) -> int:
        """Questions with at least one try, right or wrong."""
        return len(self.records)

    def progress(self) -> str:
        """How far through the quiz the learner is, e.g. '2 / 6 answered'."""
        return f"{self.answered} / {self.total} answered"

    def summary(self) -> str:
        unanswered = self.total - self.answered
        return (f"{self.bank.title}: first-try score {self.score}/{self.total} (only each question's first "
                f"answer counts); {self.solved}/{self.total} solved counting retries, {unanswered} unanswered.")

    def to_dict(self) -> dict[str, Any]:
        return {
            "quiz": self.bank.source,
            "title": self.bank.title,
            "learner": self.learner,
            "scoring": "first try",
            "score": self.score,
            "solved": self.solved,
            "total": self.total,
            "answers": [r.to_dict() for r in self.records.values()],
        }

    def export(self, path: str | Path) -> Path:
        """Write the scorecard as JSON (what an instructor collects) and return the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        partial.write_text(json.dumps(self.to_dict(), indent=2), encoding="utf-8")
        os.replace(partial, path)
        return path

    def _save(self) -> None:
        try:
            self.export(self.path)
        except OSError as error:
            warnings.warn(f"Could not save quiz answers to {self.path} ({error}); they are kept in this "
                          "kernel only, so export them before it stops.", stacklevel=3)
            self.path = None

    def _load(self) -> None:
        """Read the saved tries, each judged again by the bank as it is now (a saved verdict is
        ignored, as the gradebook ignores it), so a fixed question scores the same in both."""
        known = {q.id for q in self.bank.questions}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if (data["quiz"], data["learner"]) != (self.bank.source, self.learner):
                raise ValueError(f"it holds {data['quiz']} for {data['learner']!r}")
            for entry in data["answers"]:
                question_id = entry["question_id"]
                if question_id in known and entry["tries"]:
                    question = self.bank.question(question_id)
                    tries = [Try(t["answer"], _judged_again(question, t["answer"])) for t in entry["tries"]]
                    self.records[question_id] = AnswerRecord(question_id, tries)
        except (OSError, ValueError, KeyError, TypeError) as error:
            warnings.warn(f"Could not read saved quiz answers from {self.path} ({error}); starting afresh, "
                          "and the file will be replaced at your next answer.", stacklevel=3)
            self.records = {}
