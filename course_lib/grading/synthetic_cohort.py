"""A synthetic cohort for measuring and testing the cohort grader:
``python -m course_lib.grading.synthetic_cohort SUBMISSIONS --learners 30 [--seed 0] [--plan plan.json]``.

It writes ``SUBMISSIONS/<learner>/NN_name_exercise.ipynb`` for every learner and exercise (01-09),
the layout ``grade-cohort`` reads. Each notebook is the pristine exercise with every task's *Your
code* cell filled from the course's solution (``solutions/NN_name_solution.ipynb``), then, per task,
one planted kind drawn from the seed (the same seed always gives the same bytes):

  correct   the solution as it is                                   (the task passes)
  undone    the exercise's starter left in place (``raise NotImplementedError``)   (fails)
  wrong     the solution, its function wrapped so every result is off: a number doubled plus
            one, a flag flipped, a tensor plus one, an in-place tensor or gradient changed
            after the call                                          (fails)
  error     the function raises ``ZeroDivisionError`` on every call      (fails)
  slow      the solution, after a ``time.sleep(SLOW_S)`` in the cell   (passes, SLOW_S later)

A task whose solution calls an earlier task's function (exercise 02's idle slot-steps call
``static_steps``, exercise 06's ring all-reduce calls ``ring_schedule``) fails too when that one
does not pass: ``expected_passes(module, kinds)`` gives each task's verdict with that taken into
account. ``plan`` (written by ``--plan``) gives the kind of every learner x exercise x task, so a
test can check each verdict, and a caller can build its own variants: ``learner_notebook(module, kinds)``
makes one notebook from a list of kinds, ``student_sources(module)`` gives the solution's cells.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path
from typing import Mapping, Sequence

import nbformat

from course_lib.exercise_files import course_exercise, exercise_file, exercise_modules, solution_file
from course_lib.grading.checks import exercise_tasks
from course_lib.paths import REPO_ROOT

KINDS = ("correct", "undone", "wrong", "error", "slow")
MIX = {"correct": 0.62, "undone": 0.12, "wrong": 0.14, "error": 0.08, "slow": 0.04}  # a task's chances
PASSES = {"correct": True, "slow": True, "undone": False, "wrong": False, "error": False}
SLOW_S = 3.0

WRONG = '''

# (planted: every result of {name} is off)
def _planted_off(value, args=(), kwargs=None):
    """``value`` made wrong; for a call that returns nothing, its tensor or model arguments made wrong."""
    import fractions
    import torch
    if value is None:
        for argument in [*args, *(kwargs or {{}}).values()]:
            if isinstance(argument, torch.Tensor) and argument.is_floating_point():
                argument.add_(1)
            elif isinstance(argument, torch.nn.Module):
                for parameter in argument.parameters():
                    if parameter.grad is not None:
                        parameter.grad.add_(1)
        return None
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float, fractions.Fraction)):
        return value * 2 + 1
    if isinstance(value, torch.Tensor):
        return value + 1
    if isinstance(value, str):
        return value + "?"
    if isinstance(value, (list, tuple)):
        return type(value)([_planted_off(value[0]), *value[1:]]) if value else [0]
    if isinstance(value, dict):
        key = next(iter(value), None)
        return {{**value, key: _planted_off(value[key])}} if value else {{"planted": 1}}
    if callable(value):
        def later(*more, **more_kwargs):
            return _planted_off(value(*more, **more_kwargs), args, kwargs)
        return later
    return None


def _planted_wrong(function):
    def {name}(*args, **kwargs):
        return _planted_off(function(*args, **kwargs), args, kwargs)
    return {name}


{name} = _planted_wrong({name})
'''

ERROR = '''

# (planted: {name} raises)
def {name}(*args, **kwargs):
    return 1 / 0
'''

SLOW = '''import time

time.sleep({seconds})  # (planted: a slow cell)
'''


def student_cells(book: nbformat.NotebookNode) -> list:
    return [cell for cell in book.cells if "student" in cell.metadata.get("tags", [])]


def student_sources(module: str) -> list[str]:
    """The solution's *Your code* cells of ``module``, in task order."""
    return [cell.source for cell in student_cells(nbformat.read(REPO_ROOT / "solutions" / solution_file(module),
                                                                as_version=4))]


def planted_source(module: str, task: int, kind: str, *, slow_s: float = SLOW_S) -> str | None:
    """Task ``task``'s (from 1) *Your code* cell of ``module`` with ``kind`` planted; None for undone
    (the starter stays)."""
    source = student_sources(module)[task - 1]
    function = exercise_tasks(module)[task - 1].function
    if kind == "correct":
        return source
    if kind == "undone":
        return None
    if kind == "wrong":
        return source + WRONG.format(name=function)
    if kind == "error":
        return source + ERROR.format(name=function)
    if kind == "slow":
        return SLOW.format(seconds=slow_s) + source
    raise ValueError(f"unknown kind {kind!r}; the kinds are {', '.join(KINDS)}")


def learner_notebook(module: str, kinds: Sequence[str], *, slow_s: float = SLOW_S) -> nbformat.NotebookNode:
    """The pristine exercise of ``module`` with each task's cell planted with its kind, in task order."""
    book = nbformat.read(course_exercise(module), as_version=4)
    cells = student_cells(book)
    if len(kinds) != len(cells):
        raise ValueError(f"{module} has {len(cells)} tasks, not {len(kinds)}")
    for task, (cell, kind) in enumerate(zip(cells, kinds), start=1):
        source = planted_source(module, task, kind, slow_s=slow_s)
        if source is not None:
            cell.source = source
    return book


def dependencies(module: str) -> list[set[int]]:
    """Per task (from 1), the earlier tasks whose functions its solution calls."""
    functions = [task.function for task in exercise_tasks(module)]
    sources = student_sources(module)
    return [{earlier + 1 for earlier in range(number)
             if re.search(rf"\b{re.escape(functions[earlier])}\s*\(", sources[number])}
            for number in range(len(functions))]


def expected_passes(module: str, kinds: Sequence[str]) -> list[bool]:
    """Whether each task of a notebook planted with ``kinds`` passes: its kind passes, and so does
    every earlier task its solution calls."""
    passes: list[bool] = []
    for kind, needs in zip(kinds, dependencies(module)):
        passes.append(PASSES[kind] and all(passes[number - 1] for number in needs))
    return passes


def draw_plan(learners: int, seed: int = 0, modules: Sequence[str] | None = None,
              mix: Mapping[str, float] = MIX) -> dict[str, dict[str, list[str]]]:
    """learner -> module -> each task's kind, drawn from ``mix`` by a generator seeded with ``seed``
    and the learner's name (so learner07's notebooks do not change when the cohort grows)."""
    modules = list(modules or exercise_modules())
    tasks = {module: len(exercise_tasks(module)) for module in modules}
    kinds, weights = zip(*mix.items())
    plan = {}
    for number in range(1, learners + 1):
        learner = f"learner{number:02d}"
        draws = random.Random(f"{seed}:{learner}")
        plan[learner] = {module: draws.choices(kinds, weights, k=tasks[module]) for module in modules}
    return plan


def write_cohort(submissions: Path, plan: Mapping[str, Mapping[str, Sequence[str]]], *,
                 slow_s: float = SLOW_S) -> None:
    """Write ``plan``'s notebooks into ``submissions/<learner>/``."""
    for learner, modules in plan.items():
        folder = Path(submissions) / learner
        folder.mkdir(parents=True, exist_ok=True)
        for module, kinds in modules.items():
            nbformat.write(learner_notebook(module, kinds, slow_s=slow_s), folder / exercise_file(module))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.grading.synthetic_cohort",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("submissions", type=Path, help="where to write one folder per learner")
    parser.add_argument("--learners", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--exercise", action="append", help="only these modules (e.g. 01_paging)")
    parser.add_argument("--slow-s", type=float, default=SLOW_S, help=f"a slow cell's sleep (default {SLOW_S:g} s)")
    parser.add_argument("--plan", type=Path, help="also write learner -> module -> kinds here (JSON)")
    args = parser.parse_args(argv)
    plan = draw_plan(args.learners, args.seed, args.exercise)
    write_cohort(args.submissions, plan, slow_s=args.slow_s)
    if args.plan:
        args.plan.write_text(json.dumps(plan, indent=1) + "\n")
    counts = {kind: sum(kinds.count(kind) for modules in plan.values() for kinds in modules.values())
              for kind in KINDS}
    print(f"wrote {len(plan)} learners x {len(next(iter(plan.values())))} exercises in {args.submissions}: "
          + ", ".join(f"{count} {kind}" for kind, count in counts.items()) + " tasks")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
