"""Grade one exercise notebook: run the learner's code in a process of its own, judge its results here.

The same steps serve ``./course grade`` (a learner checking their own notebook) and the cohort
grader (every learner, each in a sandbox), so both give the same verdict on the same notebook:

1. ``prepare_exercise`` reads the pristine exercise and computes every task's cases and expected
   values from ``course_lib``, once, before any learner code runs.
2. ``grade_notebook`` rebuilds the submission around the pristine notebook (``restore.py``: the
   locked set-up cells, the learner's *Your code* cells and the cells they added), writes it
   with the grader's cases into a private folder, and runs ``runner.py`` on it
   (``sandbox.run_isolated``): the learner's process runs their code and calls their functions on
   the grader's inputs, sending the results back as plain data over a bounded channel.
3. The results are judged here, by value (``task.judge``), against expected values this process
   computed. What the learner's code does in its own process (printing, rebinding names,
   patching modules, IPython hooks) cannot change that judgement; all it can change is what its
   process reports, which is only ever its own grade (see the README on what that allows).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import nbformat

from course_lib.exercise_files import EXERCISE, module_of
from course_lib.grading.checks import exercise_tasks
from course_lib.grading.restore import ADDED_TAG, restore_locked_cells
from course_lib.grading.runner import PROGRAM
from course_lib.grading.sandbox import SCRATCH_CWD, Limits, run_isolated
from course_lib.grading.selfcheck import plain_cases
from course_lib.grading.task import Case, Task, expected_values, judge
from course_lib.grading.values import MAX_TEXT, PlainDataError, loads
from course_lib.paths import REPO_ROOT

CELL_TIMEOUT_S = 120
CHANNEL_LIMIT = MAX_TEXT  # bytes of results a learner's process may send back
# What the learner's process sees of the course (besides the system and this Python, sandbox.py):
# course_lib, read-only, where the editable install and PYTHONPATH find it. Nothing else of the
# checkout (solutions/, an old gradebook, a hub's state) is needed, so none of it is shown; the
# checkout itself is hidden too, for a Python whose prefix or sys.path holds it (pip install -e's
# old egg-link, a venv made around the checkout).
REVEAL = (REPO_ROOT / "course_lib",)
HIDDEN = (REPO_ROOT,)


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

    name: str      # the module id (04_roofline), as grades.csv and the task tables know it
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
    """Read the pristine exercise notebook (``exercises/NN_name_exercise.ipynb``) and compute its
    tasks' cases and expected values; the exercise is known by its module id (``NN_name``)."""
    pristine_path = Path(pristine_path)
    module = module_of(pristine_path.name, EXERCISE)
    if module is None:
        raise ValueError(f"{pristine_path.name} is not an exercise's file name (NN_name_exercise.ipynb).")
    pristine = nbformat.read(pristine_path, as_version=4)
    tasks = exercise_tasks(module)
    cases = tuple(tuple(task.cases()) for task in tasks)
    expected = tuple(tuple(expected_values(task, task_cases)) for task, task_cases in zip(tasks, cases))
    plain = [{"number": task.number, "function": task.function, "call": task.call,
              "time_limit_s": task.time_limit_s, "cases": plain_cases(task_cases)}
             for task, task_cases in zip(tasks, cases)]
    return PreparedExercise(module, pristine, tasks, cases, expected, plain)


def program_cells(submission: nbformat.NotebookNode, pristine: nbformat.NotebookNode) -> list[dict]:
    """The code cells to run, each with a label a learner recognises: the pristine notebook's
    set-up, the learner's student cells and the cells they added (``restore.py``), in order,
    without the check cells, which only give feedback."""
    program, tasks_seen = [], 0
    for cell in restore_locked_cells(submission, pristine).cells:
        tags = cell.metadata.get("tags", [])
        if cell.cell_type != "code" or "check" in tags:
            continue
        if "student" in tags:
            tasks_seen += 1
            label = f"your code for Task {tasks_seen}"
        elif ADDED_TAG in tags:
            label = (f"a cell you added after your code for Task {tasks_seen}" if tasks_seen
                     else "a cell you added before Task 1")
        else:
            label = "the set-up cell" if "setup" in tags else f"the notebook's code cell {len(program) + 1}"
        program.append({"label": label, "source": cell.source})
    return program


def _runner_env(work: Path, isolate: bool) -> dict[str, str]:
    """The learner's process's whole environment: nothing else of the grader's reaches it. Its home
    and temporary folders are in its private /tmp (in the sandbox) or in ``work`` (without one)."""
    scratch = SCRATCH_CWD if isolate else work
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(scratch / "home"), "LANG": "C.UTF-8",
            "MPLBACKEND": "Agg", "IPYTHONDIR": str(scratch / "ipython"), "PYTHONDONTWRITEBYTECODE": "1",
            "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "TMPDIR": str(scratch),
            "USER": "learner", "LOGNAME": "learner",  # getpass.getuser() (torch's caches) without /etc/passwd
            "PYTHONPATH": str(REPO_ROOT)}


def _records(channel: bytes) -> list[dict]:
    """The records the learner's process sent, one JSON object per line; anything else is dropped."""
    records = []
    for line in channel.decode("utf-8", errors="replace").splitlines():
        try:
            record = loads(line)
        except PlainDataError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def grade_notebook(learner: str, submission: nbformat.NotebookNode, exercise: PreparedExercise, *,
                   limits: Limits = Limits(), isolate: bool = False, hide: Sequence[Path] = (),
                   cell_timeout_s: float = CELL_TIMEOUT_S, scratch_root: Path | None = None) -> ExerciseGrade:
    """Run ``submission``'s code for ``exercise`` in a process of its own and judge its results.
    ``isolate`` runs that process in a sandbox (``sandbox.py``) that shows it only the system's
    libraries, this Python and ``course_lib`` (``hide`` covers paths even inside those): it can read
    only the program the grader wrote of what is graded, write only its private, capped /tmp, and
    report only through a bounded channel. The program's folder is made in ``scratch_root``
    (default: the system's temporary folder), which the caller may hide from every sandbox."""
    program = {"cells": program_cells(submission, exercise.pristine), "tasks": exercise.plain,
               "cell_timeout_s": cell_timeout_s}
    with tempfile.TemporaryDirectory(prefix="grade-", dir=scratch_root) as folder:
        work = Path(folder)
        (work / PROGRAM).write_text(json.dumps(program), encoding="utf-8")
        env = _runner_env(work, isolate)
        if not isolate:
            for sub in ("home", "ipython"):
                (work / sub).mkdir()
        outcome = run_isolated([sys.executable, "-m", "course_lib.grading.runner", str(work)], work, limits,
                               env=env, hide=(*hide, *HIDDEN), isolate=isolate, reveal=REVEAL, readonly_workdir=True,
                               channel_limit=CHANNEL_LIMIT)
    return _judged(learner, exercise, _records(outcome.channel), outcome, limits)


def _judged(learner: str, exercise: PreparedExercise, records: list[dict], outcome, limits: Limits) -> ExerciseGrade:
    outcomes: dict[int, object] = {}
    notes, where, done = [], "", False
    for record in records:
        if isinstance(record.get("start"), str):
            where = record["start"][:100]
        elif isinstance(record.get("cell"), str) and isinstance(record.get("error"), str):
            notes.append(f"{record['cell'][:100]} raised {record['error'][:400]}")
        elif isinstance(record.get("task"), int) and record["task"] not in outcomes:
            outcomes[record["task"]] = (record.get("outcomes") if "outcomes" in record
                                        else "missing" if record.get("missing") is True else None)
        elif record.get("done") is True:
            done = True
            break
    if done:
        status = "graded"
    elif outcome.timed_out:
        status = "timeout"
        notes.insert(0, f"stopped after the {limits.time_s:g} s limit while running {where or 'the start-up'}")
    else:
        status = "crashed"
        notes.insert(0, f"the grading process stopped early (exit code {outcome.returncode}) while running "
                        f"{where or 'the start-up'}: os._exit, a crash, or running out of memory")
    if outcome.channel_overflowed:
        notes.append(f"your code sent more than {CHANNEL_LIMIT // 2**20} MiB of results; the rest was dropped")
    checks = []
    for task, cases, expected in zip(exercise.tasks, exercise.cases, exercise.expected):
        got = outcomes.get(task.number)
        if got == "missing":
            got = {"missing": f"{task.function} is not defined: keep the function name the task gives, and make "
                              "sure its cell runs without an error"}
        elif got is None:
            got = {"missing": notes[0] if status != "graded" else "no results came back for this task"}
        try:
            verdict = judge(task, cases, expected, got)
        except Exception as error:  # noqa: BLE001 - results no judge can read are the learner's, not a grader bug
            checks.append(CheckResult(task.heading, False, f"results that cannot be judged ({type(error).__name__})"))
            continue
        checks.append(CheckResult(task.heading, verdict.passed, verdict.message(), tuple(verdict.report())))
    return ExerciseGrade(learner, exercise.name, status, tuple(checks), tuple(notes))
