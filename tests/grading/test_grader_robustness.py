"""What an independent review of the grader found, each case graded for real in the sandbox:
honest notebooks that used to lose marks, and learner data that used to pass for a grader bug."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import nbformat
import pytest

from course_lib.exercise_files import course_exercise, exercise_file, solution_file
from course_lib.grading.cohort import grade_cohort
from course_lib.grading.grade import ExerciseGrade, CheckResult, prepare_exercise
from course_lib.grading.gradebook import grades_csv
from course_lib.grading.sandbox import Limits
from course_lib.paths import REPO_ROOT
from needs_sandbox import require_sandbox

PAGING = "01_paging"


def student_cells(book):
    return [cell for cell in book.cells if "student" in cell.metadata.get("tags", [])]


def solved():
    book = nbformat.read(course_exercise(PAGING), as_version=4)
    answers = student_cells(nbformat.read(REPO_ROOT / "solutions" / solution_file(PAGING), as_version=4))
    for mine, answer in zip(student_cells(book), answers):
        mine.source = answer.source
    return book


def with_task(book, number: int, source: str):
    student_cells(book)[number - 1].source = source
    return book


HOME = str(Path.home())
SUBMISSIONS = {
    # a correct notebook that leaves a thread running: graded at once, not held to the time limit
    "a_thread": with_task(solved(), 1, student_cells(solved())[0].source
                          + "\nimport threading\nthreading.Timer(3600, print, ('reminder',)).start()"),
    # sys.exit() for one input: that case's error, every other task still counts
    "b_exit": with_task(solved(), 4, '''
import sys
def blocks_after_parallel_sampling(prompt_len, num_samples, output_len, block_size):
    if prompt_len == 1:
        sys.exit("bad input")
    shared = prompt_len // block_size
    return shared + num_samples * (-(-(prompt_len + output_len) // block_size) - shared)
'''),
    # an honest overflow: a wrong answer, never a grader error
    "c_overflow": with_task(solved(), 3, "def paged_waste_fraction(lengths, block_size):\n    return 10**400"),
    # a float32 computation of a fraction: right to float32's precision, so right
    "d_float32": with_task(solved(), 3, '''
import numpy as np
def paged_waste_fraction(lengths, block_size):
    lengths = np.asarray(lengths, dtype=np.float32)
    held = (np.ceil(lengths / block_size) * block_size).sum()
    return (held - lengths.sum()) / held
'''),
    # an import added above every task, used in Task 1
    "e_import_above": solved(),
    # what the learner's code sees of the grader's home folder
    "f_home": with_task(solved(), 1, f'''
def kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes):
    return str(sorted(os.listdir({HOME!r})))
'''),
}
_task1 = student_cells(SUBMISSIONS["e_import_above"])[0]
_task1.source = _task1.source.replace("return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes",
                                      "return math.prod([2, num_layers, num_kv_heads, head_dim, dtype_bytes])")
assert "math.prod" in _task1.source
SUBMISSIONS["e_import_above"].cells.insert(1, nbformat.v4.new_code_cell("import math"))  # under the title


@pytest.fixture(scope="module")
def grades(tmp_path_factory):
    require_sandbox()
    root = Path(tmp_path_factory.mktemp("robustness"))
    for name, book in SUBMISSIONS.items():
        (root / name).mkdir()
        nbformat.write(book, root / name / exercise_file(PAGING))
    (root / ".ipynb_checkpoints").mkdir()  # not a learner
    (root / "__MACOSX").mkdir()
    exercise = prepare_exercise(course_exercise(PAGING))
    graded = grade_cohort(root, [exercise], lambda *args: None, jobs=2, limits=Limits(time_s=40), isolate=True,
                          cell_timeout_s=30)
    return {grade.learner: grade for grade in graded}


def passed(grade: ExerciseGrade) -> list[bool]:
    return [check.passed for check in grade.checks]


def test_only_learner_folders_are_graded(grades):
    assert sorted(grades) == sorted(SUBMISSIONS)


def test_a_thread_left_running_does_not_turn_a_correct_notebook_into_a_timeout(grades):
    assert (grades["a_thread"].status, passed(grades["a_thread"])) == ("graded", [True] * 4)


def test_sys_exit_is_one_case_failing_not_a_crash(grades):
    grade = grades["b_exit"]
    assert grade.status == "graded" and passed(grade) == [True, True, True, False]
    assert "raised SystemExit: bad input" in grade.checks[3].message


def test_an_overflowing_answer_is_wrong_not_a_grader_error(grades):
    grade = grades["c_overflow"]
    assert grade.status == "graded" and passed(grade) == [True, True, False, True]


def test_float32_precision_is_right(grades):
    assert passed(grades["d_float32"]) == [True] * 4, grades["d_float32"].checks[2].message


def test_a_cell_added_above_the_tasks_runs(grades):
    assert passed(grades["e_import_above"]) == [True] * 4, grades["e_import_above"].checks[0].message


def test_the_graders_home_is_hidden_but_what_python_needs(grades):
    seen = grades["f_home"].checks[0].message
    assert ".bashrc" not in seen and ".profile" not in seen, seen


def test_csv_fields_never_start_a_formula():
    grade = ExerciseGrade("=cmd|' /C calc'!A0", PAGING, "graded",
                          (CheckResult("Task 1", False, '=HYPERLINK("http://example.invalid")'),))
    rows = list(csv.reader(io.StringIO(grades_csv([grade]))))
    assert rows[1][0].startswith("'=") and rows[1][5].startswith("'=")
