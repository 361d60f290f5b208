"""Exercise grading in both directions, and notebook hygiene."""

import json

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from course_lib.exercise_files import SOLUTION, course_exercise, exercise_file, module_of, solution_file
from course_lib.grading.execute import is_checked
from course_lib.grading.exercise import make_exercise, strip_solution
from course_lib.grading.grade import grade_notebook, prepare_exercise
from course_lib.grading.__main__ import grade_file
from course_lib.grading.__main__ import main as grade_main
from course_lib.paths import REPO_ROOT

SOLUTIONS = sorted((REPO_ROOT / "solutions").glob("*.ipynb"))


def test_strip_solution_keeps_signature_and_indentation():
    source = "def f(x):\n    '''Doc.'''\n    ### BEGIN SOLUTION\n    y = x + 1\n    return y\n    ### END SOLUTION\n"
    stripped = strip_solution(source)
    assert stripped.splitlines() == ["def f(x):", "    '''Doc.'''", "    raise NotImplementedError("
                                     '"Your code here: replace this line (see the task above).")']
    namespace = {}
    exec(stripped, namespace)
    with pytest.raises(NotImplementedError):
        namespace["f"](1)


@pytest.mark.parametrize("source, problem", [
    ("### BEGIN SOLUTION\nx = 1\n", "never closed"),
    ("x = 1\n### END SOLUTION\n", "without a matching"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION\n", "opened twice"),
])
def test_malformed_solution_markers_are_reported(source, problem):
    with pytest.raises(ValueError, match=problem):
        strip_solution(source, "cell 3")


def test_make_exercise_clears_outputs_and_locks_checks():
    student = new_code_cell("def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION",
                            metadata={"tags": ["student"]}, outputs=[{"output_type": "stream", "name": "stdout",
                                                                       "text": "debug\n"}])
    check = new_code_cell("print(f())", metadata={"tags": ["check"]},
                          outputs=[{"output_type": "stream", "name": "stdout", "text": "1\n"}])
    exercise = make_exercise(new_notebook(cells=[student, check]))
    assert exercise.cells[0].outputs == [] and "NotImplementedError" in exercise.cells[0].source
    assert exercise.cells[1].outputs == []  # a check shows its verdict only once the learner runs it
    assert exercise.cells[1].metadata["editable"] is False and exercise.cells[1].metadata["deletable"] is False
    with pytest.raises(ValueError, match="needs a '### BEGIN SOLUTION' region"):
        make_exercise(new_notebook(cells=[new_code_cell("x = 1", metadata={"tags": ["student"]})]))


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.name)
def test_committed_exercise_is_built_from_its_solution(solution):
    exercise = nbformat.read(course_exercise(module_of(solution.name, SOLUTION)), as_version=4)
    expected = make_exercise(nbformat.read(solution, as_version=4))
    assert [c.source for c in exercise.cells] == [c.source for c in expected.cells]
    assert [c.get("outputs") for c in exercise.cells] == [c.get("outputs") for c in expected.cells], \
        "exercise is stale: run `.venv/bin/python -m course_lib.grading --build`"


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.name)
def test_the_grader_passes_each_solution_and_fails_each_untouched_exercise(solution):
    solved = grade_file(solution)
    assert solved.status == "graded" and all(c.passed for c in solved.checks), [c.message for c in solved.checks]
    untouched = grade_file(course_exercise(module_of(solution.name, SOLUTION)))
    assert untouched.status == "graded" and untouched.score == 0
    assert all("not done yet" in c.message for c in untouched.checks)


def test_a_wrong_answer_fails_only_its_own_task_and_says_why(tmp_path, capsys):
    book = nbformat.read(REPO_ROOT / "solutions" / solution_file("01_paging"), as_version=4)
    task1 = next(c for c in book.cells if "def kv_bytes_per_token" in c.source)
    task1.source = task1.source.replace("return 2 * num_layers", "return num_layers")  # forgot K and V
    wrong = tmp_path / exercise_file("01_paging")
    nbformat.write(book, wrong)
    assert grade_main([str(wrong)]) == 1
    out = capsys.readouterr().out
    assert "Task 1 · Bytes per token: FAIL" in out and "3 of 4 tasks" not in out and "3/4 tasks, FAIL" in out
    assert "kv_bytes_per_token(32, 8, 128, 2)" in out and "expected 131072" in out and "got      65536" in out
    assert "AND a value" in out


def test_grader_rejects_a_path_that_is_not_an_exercise_notebook(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a notebook"):
        grade_file(tmp_path / "missing.ipynb")
    other = tmp_path / "my_notes.ipynb"
    nbformat.write(new_notebook(), other)
    with pytest.raises(FileNotFoundError, match="keep the exercise's file name"):
        grade_file(other)


@pytest.mark.parametrize("lesson", sorted((REPO_ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_lessons_are_committed_without_stale_outputs(lesson):
    book = json.loads(lesson.read_text())
    for cell in book["cells"]:
        if cell["cell_type"] == "code" and cell["outputs"]:
            assert is_checked(cell), "only cells tagged nbval-check-output keep outputs; run --build"
        assert "NBVAL_" not in "".join(cell["source"]), "mark checked cells with a tag, not a comment learners see"
    assert "widgets" not in book["metadata"]


def test_without_a_sandbox_the_same_pipeline_gives_the_same_verdicts():
    """Machines without bubblewrap (a learner's laptop) grade in a plain process group."""
    exercise = prepare_exercise(course_exercise("01_paging"))
    for path, score in ((REPO_ROOT / "solutions" / solution_file("01_paging"), 4), (course_exercise("01_paging"), 0)):
        book = nbformat.read(path, as_version=4)
        grade = grade_notebook("me", book, exercise, isolate=False)
        assert (grade.status, grade.score) == ("graded", score), [c.message for c in grade.checks]
