"""Grade a cohort: ``python -m course_lib.grading.cohort SUBMISSIONS --out GRADEBOOK [--jobs N]``.

SUBMISSIONS holds one folder per learner, each with that learner's exercise notebooks (named
as in ``exercises/``: ``04_roofline_exercise.ipynb``; a notebook under the exercise's old name,
``04_roofline.ipynb``, is graded when the new name is absent, and the learner's feedback says which
one counted when both are there) and optionally exported quiz scorecards (``*.json``). The pristine
exercises are read, and every expected value computed, before any learner code runs; nothing
is re-read from the checkout afterwards. Each notebook is then graded as ``./course grade``
does (``grade.py``), in a sandbox of its own (``sandbox.py``: its own PID namespace, no network,
a read-only allow-list of the machine: the system's libraries, this Python and ``course_lib``,
never the submissions, the gradebook or the rest of the checkout; a time and a
memory limit), up to ``--jobs`` at a time. Files a learner hands in are data, never paths to
follow. Nothing a submission does stops the run; each gets a status:

  graded          ran; each task passed or failed on its cases
  timeout         the whole notebook passed the time limit; it was stopped
  crashed         the learner's process died (os._exit, a native crash, out of memory)
                  (after a timeout or a crash, tasks whose results had come back still count)
  refused         a symbolic link (or a learner folder that is one): hand in the file itself
  malformed       not a readable notebook
  missing         the learner handed nothing in for this exercise
  grader error    the grader itself failed on this submission (a bug to report; the run goes on)

The gradebook also gets a similarity report (``similarity.py``): answers identical or nearly so,
after normalising names, layout and comments, to the course solution or to another learner's.

``--jobs`` and ``--memory-limit-gb`` (the address space of each process of a notebook) default to
what the machine holds (``capacity.py``): one job per core, and the memory available when the run
starts, less 1 GiB for the grader and the system, shared by the jobs (each also counting its 1 GiB
of tmpfs), at most 8 GiB per notebook; a pair that could take more than is available is refused,
with one that fits. Measured with ``cohort_benchmark.py`` (30 synthetic learners x 9 exercises, 270
notebooks, on 2 cores and 24 GiB shared with other work; see the README): grading waits more than it
computes (sandboxes and ranks starting), so wall time falls with ``--jobs`` even past the core
count, while the process tree stays near 1 GiB of PSS.

Without bubblewrap the run refuses to start, unless ``--no-sandbox`` accepts grading with
only a process group and limits, which a hostile submission can escape (it warns loudly).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import stat
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Callable

import nbformat

from course_lib.exercise_files import course_exercise, exercise_file, exercise_modules, old_exercise_file
from course_lib.grading.capacity import choose_capacity, cpu_count, memory_available_bytes
from course_lib.grading.grade import ExerciseGrade, PreparedExercise, grade_notebook, prepare_exercise
from course_lib.grading.gradebook import write_gradebook
from course_lib.grading.quizzes import collect_quizzes, load_banks
from course_lib.grading.sandbox import Limits, sandbox_problem
from course_lib.grading.similarity import compare_cohort, load_solutions

MAX_NOTEBOOK_BYTES = 32 * 2**20
SKIPPED = {"__MACOSX"}  # folders an archive tool adds (and any starting with a dot): not learners
NO_SANDBOX_WARNING = ("WARNING: grading WITHOUT a sandbox (--no-sandbox). A hostile submission can outlive its "
                      "run, signal the grader, read other submissions and rewrite the gradebook. Use it only for "
                      "notebooks you trust.")


def read_submission(path: Path) -> nbformat.NotebookNode | tuple[str, str]:
    """The notebook at ``path``, read as data; or (status, message) when it cannot be graded."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return "missing", "not handed in"
    if stat.S_ISLNK(info.st_mode):
        return "refused", "a symbolic link; hand in the notebook file itself"
    if not stat.S_ISREG(info.st_mode):
        return "malformed", "not a regular file"
    if info.st_size > MAX_NOTEBOOK_BYTES:
        return "malformed", f"larger than {MAX_NOTEBOOK_BYTES // 2**20} MiB"
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(descriptor, "rb") as handle:
            book = nbformat.reads(handle.read(MAX_NOTEBOOK_BYTES + 1).decode("utf-8"), as_version=4)
        nbformat.validate(book)
    except Exception as error:  # noqa: BLE001 - any unreadable file is "malformed"
        return "malformed", f"not a readable notebook ({type(error).__name__})"
    return book


def submission_file(learner: Path, module: str) -> tuple[str, str | None]:
    """The file name of ``learner``'s notebook for ``module``, and a note for their feedback: the
    exercise's name when it is there (noting an old-name copy beside it, which is not graded), else the
    old name when that one is there, else the exercise's name (then missing). Nothing is followed."""
    new, old = exercise_file(module), old_exercise_file(module)
    if os.path.lexists(learner / new):
        return new, (f"{new} was graded; {old}, the exercise's old name, was handed in too and not graded"
                     if os.path.lexists(learner / old) else None)
    if os.path.lexists(learner / old):
        return old, f"{old}, the exercise's old name, was graded (the exercise is now {new})"
    return new, None


def grade_submission(learner: Path, exercise: PreparedExercise, *, limits: Limits, isolate: bool,
                     hide: list[Path], cell_timeout_s: float, scratch_root: Path | None = None) -> ExerciseGrade:
    """Grade one learner's notebook for one exercise (``submission_file``); never raises."""
    try:
        if os.path.islink(learner):
            return exercise.every_check(learner.name, "refused", "the learner folder is a symbolic link")
        name, note = submission_file(learner, exercise.name)
        book = read_submission(learner / name)
        if isinstance(book, tuple):
            grade = exercise.every_check(learner.name, *book)
        else:
            grade = grade_notebook(learner.name, book, exercise, limits=limits, isolate=isolate, hide=hide,
                                   cell_timeout_s=cell_timeout_s, scratch_root=scratch_root)
        return dataclasses.replace(grade, notes=(note, *grade.notes)) if note else grade
    except Exception as error:  # noqa: BLE001 - one submission must never end the run
        return exercise.every_check(learner.name, "grader error", f"{type(error).__name__}: {error}"[:300])


def graded_notebooks(submissions: Path) -> Callable[[str, str], nbformat.NotebookNode | None]:
    """``read(learner, module)``: the notebook of ``learner`` that is graded for ``module``, read as
    data as ``grade_submission`` reads it, or None where it has none (missing, refused, malformed)."""
    def read(learner: str, module: str) -> nbformat.NotebookNode | None:
        folder = submissions / learner
        if os.path.islink(folder):
            return None
        book = read_submission(folder / submission_file(folder, module)[0])
        return None if isinstance(book, tuple) else book
    return read


def grade_cohort(submissions: Path, exercises: list[PreparedExercise],
                 on_progress: Callable[[int, int, ExerciseGrade], None], *, jobs: int = 1, out: Path | None = None,
                 limits: Limits = Limits(), isolate: bool = True, cell_timeout_s: float = 120) -> list[ExerciseGrade]:
    """Grade every learner folder of ``submissions`` on every exercise, ``jobs`` at a time; the
    grades come back sorted by learner, then exercise, whatever order they finished in."""
    learners = sorted(p for p in submissions.iterdir()
                      if (p.is_dir() or p.is_symlink()) and not p.name.startswith(".") and p.name not in SKIPPED)
    if not learners:
        raise FileNotFoundError(f"{submissions} holds no learner folders; put each learner's notebooks in "
                                "SUBMISSIONS/<learner>/.")
    work = [(learner, exercise) for learner in learners for exercise in exercises]
    grades, lock = [], threading.Lock()
    with tempfile.TemporaryDirectory(prefix="course-grading-") as scratch, \
            ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        # Out of every sandbox's sight already (not on its allow-list); hidden by name as well, in case one lies
        # inside a path the sandbox shows: every submission, the gradebook, the other runs' folders, the grader's home
        home = [Path.home()] if Path.home().resolve() != Path("/") else []
        hide = [submissions.resolve(), Path(scratch), *home] + ([out.resolve()] if out is not None else [])
        futures = [pool.submit(grade_submission, learner, exercise, limits=limits, isolate=isolate, hide=hide,
                               cell_timeout_s=cell_timeout_s, scratch_root=Path(scratch))
                   for learner, exercise in work]
        for future in as_completed(futures):
            with lock:
                grades.append(future.result())
                on_progress(len(grades), len(work), grades[-1])
    return sorted(grades, key=lambda g: (g.learner, g.exercise))


def _progress(done: int, total: int, grade: ExerciseGrade) -> None:
    width = 30
    bar = "#" * (width * done // total) + "-" * (width - width * done // total)
    print(f"[{bar}] {done}/{total}  {grade.learner} / {grade.exercise}: {grade.status}, "
          f"{grade.score}/{len(grade.checks)} tasks", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="course grade-cohort", description=__doc__.splitlines()[0])
    parser.add_argument("submissions", type=Path, help="folder with one sub-folder of notebooks per learner")
    parser.add_argument("--out", type=Path, default=Path("gradebook"), help="where to write the gradebook")
    parser.add_argument("--exercise", action="append", help="grade only these modules' exercises (e.g. 01_paging)")
    parser.add_argument("--jobs", type=int, help="submissions graded at once, one sandbox each (default: one per "
                        "core, fewer where the available memory cannot give each 2 GiB; see capacity.py)")
    parser.add_argument("--time-limit", type=float, default=600, help="seconds per notebook (default 600)")
    parser.add_argument("--cell-timeout", type=float, default=120, help="seconds per cell (default 120)")
    parser.add_argument("--memory-limit-gb", type=float,
                        help="address space per notebook (default: the available memory, less 1 GiB, shared by the "
                             "jobs, at most 8); refused where --jobs of them could take more than is available")
    parser.add_argument("--no-sandbox", action="store_true",
                        help="grade without bubblewrap (unsafe: only for submissions you trust)")
    args = parser.parse_args(argv)
    if not args.submissions.is_dir():
        parser.error(f"{args.submissions} is not a folder; pass the folder holding one sub-folder per learner "
                     "(python -m course_lib.grading.collect writes one from the hub's homes)")
    problem = sandbox_problem()
    if problem and not args.no_sandbox:
        parser.exit(2, f"course grade-cohort: cannot sandbox submissions: {problem}\nInstall bubblewrap, or pass "
                       "--no-sandbox to grade notebooks you trust without one.\n")
    if args.no_sandbox:
        print(NO_SANDBOX_WARNING, file=sys.stderr, flush=True)
    try:
        capacity = choose_capacity(memory_available_bytes(), cpu_count(), args.jobs,
                                   None if args.memory_limit_gb is None else int(args.memory_limit_gb * 2**30))
    except ValueError as error:  # Oversubscribed says what fits; --jobs 0
        parser.exit(2, f"course grade-cohort: {error}\n")
    print(f"Grading {capacity.describe()}.", flush=True)
    modules = exercise_modules()
    if args.exercise:
        unknown = sorted(set(args.exercise) - set(modules))
        if unknown:
            parser.error(f"--exercise {', '.join(unknown)}: no such module; the modules are {', '.join(modules)}.")
        modules = [module for module in modules if module in args.exercise]
    paths = [course_exercise(module) for module in modules]
    print(f"Preparing {len(paths)} exercise(s): reading them and computing the expected values...", flush=True)
    exercises = [prepare_exercise(path) for path in paths]
    banks = load_banks()
    solutions = load_solutions(modules)  # the course's answers, for the similarity report
    limits = Limits(time_s=args.time_limit, memory_bytes=capacity.memory_bytes)
    grades = grade_cohort(args.submissions, exercises, _progress, jobs=capacity.jobs, out=args.out, limits=limits,
                          isolate=not args.no_sandbox, cell_timeout_s=args.cell_timeout)
    try:
        report = compare_cohort({grade.learner for grade in grades}, exercises, solutions,
                                graded_notebooks(args.submissions))
    except Exception as error:  # noqa: BLE001 - a failed report must not cost the grades
        report = None
        print(f"course grade-cohort: no similarity report ({type(error).__name__}: {error})", file=sys.stderr)
    written = write_gradebook(grades, collect_quizzes(args.submissions, banks), args.out,
                              warning=NO_SANDBOX_WARNING if args.no_sandbox else "", similarity=report)
    feedback = sum(Path(path).parent.name == "feedback" for path in written if path is not None)
    print(f"wrote {args.out}/grades.csv, {args.out}/summary.html and {feedback} feedback files in "
          f"{args.out}/feedback/")
    if report is not None:
        print(f"wrote {args.out}/similarity.html and similarity.csv: {len(report.flagged)} pair(s) of answers "
              "flagged as alike (evidence for a conversation, not proof)")
    if args.no_sandbox:
        print(NO_SANDBOX_WARNING, file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
