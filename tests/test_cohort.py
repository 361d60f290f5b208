"""Cohort grading (course_lib/grading/cohort.py, grade.py, gradebook.py): the submission is
rebuilt around the pristine exercise, every kind of broken submission gets its status, the
gradebook is complete and the same on a rerun, and ``./course grade`` gives the verdicts the
cohort grader gives.

The tests that grade run in bubblewrap's sandbox where it works. On a learner's machine without
it they run with ``isolate=False`` (the same verdicts, weaker isolation); under CI
(``CI=true``) a machine without a working sandbox fails them: CI must grade as the course does.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import nbformat
import pytest

from course_lib.exercise_files import course_exercise, old_exercise_file, solution_file
from course_lib.grading.__main__ import grade_file
from course_lib.grading.__main__ import main as grade_main
from course_lib.grading import cohort as cohort_command
from course_lib.grading.cohort import grade_cohort, grade_submission
from course_lib.grading.grade import prepare_exercise, program_cells
from course_lib.grading.gradebook import feedback_markdown, write_gradebook
from course_lib.grading.quizzes import collect_quizzes, load_banks
from course_lib.grading.restore import restore_locked_cells
from course_lib.grading.sandbox import Limits, sandbox_problem
from course_lib.paths import REPO_ROOT
from course_lib.quiz.bank import load_bank

EXERCISE = course_exercise("03_scheduler")
SOLUTION = REPO_ROOT / "solutions" / solution_file("03_scheduler")
PAGING = course_exercise("01_paging")
PAGING_SOLUTION = REPO_ROOT / "solutions" / solution_file("01_paging")
TASKS = ["Task 1 · The hash chain", "Task 2 · The longest cached prefix", "Task 3 · One step under a token budget"]

IN_CI = os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}
ISOLATE = sandbox_problem() is None


@pytest.fixture(scope="module")
def sandbox_in_ci():
    """Under CI the grading tests need the real sandbox; elsewhere they fall back to isolate=False."""
    problem = sandbox_problem()
    if problem and IN_CI:
        pytest.fail(f"CI=true but the cohort grader cannot sandbox submissions here: {problem}", pytrace=False)


grading = pytest.mark.usefixtures("sandbox_in_ci")


def is_tagged(cell, tag: str) -> bool:
    return tag in cell.metadata.get("tags", [])


def student_cells(book):
    return [cell for cell in book.cells if is_tagged(cell, "student")]


def solved(exercise: Path = EXERCISE, solution: Path = SOLUTION):
    """The exercise with each student cell's source replaced by the solution's."""
    book = nbformat.read(exercise, as_version=4)
    for mine, answer in zip(student_cells(book), student_cells(nbformat.read(solution, as_version=4))):
        mine.source = answer.source
    return book


def untouched(exercise: Path = EXERCISE):
    return nbformat.read(exercise, as_version=4)


def hand_in(root: Path, learner: str, book, name: str = EXERCISE.name) -> Path:
    (root / learner).mkdir(parents=True, exist_ok=True)
    nbformat.write(book, root / learner / name)
    return root / learner


def verdicts(grade) -> list[bool]:
    return [check.passed for check in grade.checks]


@pytest.fixture(scope="module")
def scheduler():
    return prepare_exercise(EXERCISE)


# --- restoring the submission around the pristine exercise ---------------------------------------

def test_restore_keeps_student_work_and_helpers_but_never_an_edited_check(scheduler):
    pristine = untouched()
    submission = solved()
    for cell in submission.cells:
        if is_tagged(cell, "check"):
            cell.source = "print('all good')"
    helper = nbformat.v4.new_code_cell("HELPER = 1")
    submission.cells.insert(submission.cells.index(student_cells(submission)[0]) + 1, helper)
    for cell in student_cells(submission):
        cell["id"] = "renamed-" + cell["id"]  # ids lost: fall back to order
    graded = restore_locked_cells(submission, pristine)
    checks = [c.source for c in graded.cells if is_tagged(c, "check")]
    assert checks == [c.source for c in pristine.cells if is_tagged(c, "check")]
    assert [c.source for c in student_cells(graded)] == [c.source for c in student_cells(solved())]
    helper_copy = graded.cells[graded.cells.index(student_cells(graded)[0]) + 1]
    assert helper_copy.source == "HELPER = 1" and helper_copy.outputs == []
    # what runs: set-up, student and helper cells, and no check cell at all, edited or not
    run = [cell["source"] for cell in program_cells(submission, pristine)]
    pristine_checks = {c.source for c in pristine.cells if is_tagged(c, "check")}
    assert "HELPER = 1" in run and not any("all good" in source or source in pristine_checks for source in run)
    assert [cell["label"] for cell in program_cells(submission, pristine)] == [
        "the set-up cell", "your code for Task 1", "a cell you added after your code for Task 1",
        "your code for Task 2", "your code for Task 3"]
    assert [task.heading for task in scheduler.tasks] == TASKS


def test_a_deleted_student_cell_is_restored_as_the_starter_unless_the_learner_defines_it():
    pristine = untouched()
    submission = solved()
    submission.cells.remove(student_cells(submission)[0])
    graded = student_cells(restore_locked_cells(submission, pristine))
    assert graded[0].source == student_cells(pristine)[0].source  # the starter, not task 2's code
    assert [c.source for c in graded[1:]] == [c.source for c in student_cells(solved())[1:]]
    # the learner's code moved into a cell of their own, anywhere: no starter replaces it (tests/grading/test_restore.py)
    moved = solved()
    task1 = student_cells(moved)[0]
    moved.cells.remove(task1)
    moved.cells.append(nbformat.v4.new_code_cell(task1.source))
    program = [cell["source"] for cell in program_cells(moved, pristine)]
    assert task1.source in program and student_cells(pristine)[0].source not in program


def test_cells_added_anywhere_run_where_the_learner_put_them():
    pristine = untouched()
    submission = solved()
    first_markdown = next(c for c in submission.cells if c.cell_type == "markdown")
    submission.cells.insert(submission.cells.index(first_markdown) + 1, nbformat.v4.new_code_cell("import numpy as np"))
    task2 = student_cells(submission)[1]
    copy_of_task2 = nbformat.v4.new_code_cell(task2.source + "\n# my final version", metadata={"tags": ["student"]})
    submission.cells.insert(submission.cells.index(task2) + 1, copy_of_task2)
    program = program_cells(submission, pristine)
    labels = [cell["label"] for cell in program]
    assert labels[:2] == ["a cell you added before Task 1", "the set-up cell"]  # under the title, as it was
    assert program[0]["source"] == "import numpy as np"
    assert labels.index("a cell you added after your code for Task 2") == labels.index("your code for Task 2") + 1
    assert program[labels.index("your code for Task 2") + 1]["source"].endswith("# my final version")


# --- one cohort, every status ------------------------------------------------------------------

def _first_try(question_id: str, right: bool):
    """An answer index the bank itself says is right (or wrong) for a single-choice question."""
    question = load_bank("03_scheduler").question(question_id)
    return next(i for i, option in enumerate(question.options) if option.correct is right)


def _check_cell_that_would_pass() -> str:
    """A check cell's source that, if it were run, would define every solved function (and print a PASS)."""
    return "\n\n".join(cell.source for cell in student_cells(solved())) + "\nprint('Task passed')"


@pytest.fixture(scope="module")
def cohort(tmp_path_factory, scheduler, sandbox_in_ci):
    root = tmp_path_factory.mktemp("submissions")
    hand_in(root, "alice", solved())
    hand_in(root, "bob", untouched())
    tampered = untouched()  # the starter, with every check cell rewritten to solve the tasks itself
    for cell in tampered.cells:
        if is_tagged(cell, "check"):
            cell.source = _check_cell_that_would_pass()
    hand_in(root, "carol", tampered)
    (root / "frank").mkdir()
    (root / "frank" / EXERCISE.name).write_text("not a notebook")
    (root / "gina").mkdir()  # handed nothing in
    deleted = solved()
    deleted.cells.remove(student_cells(deleted)[0])  # task 1's cell deleted: graded as the starter
    hand_in(root, "hana", deleted)
    helped = solved()
    first, second = student_cells(helped)[:2]
    # a helper cell after task 1's cell, used by task 2's code; task 3 left wrong
    helped.cells.insert(helped.cells.index(first) + 1, nbformat.v4.new_code_cell(
        "def leading_blocks(num_prompt_tokens, block_size):\n    return (num_prompt_tokens - 1) // block_size\n"
        "print('my helper')"))
    second.source = second.source.replace("(num_prompt_tokens - 1) // block_size",
                                          "leading_blocks(num_prompt_tokens, block_size)")
    assert "leading_blocks(" in second.source
    student_cells(helped)[2].source = "def plan_step(*args, **kwargs):\n    return {}"
    hand_in(root, "ivan", helped)

    v1_right, pre_wrong, pre_right = _first_try("v1-step", True), _first_try("preemption-default", False), \
        _first_try("preemption-default", True)
    card = {"quiz": "quizzes/03_scheduler.yaml", "answers": [  # alice solves preemption-default on a retry
        {"question_id": "v1-step", "first_correct": True, "tries": [{"answer": v1_right, "correct": True}]},
        {"question_id": "preemption-default", "first_correct": False,
         "tries": [{"answer": pre_wrong, "correct": False}, {"answer": pre_right, "correct": True}]}]}
    (root / "alice" / "quiz_03.json").write_text(json.dumps(card))
    old_style = {"question_id": "v1-step", "answer": v1_right, "correct": True, "attempts": 1}  # before first tries
    (root / "bob" / "quiz_03.json").write_text(json.dumps({**card, "answers": [old_style]}))
    (root / "bob" / "notes.json").write_text("[1, 2]")  # not a scorecard: one problem line, nothing counted
    progress = []
    grades = grade_cohort(root, [scheduler], lambda done, total, grade: progress.append((done, total)),
                          jobs=2, limits=Limits(time_s=120), isolate=ISOLATE, cell_timeout_s=60)
    return root, grades, progress


@grading
def test_cohort_statuses_and_scores(cohort):
    _, grades, progress = cohort
    by_learner = {g.learner: g for g in grades}
    assert [g.learner for g in grades] == sorted(by_learner)
    assert progress == [(i, 7) for i in range(1, 8)]
    assert (by_learner["alice"].status, verdicts(by_learner["alice"])) == ("graded", [True, True, True])
    assert (by_learner["bob"].status, by_learner["bob"].score) == ("graded", 0)
    assert all("not done yet" in check.message for check in by_learner["bob"].checks)
    # the check cells that would have solved every task were never run
    assert (by_learner["carol"].status, by_learner["carol"].score) == ("graded", 0)
    assert by_learner["frank"].status == "malformed" and by_learner["frank"].score == 0
    assert by_learner["gina"].status == "missing" and by_learner["gina"].checks[0].message == "not handed in"
    assert verdicts(by_learner["hana"]) == [False, True, True]
    assert "not done yet" in by_learner["hana"].checks[0].message
    assert (by_learner["ivan"].status, verdicts(by_learner["ivan"])) == ("graded", [True, True, False])


@grading
def test_gradebook_files_are_complete_and_reproducible(cohort, tmp_path):
    root, grades, _ = cohort
    quizzes = collect_quizzes(root, load_banks())
    written = write_gradebook(grades, quizzes, tmp_path / "one")
    first = {p.relative_to(tmp_path / "one").as_posix(): p.read_bytes() for p in written}
    second = {p.relative_to(tmp_path / "two").as_posix(): p.read_bytes()
              for p in write_gradebook(grades, collect_quizzes(root, load_banks()), tmp_path / "two")}
    again = {p.relative_to(tmp_path / "one").as_posix(): p.read_bytes()
             for p in write_gradebook(grades, quizzes, tmp_path / "one")}  # a rerun over the old gradebook
    assert first == second == again
    assert sorted(first) == ["feedback/alice.md", "feedback/bob.md", "feedback/carol.md", "feedback/frank.md",
                             "feedback/gina.md", "feedback/hana.md", "feedback/ivan.md", "grades.csv", "summary.html"]
    assert sorted(p.relative_to(tmp_path / "one").as_posix() for p in (tmp_path / "one").rglob("*")
                  if p.is_file()) == sorted(first)  # nothing else left behind (no .partial files)
    rows = first["grades.csv"].decode().splitlines()
    assert rows[0] == "learner,exercise,status,check,passed,message" and len(rows) == 1 + 7 * 3
    assert f"gina,03_scheduler,missing,{TASKS[0]},0,not handed in" in rows
    assert f"alice,03_scheduler,graded,{TASKS[2]},1," in rows
    assert f"- **{TASKS[1]}** failed" in first["feedback/bob.md"].decode()
    assert "every task passed" in first["feedback/alice.md"].decode()
    assert "notes.json" in first["feedback/bob.md"].decode()  # the file that is not a scorecard is named
    misses = {q.question_id: (q.missed, q.handed_in) for q in quizzes.misses if q.quiz == "03_scheduler"}
    assert misses["v1-step"] == (0, 2) and misses["preemption-default"] == (2, 2)  # a retry never undoes a miss
    summary = first["summary.html"].decode()
    assert "preemption-default" in summary and "first try" in summary
    assert all(f"<th>{name}</th>" in summary for name in ("alice", "bob", "carol", "frank", "gina", "hana", "ivan"))


def test_an_empty_submissions_folder_is_refused(tmp_path, scheduler):
    with pytest.raises(FileNotFoundError, match="no learner folders"):
        grade_cohort(tmp_path, [scheduler], lambda *args: None, isolate=ISOLATE)


# --- hand-ins under the exercise's old name (04_roofline.ipynb, before exercises had their own) ----

@grading
def test_an_old_name_hand_in_is_graded_as_its_module_when_the_new_name_is_missing(tmp_path, scheduler):
    old = hand_in(tmp_path, "olga", solved(), old_exercise_file("03_scheduler"))
    grade = grade_submission(old, scheduler, limits=Limits(time_s=120), isolate=ISOLATE, hide=[tmp_path],
                             cell_timeout_s=60)
    assert (grade.exercise, grade.status, verdicts(grade)) == ("03_scheduler", "graded", [True, True, True])
    assert grade.notes[0] == "03_scheduler.ipynb, the exercise's old name, was graded (the exercise is now " \
                             "03_scheduler_exercise.ipynb)"


@grading
def test_with_both_names_handed_in_the_new_one_is_graded_and_the_feedback_says_so(tmp_path, scheduler):
    both = hand_in(tmp_path, "pavel", untouched())  # the new name, never worked on
    hand_in(tmp_path, "pavel", solved(), old_exercise_file("03_scheduler"))
    grade = grade_submission(both, scheduler, limits=Limits(time_s=120), isolate=ISOLATE, hide=[tmp_path],
                             cell_timeout_s=60)
    assert (grade.exercise, grade.status, grade.score) == ("03_scheduler", "graded", 0)
    feedback = feedback_markdown("pavel", [grade])
    assert "- note: 03_scheduler_exercise.ipynb was graded; 03_scheduler.ipynb, the exercise's old name, was " \
           "handed in too and not graded" in feedback
    assert feedback.startswith("# Feedback for pavel\n\n## 03_scheduler: 0/3 tasks (graded)")  # the module id


def test_an_old_name_link_is_refused_not_followed(tmp_path, scheduler):
    (tmp_path / "quinn").mkdir()
    os.symlink(SOLUTION, tmp_path / "quinn" / old_exercise_file("03_scheduler"))
    grade = grade_submission(tmp_path / "quinn", scheduler, limits=Limits(time_s=60), isolate=ISOLATE,
                             hide=[tmp_path], cell_timeout_s=30)
    assert grade.status == "refused" and grade.score == 0


def test_grade_cohort_exercise_option_takes_the_module_id(tmp_path, monkeypatch, capsys):
    prepared = []
    monkeypatch.setattr(cohort_command, "grade_cohort",
                        lambda root, exercises, *args, **kwargs: prepared.extend(exercises) or [])
    (tmp_path / "submissions" / "alice").mkdir(parents=True)
    assert cohort_command.main([str(tmp_path / "submissions"), "--out", str(tmp_path / "gradebook"), "--no-sandbox",
                                "--exercise", "03_scheduler"]) == 0
    assert [exercise.name for exercise in prepared] == ["03_scheduler"]
    assert prepared[0].pristine == nbformat.read(EXERCISE, as_version=4)
    with pytest.raises(SystemExit):
        cohort_command.main([str(tmp_path / "submissions"), "--no-sandbox", "--exercise", "03_scheduler_exercise"])
    assert "--exercise 03_scheduler_exercise: no such module; the modules are 01_paging, 02_batching" in \
        capsys.readouterr().err


# --- notebooks that never finish, or stop the process -------------------------------------------

@grading
def test_an_infinite_loop_hits_the_time_limit_and_says_where(tmp_path, scheduler):
    book = solved()
    student_cells(book)[0].source = "while True:\n    pass"
    # the limit must outlast the set-up cell (torch and course_lib imports): 3 s did not, twice, on a slow
    # 2-core CI machine with the suite's other worker busy, and the loop was never reached
    grade = grade_submission(hand_in(tmp_path, "dave", book), scheduler, limits=Limits(time_s=12), isolate=ISOLATE,
                             hide=[tmp_path], cell_timeout_s=120)
    assert grade.status == "timeout" and grade.score == 0
    assert "12 s limit" in grade.checks[0].message
    assert "your code for Task 1" in grade.checks[0].message, grade.checks[0].message


@grading
def test_os_exit_in_a_student_cell_is_a_crash_that_says_where(tmp_path, scheduler):
    book = solved()
    student_cells(book)[2].source = "import os\nos._exit(3)"
    grade = grade_submission(hand_in(tmp_path, "erin", book), scheduler, limits=Limits(time_s=60), isolate=ISOLATE,
                             hide=[tmp_path], cell_timeout_s=30)
    assert grade.status == "crashed" and grade.score == 0  # the tasks are called after every cell has run
    assert "exit code 3" in grade.checks[0].message
    assert "your code for Task 3" in grade.checks[0].message, grade.checks[0].message


# --- ./course grade and the cohort grader agree ---------------------------------------------------

def _paging_variants() -> dict:
    timing = solved(PAGING, PAGING_SOLUTION)
    first = student_cells(timing)[0]
    timing.cells.insert(timing.cells.index(first) + 1, nbformat.v4.new_code_cell(
        "import time\nstart = time.perf_counter()\nfor _ in range(1000):\n    kv_bytes_per_token(32, 8, 128, 2)\n"
        "print(f'1000 calls took {time.perf_counter() - start:.6f} s')"))
    chatty = solved(PAGING, PAGING_SOLUTION)
    cell = student_cells(chatty)[0]
    debug = '    print("debug:", num_layers, num_kv_heads, head_dim, dtype_bytes)\n'
    cell.source = cell.source.replace('"""\n', '"""\n' + debug, 1)
    assert "debug:" in cell.source
    half = solved(PAGING, PAGING_SOLUTION)
    student_cells(half)[0].source = student_cells(half)[0].source.replace("return 2 * ", "return ")
    return {"solved": solved(PAGING, PAGING_SOLUTION), "untouched": untouched(PAGING), "timing": timing,
            "debug-print": chatty, "half-bytes": half}


@grading
def test_course_grade_and_the_cohort_grader_give_the_same_verdicts(tmp_path, capsys):
    root = tmp_path / "submissions"
    variants = _paging_variants()
    for learner, book in variants.items():
        hand_in(root, learner, book, PAGING.name)
    cohort = {g.learner: g for g in grade_cohort(root, [prepare_exercise(PAGING)], lambda *args: None, jobs=2,
                                                  out=tmp_path / "gradebook", isolate=ISOLATE)}
    for learner in variants:
        alone = grade_file(root / learner / PAGING.name)
        together = cohort[learner]
        assert alone.status == together.status == "graded", (learner, alone.status, together.status)
        assert [(c.name, c.passed, c.message, c.details) for c in alone.checks] == \
            [(c.name, c.passed, c.message, c.details) for c in together.checks], learner
    assert {learner: verdicts(grade) for learner, grade in cohort.items()} == {
        "solved": [True] * 4, "untouched": [False] * 4, "timing": [True] * 4, "debug-print": [True] * 4,
        "half-bytes": [False, True, True, True]}
    assert "that is half" in cohort["half-bytes"].checks[0].message  # the hint reaches both
    capsys.readouterr()
    assert grade_main([str(root / "timing" / PAGING.name)]) == 0
    assert grade_main([str(root / "untouched" / PAGING.name)]) == 1
    printed = capsys.readouterr().out
    assert "4/4 tasks, PASS" in printed and "0/4 tasks, FAIL" in printed and "1000 calls took" not in printed
