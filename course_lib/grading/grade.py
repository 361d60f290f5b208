"""Grade one exercise notebook: run the learner's code in a process of its own, judge its results here.

The same steps serve ``./course grade`` (a learner checking their own notebook) and the cohort
grader (every learner, each in a sandbox), so both give the same verdict on the same notebook:

1. ``prepare_exercise`` reads the pristine exercise and computes every task's cases and expected
   values from ``course_lib``, once, before any learner code runs.
2. ``grade_notebook`` rebuilds the submission around the pristine notebook (``restore.py``: the
   locked set-up cells, the learner's *Your code* cells and cells they added after them), writes
   it with the grader's cases into a private folder, and runs ``runner.py`` there
   (``sandbox.run_isolated``): the learner's process only runs their code and calls their
   functions on the grader's inputs, sending results back as plain data.
3. The results are judged here, by value (``task.judge``). Nothing the learner's code does in its
   own process (printing, rebinding names, patching modules, IPython hooks) reaches this one.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import nbformat

from course_lib.grading.checks import exercise_tasks
from course_lib.grading.restore import restore_locked_cells
from course_lib.grading.runner import PROGRAM, PROGRESS, RESULTS
from course_lib.grading.sandbox import Limits, run_isolated
from course_lib.grading.selfcheck import plain_cases
from course_lib.grading.task import Case, Task, expected_values, judge
from course_lib.grading.values import PlainDataError, loads

CELL_TIMEOUT_S = 120


@dataclass(frozen=True)
class CheckResult:
    name: str      # the task's heading
    passed: bool
    message: str = ""                      # why it failed, in one line
    details: tuple[str, ...] = ()          # the full report: failing cases with expected, got and hints


@dataclass(frozen=True)
class ExerciseGrade:
    learner: str
    exercise: str
    status: str
    checks: tuple[CheckResult, ...]
    notes: tuple[str, ...] = ()            # what else the learner should know (cells that raised)

    @property
    def score(self) -> int:
        return sum(check.passed for check in self.checks)


@dataclass(frozen=True)
class PreparedExercise:
    """An exercise as the grader holds it: read once, with every expected value already computed."""

    name: str
    pristine: nbformat.NotebookNode
    tasks: tuple[Task, ...]
    cases: tuple[tuple[Case, ...], ...]
    expected: tuple[tuple[Any, ...], ...]
    plain: list[dict] = field(repr=False)  # the tasks as the learner's process receives them

    def every_check(self, learner: str, status: str, message: str, notes: Sequence[str] = ()) -> ExerciseGrade:
        """A grade in which every task failed for one reason (nothing could be run or judged)."""
        return ExerciseGrade(learner, self.name, status,
                             tuple(CheckResult(task.heading, False, message) for task in self.tasks), tuple(notes))


def prepare_exercise(pristine_path: str | Path) -> PreparedExercise:
    """Read the pristine exercise notebook and compute its tasks' cases and expected values."""
    pristine_path = Path(pristine_path)
    pristine = nbformat.read(pristine_path, as_version=4)
    tasks = exercise_tasks(pristine_path.stem)
    cases = tuple(tuple(task.cases()) for task in tasks)
    expected = tuple(tuple(expected_values(task, task_cases)) for task, task_cases in zip(tasks, cases))
    plain = [{"number": task.number, "function": task.function, "call": task.call,
              "time_limit_s": task.time_limit_s, "cases": plain_cases(task_cases)}
             for task, task_cases in zip(tasks, cases)]
    return PreparedExercise(pristine_path.stem, pristine, tasks, cases, expected, plain)


def program_cells(submission: nbformat.NotebookNode, pristine: nbformat.NotebookNode) -> list[dict]:
    """The code cells to run: the pristine notebook's, with the learner's student cells (and the
    cells they added after them) in place, and without the check cells, which only give feedback."""
    graded = restore_locked_cells(submission, pristine)
    code = [cell for cell in graded.cells if cell.cell_type == "code" and "check" not in cell.metadata.get("tags", [])]
    return [{"id": f"code cell {index + 1}" + (" (your code)" if "student" in cell.metadata.get("tags", []) else ""),
             "source": cell.source} for index, cell in enumerate(code)]


def _runner_env(work: Path) -> dict[str, str]:
    """The learner's process's whole environment: nothing else of the grader's reaches it."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(work / "home"), "LANG": "C.UTF-8",
            "MPLBACKEND": "Agg", "IPYTHONDIR": str(work / "ipython"), "PYTHONDONTWRITEBYTECODE": "1",
            "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "TMPDIR": str(work / "tmp")}


def _read_regular_file(path: Path, limit: int) -> bytes:
    """At most ``limit`` bytes of ``path``, which the learner's process may have made anything: a
    link is not followed, and a folder, a FIFO or a device is refused without blocking."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(descriptor, "rb") as handle:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise OSError(f"{path.name} is not a regular file")
        return handle.read(limit)


def _read_untrusted(path: Path) -> Any:
    """The JSON the learner's process left in ``path``."""
    try:
        data = _read_regular_file(path, 8 * 2**20 + 1)
    except OSError as error:
        raise PlainDataError(f"no results ({type(error).__name__})") from None
    return loads(data.decode("utf-8", errors="replace"))


def _last_progress(work: Path) -> str:
    """Where the learner's process was last: the cell or task it had started."""
    try:
        lines = _read_regular_file(work / PROGRESS, 2**20).decode("utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return lines[-1].removeprefix("cell ")[:200] if lines else ""


def grade_notebook(learner: str, submission: nbformat.NotebookNode, exercise: PreparedExercise, *,
                   limits: Limits = Limits(), isolate: bool = False, hide: Sequence[Path] = (),
                   cell_timeout_s: float = CELL_TIMEOUT_S) -> ExerciseGrade:
    """Run ``submission``'s code for ``exercise`` in a process of its own and judge its results.
    ``isolate`` runs that process in a sandbox (``sandbox.py``) with ``hide`` out of its sight."""
    program = {"cells": program_cells(submission, exercise.pristine), "tasks": exercise.plain,
               "cell_timeout_s": cell_timeout_s}
    with tempfile.TemporaryDirectory(prefix="grade-") as folder:
        work = Path(folder)
        for sub in ("home", "ipython", "tmp"):
            (work / sub).mkdir()
        (work / PROGRAM).write_text(json.dumps(program), encoding="utf-8")
        outcome = run_isolated([sys.executable, "-m", "course_lib.grading.runner", str(work)], work, limits,
                               env=_runner_env(work), hide=hide, isolate=isolate, log=work / "log.txt")
        if outcome.timed_out:
            where = _last_progress(work)
            return exercise.every_check(learner, "timeout", f"stopped after the {limits.time_s:g} s limit"
                                        + (f" (while running {where})" if where else ""))
        try:
            results = _read_untrusted(work / RESULTS)
        except PlainDataError as error:
            where = _last_progress(work)
            return exercise.every_check(learner, "crashed", (
                f"the grading process stopped early with exit code {outcome.returncode}"
                + (f" while running {where}" if where else "")
                + ": os._exit, a crash, or running out of memory") if "no results" in str(error)
                else f"unreadable results: {error}")
    return _judged(learner, exercise, results)


def _judged(learner: str, exercise: PreparedExercise, results: Any) -> ExerciseGrade:
    tasks = results.get("tasks") if isinstance(results, dict) else None
    tasks = tasks if isinstance(tasks, dict) else {}
    checks = []
    for task, cases, expected in zip(exercise.tasks, exercise.cases, exercise.expected):
        verdict = judge(task, cases, expected, tasks.get(str(task.number)))
        checks.append(CheckResult(task.heading, verdict.passed, verdict.message(), tuple(verdict.report())))
    cells = results.get("cells") if isinstance(results, dict) else None
    notes = tuple(f"{str(cell.get('id'))[:40]} raised {cell['error']}"[:500] for cell in (cells if isinstance(cells, list) else [])
                  if isinstance(cell, dict) and isinstance(cell.get("error"), str))
    return ExerciseGrade(learner, exercise.name, "graded", tuple(checks), notes)
