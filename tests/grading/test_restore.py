"""The learner's last definition of a task's function wins, wherever it stands (``restore.py``).

A learner who deletes a task's *Your code* cell and writes the function in a cell of their own
(a new cell in its place, above it, below it, a pasted copy with a new id, a cell that does other
things too, a lambda) is graded on that definition; the deleted cell's starter is graded only for
the names no learner cell defines, so a learner who never wrote the function is still told
"not done yet". ``./course grade`` and the cohort grader share ``grade.py``, so they agree.
"""

from __future__ import annotations

import nbformat
import pytest

from course_lib.exercise_files import course_exercise, solution_file
from course_lib.grading.__main__ import grade_file
from course_lib.grading.cohort import grade_submission
from course_lib.grading.grade import grade_notebook, prepare_exercise, program_cells
from course_lib.grading.restore import restore_locked_cells
from course_lib.grading.sandbox import Limits, sandbox_problem
from course_lib.paths import REPO_ROOT

PAGING = course_exercise("01_paging")
PAGING_SOLUTION = REPO_ROOT / "solutions" / solution_file("01_paging")
ISOLATE = sandbox_problem() is None
NOT_DONE = "not done yet"


def student_cells(book) -> list:
    return [cell for cell in book.cells if "student" in cell.metadata.get("tags", [])]


def answers() -> list[str]:
    """The solution's *Your code* cells, task by task (the BEGIN/END markers are only comments)."""
    return [cell.source for cell in student_cells(nbformat.read(PAGING_SOLUTION, as_version=4))]


def solved():
    book = nbformat.read(PAGING, as_version=4)
    for cell, answer in zip(student_cells(book), answers()):
        cell.source = answer
    return book


def delete_task(book, task: int) -> int:
    """Delete task ``task``'s *Your code* cell (1-based); return the index it stood at."""
    cell = student_cells(book)[task - 1]
    index = book.cells.index(cell)
    del book.cells[index]
    return index


def new_cell(source: str, **metadata):
    return nbformat.v4.new_code_cell(source, metadata=metadata)


def set_up_index(book) -> int:
    return next(i for i, cell in enumerate(book.cells) if "setup" in cell.metadata.get("tags", []))


@pytest.fixture(scope="module")
def paging():
    return prepare_exercise(PAGING)


def grade(book, paging):
    return grade_notebook("learner", book, paging, isolate=ISOLATE, cell_timeout_s=60)


def verdicts(grade) -> list[bool]:
    return [check.passed for check in grade.checks]


def test_a_new_cell_in_the_deleted_cells_place_counts(paging):
    book = solved()
    book.cells.insert(delete_task(book, 1), new_cell(answers()[0]))  # a fresh cell, no tags, a new id
    result = grade(book, paging)
    assert (result.status, verdicts(result)) == ("graded", [True] * 4), [c.message for c in result.checks]


def test_a_definition_above_the_deleted_cell_counts_even_in_a_cell_that_does_more(paging):
    book = solved()
    delete_task(book, 3)
    helper = "import math\nprint('my notes')\n\n" + answers()[2] + "\n\nassert paged_waste_fraction([4], 4) == 0\n"
    book.cells.insert(set_up_index(book) + 1, new_cell(helper))  # right after the set-up, before task 1
    result = grade(book, paging)
    assert verdicts(result) == [True] * 4, [c.message for c in result.checks]


def test_a_lambda_above_every_cell_counts(paging):
    book = solved()
    delete_task(book, 1)
    lam = "kv_bytes_per_token = lambda num_layers, num_kv_heads, head_dim, dtype_bytes: (\n" \
          "    2 * num_layers * num_kv_heads * head_dim * dtype_bytes)"
    book.cells.insert(1, new_cell(lam))  # under the title, above the set-up cell
    result = grade(book, paging)
    assert verdicts(result) == [True] * 4, [c.message for c in result.checks]


def test_a_definition_below_the_deleted_cell_counts(paging):
    book = solved()
    delete_task(book, 2)
    book.cells.append(new_cell(answers()[1]))  # at the very end, after "Done"
    result = grade(book, paging)
    assert verdicts(result) == [True] * 4, [c.message for c in result.checks]


def test_a_pasted_copy_with_a_new_id_counts(paging):
    book = solved()
    original = student_cells(book)[0]
    pasted = new_cell(answers()[0], **dict(original.metadata))  # the tags travel with a pasted cell, the id does not
    assert pasted.get("id") != original.get("id")
    delete_task(book, 1)
    book.cells.insert(set_up_index(book) + 1, pasted)
    result = grade(book, paging)
    assert verdicts(result) == [True] * 4, [c.message for c in result.checks]


def test_the_last_definition_wins_over_an_earlier_one(paging):
    book = solved()
    index = delete_task(book, 1)
    book.cells.insert(index, new_cell(answers()[0]))  # the final version, where the deleted cell stood
    book.cells.insert(set_up_index(book) + 1, new_cell("def kv_bytes_per_token(*args):\n    return 0"))  # a first try
    assert verdicts(grade(book, paging)) == [True] * 4
    book.cells.append(new_cell("def kv_bytes_per_token(*args):\n    return 0"))  # ... unless a wrong one comes after
    assert verdicts(grade(book, paging)) == [False, True, True, True]


def test_a_deleted_cell_never_rewritten_is_not_done_yet(paging):
    book = solved()
    delete_task(book, 2)
    book.cells.insert(set_up_index(book) + 1, new_cell("kv_blocks = 3  # a name that only looks alike"))
    result = grade(book, paging)
    assert verdicts(result) == [True, False, True, True]
    assert NOT_DONE in result.checks[1].message, result.checks[1].message


def test_course_grade_and_the_cohort_grader_agree_on_a_moved_definition(tmp_path, paging):
    book = solved()
    delete_task(book, 4)  # never rewritten
    book.cells.insert(delete_task(book, 1), new_cell(answers()[0]))
    (tmp_path / "lee").mkdir()
    nbformat.write(book, tmp_path / "lee" / PAGING.name)
    alone = grade_file(tmp_path / "lee" / PAGING.name)
    together = grade_submission(tmp_path / "lee", paging, limits=Limits(time_s=120), isolate=ISOLATE, hide=[tmp_path],
                                cell_timeout_s=60)
    assert [(c.passed, c.message) for c in alone.checks] == [(c.passed, c.message) for c in together.checks]
    assert verdicts(alone) == [True, True, True, False] and NOT_DONE in alone.checks[3].message


# --- which starter definitions are graded (no learner code runs) ----------------------------------

def _run(book, pristine) -> str:
    return "\n".join(cell["source"] for cell in program_cells(book, pristine))


def test_a_starter_keeps_only_the_definitions_no_learner_cell_makes():
    pristine = nbformat.read(course_exercise("09_serving_tradeoffs"), as_version=4)
    starter = student_cells(pristine)[0].source  # defines quantize_int4 and dequantize_int4
    assert "def quantize_int4" in starter and "def dequantize_int4" in starter
    book = nbformat.read(course_exercise("09_serving_tradeoffs"), as_version=4)
    delete_task(book, 1)
    assert _run(book, pristine).count("def quantize_int4") == 1  # nothing rewritten: the whole starter
    book.cells.append(new_cell("%%time\ndef quantize_int4(weight, group_size, symmetric):\n    return None"))
    program = _run(book, pristine)
    assert program.count("def quantize_int4") == 1 and program.count("def dequantize_int4") == 1
    assert program.index("def dequantize_int4") < program.index("return None")  # the starter's, where it stood
    book.cells.append(new_cell("from my_helpers import dequantize_int4"))  # both defined: no starter left
    program = _run(book, pristine)
    assert program.count("def quantize_int4") == 1 and program.count("def dequantize_int4") == 0


def test_a_star_import_may_define_anything_so_no_starter_overrides_it():
    pristine = nbformat.read(PAGING, as_version=4)
    book = solved()
    delete_task(book, 1)
    book.cells.insert(set_up_index(book) + 1, new_cell("from my_paging_helpers import *"))
    assert "def kv_bytes_per_token" not in _run(book, pristine)


def test_restored_starters_stand_where_their_cells_stood():
    pristine = nbformat.read(PAGING, as_version=4)
    book = solved()
    delete_task(book, 2)
    graded = restore_locked_cells(book, pristine)
    assert [cell.get("id") for cell in graded.cells] == [cell.get("id") for cell in pristine.cells]
    assert student_cells(graded)[1].source == student_cells(pristine)[1].source


def test_the_names_a_cell_binds_are_read_as_ipython_runs_it():
    from course_lib.grading.restore import bound_names
    assert bound_names("%%time\ndef f(x):\n    g = 1\n    return g") == {"f"}  # not g: the function's own
    assert bound_names("%%capture out\nh = lambda: 1") == {"h"}
    assert bound_names("%%writefile helper.py\ndef f(): pass") == set()  # written to a file, not defined
    assert bound_names("import numpy as np, os.path\nfrom math import ceil as c\nfiles = !ls") == {"np", "os", "c",
                                                                                                  "files"}
    assert bound_names("for i in range(2):\n    if (k := i):\n        pass\n[j for j in ()]\nclass K:\n    m = 1") == \
        {"i", "k", "K"}
    assert bound_names("def broken(:") == set() and bound_names("from helpers import *") is None
