"""Grade a cohort: ``python -m course_lib.grading.cohort SUBMISSIONS --out GRADEBOOK``.

SUBMISSIONS holds one folder per learner, each with that learner's exercise notebooks (named
as in ``exercises/``) and optionally exported quiz scorecards (``*.json``). Every notebook is
rebuilt around the pristine exercise (``restore.py``), then run by the same strict nbval grader
as ``./course grade``, in its own process group with a wall-clock limit and a memory limit.
Nothing a submission does (an infinite loop, a crashing kernel, a file that is not a
notebook) stops the run; each gets a status:

  graded          ran; each check passed or failed
  timeout         the whole notebook passed the time limit; it was stopped
  kernel crashed  the kernel died or stopped answering (os._exit, out of memory, stuck in native code)
  grader error    pytest itself stopped abnormally (its exit code is reported)
  malformed       not a readable notebook
  missing         the learner handed nothing in for this exercise
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import nbformat

from course_lib.grading.grade import grade_command
from course_lib.grading.gradebook import collect_quizzes, write_gradebook
from course_lib.grading.restore import restore_locked_cells
from course_lib.paths import REPO_ROOT

ANSI = re.compile(r"(\x1b|#x1B)\[[0-9;]*m")  # junit XML writes ESC as "#x1B"


@dataclass(frozen=True)
class CheckResult:
    name: str  # the task heading above the check cell
    passed: bool
    message: str = ""  # why it failed, in one line


@dataclass(frozen=True)
class ExerciseGrade:
    learner: str
    exercise: str
    status: str
    checks: tuple[CheckResult, ...]

    @property
    def score(self) -> int:
        return sum(check.passed for check in self.checks)


def check_cells(pristine: nbformat.NotebookNode) -> list[tuple[str, str]]:
    """(cell id, name) of each check cell; the name is the nearest heading above it."""
    checks, heading = [], ""
    for cell in pristine.cells:
        if cell.cell_type == "markdown":
            titles = [line.lstrip("#").strip() for line in cell.source.splitlines() if line.startswith("#")]
            heading = titles[-1] if titles else heading
        elif "check" in cell.metadata.get("tags", []):
            checks.append((cell.get("id"), heading or f"check {len(checks) + 1}"))
    return checks


def code_cell_index(book: nbformat.NotebookNode) -> dict[str, int]:
    """Cell id -> position among code cells: how nbval names its tests ("Cell N")."""
    return {cell.get("id"): index for index, cell in enumerate(c for c in book.cells if c.cell_type == "code")}


def _outcomes(junit: Path) -> dict[int, str]:
    """Code-cell index -> "" for every cell that passed, or a one-line reason for every cell that
    failed or was skipped (nbval skips the cell after a timeout, expecting it to fail)."""
    outcomes = {}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        match = re.search(r"Cell (\d+)", case.get("name", ""))
        if not match:
            continue
        problem = next((case.find(tag) for tag in ("failure", "error", "skipped") if case.find(tag) is not None), None)
        if problem is None:
            outcomes[int(match.group(1))] = ""
            continue
        text = ANSI.sub("", (problem.get("message") or "") + "\n" + (problem.text or ""))
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        timeouts = [line for line in lines if re.match(r"^Cell \d+: Timeout|^Previous", line)]
        errors = [line for line in lines if re.match(r"^\w*(Error|Exception)\b", line)]
        reason = timeouts[0] if timeouts else (errors or lines or ["failed"])[-1]
        outcomes[int(match.group(1))] = re.sub(r"^Cell \d+: ", "", reason)[:300] or "failed"
    return outcomes


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc), including kernels started in their own session."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, frontier = [], [pid]
    while frontier:
        below = children.get(frontier.pop(), [])
        found += below
        frontier += below
    return found


def _limit_memory(limit_bytes: int) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
    return apply


def grade_submission(learner: str, submission: Path, pristine_path: Path, time_limit_s: float = 600,
                     memory_limit_bytes: int = 8 * 2**30, cell_timeout_s: int = 120) -> ExerciseGrade:
    """Grade one notebook of one learner against the pristine exercise at ``pristine_path``."""
    exercise = pristine_path.stem
    pristine = nbformat.read(pristine_path, as_version=4)
    checks = check_cells(pristine)

    def every_check(status: str, message: str) -> ExerciseGrade:
        return ExerciseGrade(learner, exercise, status, tuple(CheckResult(name, False, message) for _, name in checks))

    if not submission.is_file():
        return every_check("missing", "not handed in")
    try:
        book = nbformat.read(submission, as_version=4)
        nbformat.validate(book)
    except Exception as error:  # noqa: BLE001 - any unreadable file is "malformed"
        return every_check("malformed", f"not a readable notebook ({type(error).__name__})")
    with tempfile.TemporaryDirectory(prefix="cohort-") as work:
        graded = Path(work) / f"{exercise}.ipynb"
        graded_book = restore_locked_cells(book, pristine)
        nbformat.write(graded_book, graded)
        junit = Path(work) / "report.xml"
        command = grade_command(graded, cell_timeout_s) + ["--junitxml", str(junit)]
        process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   start_new_session=True, preexec_fn=_limit_memory(memory_limit_bytes))
        try:
            process.wait(timeout=time_limit_s)
        except subprocess.TimeoutExpired:
            for pid in _descendants(process.pid):  # the kernel runs in a session of its own
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return every_check("timeout", f"stopped after the {time_limit_s:g} s limit")
        if process.returncode not in (0, 1) or not junit.is_file():  # 0: all passed, 1: some failed
            return every_check("grader error", f"the grader stopped with exit code {process.returncode}")
        outcomes = _outcomes(junit)
        position = code_cell_index(graded_book)
    results = tuple(CheckResult(name, outcomes.get(position.get(cell_id, -1)) == "",
                                outcomes.get(position.get(cell_id, -1), "did not run"))
                    for cell_id, name in checks)
    crashed = any(re.search(r"DeadKernel|Kernel died|Failed to interrupt kernel", reason, re.I)
                  for reason in outcomes.values())
    return ExerciseGrade(learner, exercise, "kernel crashed" if crashed else "graded", results)


def grade_cohort(submissions: Path, exercises: list[Path], on_progress: Callable[[int, int, ExerciseGrade], None],
                 **limits) -> list[ExerciseGrade]:
    """Grade every learner folder in ``submissions`` (sorted) on every exercise (sorted)."""
    learners = sorted(p for p in submissions.iterdir() if p.is_dir())
    if not learners:
        raise FileNotFoundError(f"{submissions} holds no learner folders; put each learner's notebooks in "
                                "SUBMISSIONS/<learner>/.")
    grades, total = [], len(learners) * len(exercises)
    for learner in learners:
        for pristine in sorted(exercises):
            grade = grade_submission(learner.name, learner / pristine.name, pristine, **limits)
            grades.append(grade)
            on_progress(len(grades), total, grade)
    return grades


def _progress(done: int, total: int, grade: ExerciseGrade) -> None:
    width = 30
    bar = "#" * (width * done // total) + "-" * (width - width * done // total)
    print(f"[{bar}] {done}/{total}  {grade.learner} / {grade.exercise}: {grade.status}, "
          f"{grade.score}/{len(grade.checks)} checks", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="course grade-cohort", description=__doc__.splitlines()[0])
    parser.add_argument("submissions", type=Path, help="folder with one sub-folder of notebooks per learner")
    parser.add_argument("--out", type=Path, default=Path("gradebook"), help="where to write the gradebook")
    parser.add_argument("--exercise", action="append", help="grade only these exercises (e.g. 01_paging)")
    parser.add_argument("--time-limit", type=float, default=600, help="seconds per notebook (default 600)")
    parser.add_argument("--cell-timeout", type=int, default=120, help="seconds per cell (default 120)")
    parser.add_argument("--memory-limit-gb", type=float, default=8, help="address space per notebook (default 8)")
    args = parser.parse_args(argv)
    exercises = sorted((REPO_ROOT / "exercises").glob("*.ipynb"))
    if args.exercise:
        exercises = [e for e in exercises if e.stem in set(args.exercise)]
        if not exercises:
            parser.error(f"no exercise named {args.exercise}; see exercises/ for the names.")
    grades = grade_cohort(args.submissions, exercises, _progress, time_limit_s=args.time_limit,
                          memory_limit_bytes=int(args.memory_limit_gb * 2**30), cell_timeout_s=args.cell_timeout)
    written = write_gradebook(grades, collect_quizzes(args.submissions), args.out)
    print("wrote", ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
