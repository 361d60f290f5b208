"""The gradebook a cohort run leaves behind, written so a rerun gives the same bytes and an
interrupted run never leaves a half-written file (each file is written aside, then renamed).

  grades.csv             learner, exercise, status, check, passed, message (one row per check)
  summary.html           learners x exercises with scores; quiz questions by how many missed them
                         on the first try (retries are for learning and never count)
  feedback/<learner>.md  each failed check with its reason, for the learner
"""

from __future__ import annotations

import csv
import html
import io
import json
import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from course_lib.quiz.bank import load_bank
from course_lib.quiz.scorecard import first_try_correct

if TYPE_CHECKING:  # cohort.py imports this module to write its results
    from course_lib.grading.cohort import ExerciseGrade


@dataclass(frozen=True)
class QuestionMisses:
    quiz: str
    question_id: str
    prompt: str
    missed: int  # learners who handed in this quiz and did not answer this question right on the first try
    handed_in: int


def collect_quizzes(submissions: Path) -> list[QuestionMisses]:
    """Per quiz question, how many learners missed it on the first try (unanswered counts as
    missed), from the scorecards (``*.json``) in each learner folder. A later right answer does not
    undo a first miss. Files that are not scorecards are skipped."""
    answers: dict[str, dict[str, dict[str, bool]]] = defaultdict(dict)  # quiz -> learner -> question -> first try right
    for learner in sorted(p for p in submissions.iterdir() if p.is_dir()):
        for path in sorted(learner.glob("*.json")):
            try:
                card = json.loads(path.read_text(encoding="utf-8"))
                quiz = Path(card["quiz"]).stem
                answers[quiz][learner.name] = {a["question_id"]: first_try_correct(a) for a in card["answers"]}
            except (ValueError, KeyError, TypeError):
                continue
    rows = []
    for quiz in sorted(answers):
        try:
            bank = load_bank(quiz)
        except (FileNotFoundError, ValueError):
            continue
        cards = answers[quiz]
        for question in bank.questions:
            missed = sum(not card.get(question.id, False) for card in cards.values())
            rows.append(QuestionMisses(quiz, question.id, question.prompt, missed, len(cards)))
    return rows


def _write_atomically(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)
    return path


def grades_csv(grades: list[ExerciseGrade]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["learner", "exercise", "status", "check", "passed", "message"])
    for grade in grades:
        for check in grade.checks:
            writer.writerow([grade.learner, grade.exercise, grade.status, check.name, int(check.passed), check.message])
    return out.getvalue()


def summary_html(grades: list[ExerciseGrade], quizzes: list[QuestionMisses]) -> str:
    learners = sorted({g.learner for g in grades})
    exercises = sorted({g.exercise for g in grades})
    cell = {(g.learner, g.exercise): g for g in grades}
    head = "".join(f"<th>{html.escape(e)}</th>" for e in exercises)
    rows = []
    for learner in learners:
        cells = []
        for exercise in exercises:
            grade = cell[(learner, exercise)]
            full = grade.status == "graded" and grade.score == len(grade.checks)
            colour = "#dafbe1" if full else "#fff8c5" if grade.score else "#ffebe9"
            note = "" if grade.status == "graded" else f"<br><small>{html.escape(grade.status)}</small>"
            cells.append(f"<td style='background:{colour}'>{grade.score}/{len(grade.checks)}{note}</td>")
        rows.append(f"<tr><th>{html.escape(learner)}</th>{''.join(cells)}</tr>")
    quiz_rows = "".join(
        f"<tr><td>{html.escape(q.quiz)}</td><td>{html.escape(q.question_id)}</td><td>{html.escape(q.prompt)}</td>"
        f"<td>{q.missed} of {q.handed_in}</td></tr>"
        for q in sorted(quizzes, key=lambda q: (-q.missed / max(1, q.handed_in), q.quiz, q.question_id)))
    quiz_table = (f"<h2>Quiz questions, most missed first</h2><p>Missed: not right on the first try, or not "
                  f"answered. Retries are for learning and never count.</p><table border=1 cellpadding=4><tr>"
                  f"<th>quiz</th><th>question</th><th>prompt</th><th>missed</th></tr>{quiz_rows}</table>"
                  if quizzes else "")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>Gradebook</title></head>"
            f"<body style='font-family:sans-serif'><h1>Gradebook</h1><p>Checks passed per exercise "
            f"(green: all, yellow: some, red: none).</p><table border=1 cellpadding=4><tr><th>learner</th>{head}</tr>"
            f"{''.join(rows)}</table>{quiz_table}</body></html>\n")


def feedback_markdown(learner: str, grades: list[ExerciseGrade]) -> str:
    lines = [f"# Feedback for {learner}", ""]
    for grade in grades:
        lines.append(f"## {grade.exercise}: {grade.score}/{len(grade.checks)} checks ({grade.status})")
        failed = [check for check in grade.checks if not check.passed]
        lines += [f"- **{check.name}** failed: {check.message}" for check in failed] or ["- every check passed"]
        lines.append("")
    return "\n".join(lines)


def write_gradebook(grades: list[ExerciseGrade], quizzes: list[QuestionMisses], out: Path) -> list[Path]:
    """Write grades.csv, summary.html and feedback/<learner>.md under ``out``; return the paths."""
    by_learner: dict[str, list[ExerciseGrade]] = defaultdict(list)
    for grade in grades:
        by_learner[grade.learner].append(grade)
    written = [_write_atomically(out / "grades.csv", grades_csv(grades)),
               _write_atomically(out / "summary.html", summary_html(grades, quizzes))]
    for learner, own in sorted(by_learner.items()):
        written.append(_write_atomically(out / "feedback" / f"{learner}.md", feedback_markdown(learner, own)))
    return written
