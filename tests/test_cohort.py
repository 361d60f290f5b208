"""Cohort grading: locked cells restored, every kind of broken submission gets a status, and
the gradebook is the same on a rerun."""

import copy
import json

import nbformat
import pytest

from course_lib.grading.cohort import check_cells, grade_cohort, grade_submission
from course_lib.grading.gradebook import collect_quizzes, write_gradebook
from course_lib.grading.restore import restore_locked_cells
from course_lib.paths import REPO_ROOT

EXERCISE = REPO_ROOT / "exercises" / "03_scheduler.ipynb"
SOLUTION = REPO_ROOT / "solutions" / "03_scheduler.ipynb"


def student_cells(book):
    return [cell for cell in book.cells if "student" in cell.metadata.get("tags", [])]


def solved():
    book = nbformat.read(EXERCISE, as_version=4)
    for mine, answer in zip(student_cells(book), student_cells(nbformat.read(SOLUTION, as_version=4))):
        mine.source = answer.source
    return book


def test_restore_keeps_student_work_and_helpers_but_never_an_edited_check():
    pristine = nbformat.read(EXERCISE, as_version=4)
    submission = solved()
    for cell in submission.cells:
        if "check" in cell.metadata.get("tags", []):
            cell.source = "print('all good')"
    helper = nbformat.v4.new_code_cell("HELPER = 1")
    submission.cells.insert(submission.cells.index(student_cells(submission)[0]) + 1, helper)
    for cell in student_cells(submission):
        cell["id"] = "renamed-" + cell["id"]  # ids lost: fall back to order
    graded = restore_locked_cells(submission, pristine)
    checks = [c.source for c in graded.cells if "check" in c.metadata.get("tags", [])]
    assert checks == [c.source for c in pristine.cells if "check" in c.metadata.get("tags", [])]
    assert [c.source for c in student_cells(graded)] == [c.source for c in student_cells(solved())]
    helper_copy = graded.cells[graded.cells.index(student_cells(graded)[0]) + 1]
    assert helper_copy.source == "HELPER = 1" and "nbval-ignore-output" in helper_copy.metadata["tags"]
    assert [name for _, name in check_cells(pristine)] == [
        "Task 1 · The hash chain", "Task 2 · The longest cached prefix", "Task 3 · One step under a token budget"]


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    root = tmp_path_factory.mktemp("submissions")
    learners = {"alice": solved(), "bob": nbformat.read(EXERCISE, as_version=4)}
    tampered = copy.deepcopy(learners["bob"])
    for cell in tampered.cells:
        if "check" in cell.metadata.get("tags", []):
            cell.source = 'print("Task passed")'
    learners["carol"] = tampered
    for name, book in learners.items():
        (root / name).mkdir()
        nbformat.write(book, root / name / EXERCISE.name)
    (root / "frank").mkdir()
    (root / "frank" / EXERCISE.name).write_text("not a notebook")
    (root / "gina").mkdir()  # handed nothing in
    right, wrong = {"answer": 1, "correct": True}, {"answer": 0, "correct": False}
    card = {"quiz": "quizzes/03_scheduler.yaml", "answers": [  # alice solves preemption-default on a retry
        {"question_id": "v1-step", "first_correct": True, "tries": [right]},
        {"question_id": "preemption-default", "first_correct": False, "tries": [wrong, right]}]}
    (root / "alice" / "quiz_03.json").write_text(json.dumps(card))
    old_style = {"question_id": "v1-step", "correct": True, "attempts": 1}  # a scorecard from before first tries
    (root / "bob" / "quiz_03.json").write_text(json.dumps({**card, "answers": [old_style]}))
    (root / "bob" / "notes.json").write_text("[1, 2]")  # not a scorecard: skipped
    progress = []
    grades = grade_cohort(root, [EXERCISE], lambda done, total, grade: progress.append((done, total)),
                          cell_timeout_s=60, time_limit_s=300)
    return root, grades, progress


def test_cohort_statuses_and_scores(cohort):
    _, grades, progress = cohort
    by_learner = {g.learner: g for g in grades}
    assert progress == [(i, 5) for i in range(1, 6)]
    assert (by_learner["alice"].status, by_learner["alice"].score) == ("graded", 3)
    assert (by_learner["bob"].status, by_learner["bob"].score) == ("graded", 0)
    assert "NotImplementedError" in by_learner["bob"].checks[0].message
    assert (by_learner["carol"].status, by_learner["carol"].score) == ("graded", 0)  # the edited checks were restored
    assert by_learner["frank"].status == "malformed" and by_learner["gina"].status == "missing"


def test_gradebook_files_are_complete_and_reproducible(cohort, tmp_path):
    root, grades, _ = cohort
    quizzes = collect_quizzes(root)
    first = {p.name: p.read_bytes() for p in write_gradebook(grades, quizzes, tmp_path / "one")}
    second = {p.name: p.read_bytes() for p in write_gradebook(grades, quizzes, tmp_path / "two")}
    assert first == second and not list((tmp_path / "one").rglob("*.partial"))
    rows = first["grades.csv"].decode().splitlines()
    assert rows[0] == "learner,exercise,status,check,passed,message" and len(rows) == 1 + 5 * 3
    assert "gina,03_scheduler,missing,Task 1 · The hash chain,0,not handed in" in rows
    assert "- **Task 2 · The longest cached prefix** failed" in first["bob.md"].decode()
    misses = {q.question_id: (q.missed, q.handed_in) for q in quizzes}
    assert misses["v1-step"] == (0, 2) and misses["preemption-default"] == (2, 2)  # a retry never undoes a miss
    assert "preemption-default" in first["summary.html"].decode() and "first try" in first["summary.html"].decode()


def test_an_infinite_loop_hits_the_time_limit(tmp_path):
    book = solved()
    student_cells(book)[0].source = "while True:\n    pass"
    nbformat.write(book, tmp_path / EXERCISE.name)
    grade = grade_submission("dave", tmp_path / EXERCISE.name, EXERCISE, time_limit_s=12, cell_timeout_s=120)
    assert grade.status == "timeout" and grade.score == 0 and "12 s limit" in grade.checks[0].message


def test_a_crashing_kernel_is_reported_and_earlier_checks_still_count(tmp_path):
    book = solved()
    student_cells(book)[2].source = "import os\nos._exit(1)"
    nbformat.write(book, tmp_path / EXERCISE.name)
    grade = grade_submission("erin", tmp_path / EXERCISE.name, EXERCISE, cell_timeout_s=5)
    assert grade.status == "kernel crashed"
    assert [c.passed for c in grade.checks] == [True, True, False]


def test_a_deleted_student_cell_is_graded_as_the_starter():
    pristine = nbformat.read(EXERCISE, as_version=4)
    submission = solved()
    submission.cells.remove(student_cells(submission)[0])
    graded = student_cells(restore_locked_cells(submission, pristine))
    assert graded[0].source == student_cells(pristine)[0].source  # the starter, not task 2's code
    assert [c.source for c in graded[1:]] == [c.source for c in student_cells(solved())[1:]]


def test_helper_cells_do_not_shift_which_cell_is_read_as_a_check(tmp_path):
    book = solved()
    first = student_cells(book)[0]
    book.cells.insert(book.cells.index(first) + 1, nbformat.v4.new_code_cell("print('my helper')"))
    student_cells(book)[2].source = "def plan_step(*args, **kwargs):\n    return {}"  # task 3 wrong
    nbformat.write(book, tmp_path / EXERCISE.name)
    grade = grade_submission("hana", tmp_path / EXERCISE.name, EXERCISE, cell_timeout_s=60)
    assert [c.passed for c in grade.checks] == [True, True, False] and grade.status == "graded"
