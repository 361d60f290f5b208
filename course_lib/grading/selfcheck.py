"""The check cells of an exercise notebook: the learner's quick look at one task, in their own kernel.

    check = Checker("01_paging")     # in the set-up cell
    check(kv_bytes_per_token)        # a check cell: runs every case of the task this function solves

It uses the same cases, calls and value comparison as the graders (``./course grade`` and the
cohort grader), which run the notebook's cells afresh in the order the learner left them. It
is only feedback: the graders never rely on what a check cell prints, and compute every
expected value in a process of their own.
"""

from __future__ import annotations

from typing import Callable

from course_lib.grading.calls import run_cases
from course_lib.grading.checks import exercise_tasks
from course_lib.grading.task import TaskVerdict, expected_values, judge
from course_lib.grading.values import to_plain


def plain_cases(cases) -> list[dict]:
    """Cases as the plain data a learner's process receives."""
    return [{"args": to_plain(list(case.args)), "kwargs": to_plain(dict(case.kwargs))} for case in cases]


class Checker:
    """Checks the learner's functions for one exercise, printing the verdict and worked examples."""

    def __init__(self, exercise: str) -> None:
        self.exercise = exercise
        self.tasks = {task.function: task for task in exercise_tasks(exercise)}

    def verdict(self, function: Callable) -> TaskVerdict:
        """Judge ``function`` on every case of the task it solves (found by its name)."""
        name = getattr(function, "__name__", None)
        if name not in self.tasks:
            raise ValueError(f"{name!r} is not a function this exercise grades; check cells take one of "
                             f"{', '.join(self.tasks)}. Keep the names the tasks give.")
        task = self.tasks[name]
        cases = task.cases()
        outcomes = run_cases(function, task.call, plain_cases(cases), task.time_limit_s)
        return judge(task, cases, expected_values(task, cases), outcomes)

    def __call__(self, function: Callable) -> None:
        """Print the verdict on ``function``; when it passes, the task's worked examples too."""
        verdict = self.verdict(function)
        lines = verdict.report()
        if verdict.passed:
            examples = verdict.cases[:self.tasks[function.__name__].examples]
            lines += [f"  {case.call} = {case.got}" + (f"   [{case.why}]" if case.why else "") for case in examples]
        print("\n".join(lines))
