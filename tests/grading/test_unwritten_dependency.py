"""A task whose function calls another task's (exercise 02's idle slot-steps call ``static_steps``,
exercise 06's ring all-reduce calls ``ring_schedule`` on every rank) fails while that other function
is still the starter; the feedback names the function to write first, instead of telling the
learner to replace a ``raise`` line that their own, finished cell no longer has."""

from __future__ import annotations

import nbformat
import pytest

from course_lib.exercise_files import course_exercise, solution_file
from course_lib.grading import task
from course_lib.grading.grade import grade_notebook, prepare_exercise
from course_lib.grading.sandbox import sandbox_problem
from course_lib.paths import REPO_ROOT

ISOLATE = sandbox_problem() is None


def student_cells(book) -> list:
    return [cell for cell in book.cells if "student" in cell.metadata.get("tags", [])]


def solved_but_task_1(exercise: str):
    """The exercise with every *Your code* cell solved but task 1's, left as the starter."""
    book = nbformat.read(course_exercise(exercise), as_version=4)
    answers = student_cells(nbformat.read(REPO_ROOT / "solutions" / solution_file(exercise), as_version=4))
    for number, (cell, answer) in enumerate(zip(student_cells(book), answers), start=1):
        if number != 1:
            cell.source = answer.source
    return book


@pytest.mark.parametrize("exercise, task, first", [("02_batching", 2, "static_steps"),
                                                    ("06_ring_vs_tree", 2, "ring_schedule")])
def test_a_task_calling_an_unwritten_function_names_it(exercise, task, first):
    graded = grade_notebook("learner", solved_but_task_1(exercise), prepare_exercise(course_exercise(exercise)),
                            isolate=ISOLATE, cell_timeout_s=120)
    own, calling = graded.checks[0], graded.checks[task - 1]
    assert not own.passed and "replace the `raise NotImplementedError(...)` line" in own.message, own.message
    assert not calling.passed
    assert f"it calls `{first}`, another task's function" in calling.message, calling.message
    assert "replace the `raise" not in calling.message, calling.message


def test_a_case_that_raised_in_another_tasks_starter_gets_a_hint_naming_it():
    """Where only some cases reach the unwritten function, each of those cases' hint names it; a name
    the learner's process sent that is no identifier is ignored (outcomes are untrusted)."""
    from course_lib.grading.checks.batching import TASKS

    idle = next(t for t in TASKS if t.function == "static_idle_slot_steps")
    cases = idle.cases()[:3]
    expected = task.expected_values(idle, cases)
    error = "NotImplementedError: Your code here: replace this line (see the task above)."
    outcomes = [{"value": expected[0]}, {"error": error, "unwritten": "static_steps"},
                {"error": error, "unwritten": "static_steps(); import os"}]
    verdict = task.judge(idle, cases, expected, outcomes)
    first, named, forged = verdict.cases
    assert first.passed and not named.passed and not forged.passed
    assert named.hint.startswith("`static_steps`, which this task's function calls, is not written yet"), named.hint
    assert "import os" not in forged.hint and forged.hint.startswith("this task is not done yet"), forged.hint
