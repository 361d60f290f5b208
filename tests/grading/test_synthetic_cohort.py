"""The synthetic cohort (``synthetic_cohort.py``) that the cohort benchmark grades: the same seed
gives the same notebooks, each task holds its planted kind, and each kind gets the verdict it
stands for (correct and slow pass; undone, wrong and error fail)."""

from __future__ import annotations

import nbformat
import pytest

from course_lib.exercise_files import course_exercise, exercise_file, exercise_modules
from course_lib.grading.grade import grade_notebook, prepare_exercise
from course_lib.grading.sandbox import sandbox_problem
from course_lib.grading.synthetic_cohort import (KINDS, PASSES, dependencies, draw_plan, expected_passes,
                                                 learner_notebook, main, student_cells, student_sources)


def test_the_same_seed_draws_the_same_cohort_and_a_learner_keeps_theirs_as_it_grows():
    plan = draw_plan(12, seed=3)
    assert plan == draw_plan(12, seed=3) != draw_plan(12, seed=4)
    assert draw_plan(20, seed=3)["learner07"] == plan["learner07"]
    assert sorted(plan["learner01"]) == exercise_modules()
    kinds = [kind for modules in plan.values() for tasks in modules.values() for kind in tasks]
    assert set(kinds) == set(KINDS)  # 12 learners x 30 tasks draw every kind


def test_the_command_writes_the_layout_grade_cohort_reads(tmp_path, capsys):
    assert main([str(tmp_path / "subs"), "--learners", "3", "--exercise", "01_paging", "--plan",
                 str(tmp_path / "plan.json")]) == 0
    assert sorted(p.name for p in (tmp_path / "subs").iterdir()) == ["learner01", "learner02", "learner03"]
    assert [p.name for p in (tmp_path / "subs" / "learner02").iterdir()] == [exercise_file("01_paging")]
    first = (tmp_path / "subs" / "learner01" / exercise_file("01_paging")).read_bytes()
    main([str(tmp_path / "again"), "--learners", "3", "--exercise", "01_paging"])
    assert (tmp_path / "again" / "learner01" / exercise_file("01_paging")).read_bytes() == first
    assert "wrote 3 learners x 1 exercises" in capsys.readouterr().out


def test_each_task_cell_holds_its_kind():
    module = "06_ring_vs_tree"
    book = learner_notebook(module, ["undone", "wrong", "slow"])
    pristine = student_cells(nbformat.read(course_exercise(module), as_version=4))
    cells, solutions = student_cells(book), student_sources(module)
    assert cells[0].source == pristine[0].source and "NotImplementedError" in cells[0].source
    assert cells[1].source.startswith(solutions[1]) and "_planted_wrong" in cells[1].source
    assert cells[2].source.endswith(solutions[2]) and "time.sleep" in cells[2].source
    with pytest.raises(ValueError, match="has 3 tasks"):
        learner_notebook(module, ["correct"])


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_gets_its_verdict(kind):
    exercise = prepare_exercise(course_exercise("01_paging"))
    book = learner_notebook("01_paging", [kind] * len(exercise.tasks), slow_s=0.5)
    grade = grade_notebook("learner", book, exercise, isolate=sandbox_problem() is None)
    assert grade.status == "graded"
    assert [check.passed for check in grade.checks] == [PASSES[kind]] * len(exercise.tasks), grade.checks


def test_a_task_that_calls_an_earlier_ones_function_fails_with_it():
    assert dependencies("02_batching") == [set(), {1}, set()]  # idle slot-steps call static_steps
    assert dependencies("06_ring_vs_tree") == [set(), {1}, set()]  # the ring all-reduce follows ring_schedule
    kinds = ["undone", "correct", "slow"]
    assert expected_passes("02_batching", kinds) == [False, False, True]
    exercise = prepare_exercise(course_exercise("02_batching"))
    grade = grade_notebook("learner", learner_notebook("02_batching", kinds, slow_s=0.5), exercise,
                           isolate=sandbox_problem() is None)
    assert [check.passed for check in grade.checks] == [False, False, True]
