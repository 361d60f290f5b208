"""The gradebook a cohort run leaves behind, written so a rerun gives the same bytes and an
interrupted run never leaves a half-written file (each file is written aside, then renamed).

  grades.csv             learner, exercise, status, check, passed, message (one row per check)
  summary.html           learners x exercises with scores; quiz questions by how many missed them
                         on the first try (retries are for learning and never count)
  feedback/<learner>.md  each failed task with its failing cases (call, expected, got, hint), and
                         any quiz file of theirs that could not be read
  similarity.csv         pairs of answers to one task that look alike (learner, other learner or the
                         course solution, score, share contained, fingerprints shared, flagged); see
                         similarity.py
  similarity.html        the flagged pairs with both answers side by side, the pairs listed for
                         context, and per task how many answers were long enough to compare
"""

from __future__ import annotations

import csv
import html
import io
import os
from collections import defaultdict
from pathlib import Path

from course_lib.grading.grade import ExerciseGrade
from course_lib.grading.quizzes import QuizCollection


def _write_atomically(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)
    return path


def _cell(text: str) -> str:
    """A CSV field a spreadsheet shows as text: a leading = + - @ (a formula) is quoted away."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def grades_csv(grades: list[ExerciseGrade]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["learner", "exercise", "status", "check", "passed", "message"])
    for grade in grades:
        for check in grade.checks:
            writer.writerow([_cell(grade.learner), grade.exercise, grade.status, check.name, int(check.passed),
                             _cell(check.message)])
    return out.getvalue()


def summary_html(grades: list[ExerciseGrade], quizzes: QuizCollection, warning: str = "") -> str:
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
        for q in sorted(quizzes.misses, key=lambda q: (-q.missed / max(1, q.handed_in), q.quiz, q.question_id)))
    quiz_table = (f"<h2>Quiz questions, most missed first</h2><p>Missed: not right on the first try, or not "
                  f"answered. Retries are for learning and never count.</p><table border=1 cellpadding=4><tr>"
                  f"<th>quiz</th><th>question</th><th>prompt</th><th>missed</th></tr>{quiz_rows}</table>"
                  if quizzes.misses else "")
    problems = "".join(f"<li>{html.escape(learner)}: {html.escape(line)}</li>"
                       for learner, lines in sorted(quizzes.problems.items()) for line in lines)
    if problems:
        quiz_table += f"<h2>Quiz files that could not be used</h2><ul>{problems}</ul>"
    banner = f"<p style='background:#ffebe9;padding:8px'><b>{html.escape(warning)}</b></p>" if warning else ""
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>Gradebook</title></head>"
            f"<body style='font-family:sans-serif'><h1>Gradebook</h1>{banner}<p>Tasks passed per exercise "
            f"(green: all, yellow: some, red: none).</p><table border=1 cellpadding=4><tr><th>learner</th>{head}</tr>"
            f"{''.join(rows)}</table>{quiz_table}</body></html>\n")


def feedback_markdown(learner: str, grades: list[ExerciseGrade], quiz_problems: list[str] = ()) -> str:
    lines = [f"# Feedback for {learner}", ""]
    for grade in grades:
        lines.append(f"## {grade.exercise}: {grade.score}/{len(grade.checks)} tasks ({grade.status})")
        failed = [check for check in grade.checks if not check.passed]
        for check in failed:
            lines.append(f"- **{check.name}** failed: {check.message}")
            if len(check.details) > 1:  # the first line repeats the verdict
                lines += ["", "  ```text", *(f"  {line}" for line in check.details[1:]), "  ```"]
        lines += [] if failed else ["- every task passed"]
        lines += [f"- note: {note}" for note in grade.notes]
        lines.append("")
    if quiz_problems:
        lines += ["## Quiz files", *(f"- {line}" for line in quiz_problems), ""]
    return "\n".join(lines)


def write_gradebook(grades: list[ExerciseGrade], quizzes: QuizCollection, out: Path, warning: str = "",
                   similarity=None) -> list[Path]:
    """Write grades.csv, summary.html and feedback/<learner>.md under ``out``; return the paths.
    ``warning`` (grading without a sandbox) heads the summary; ``similarity`` (``similarity.py``'s
    report), when given, adds similarity.csv and similarity.html."""
    by_learner: dict[str, list[ExerciseGrade]] = defaultdict(list)
    for grade in grades:
        by_learner[grade.learner].append(grade)
    written = [_write_atomically(out / "grades.csv", grades_csv(grades)),
               _write_atomically(out / "summary.html", summary_html(grades, quizzes, warning))]
    for learner, own in sorted(by_learner.items()):
        written.append(_write_atomically(out / "feedback" / f"{learner}.md",
                                         feedback_markdown(learner, own, quizzes.problems.get(learner, []))))
    if similarity is not None:
        from course_lib.grading.similarity import write_similarity  # it imports this module's writers
        written += write_similarity(similarity, out)
    return written
