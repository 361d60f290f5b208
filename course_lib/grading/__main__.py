"""Command line: ``python -m course_lib.grading NOTEBOOK...`` grades notebooks (``./course grade``).

Each notebook is graded as the cohort grader grades it (``grade.py``): the learner's code runs
in a process of its own (in bubblewrap's sandbox where it works here), and every task's results
are compared by value with the reference's. A notebook is matched to its exercise by name.

The course's own exercise (``exercises/NAME.ipynb`` of the checkout) is never graded: nobody solves
it there, since JupyterLab opens the learner's working copy (``workspace.py``); the command names
that copy instead. A notebook whose cells all equal the course's exercise is graded, with a note
saying that nothing in it has changed yet and where the learner's copy is.

For course authors, ``--build`` re-executes every solution and writes its exercise twin,
and re-executes every lesson, keeping only the outputs the test suite compares."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

from course_lib.grading.execute import execute
from course_lib.grading.exercise import write_exercise
from course_lib.grading.grade import ExerciseGrade, grade_notebook, prepare_exercise
from course_lib.grading.sandbox import sandbox_problem
from course_lib.paths import REPO_ROOT
from course_lib.workspace import default_workdir, sources_hash


def grade_file(notebook: str | Path) -> ExerciseGrade:
    """Grade one notebook file against the exercise of the same name."""
    path = Path(notebook)
    if not path.is_file() or path.suffix != ".ipynb":
        raise FileNotFoundError(f"{notebook} is not a notebook file; pass a path like exercises/01_paging.ipynb "
                                "(from JupyterLab's Terminal, which opens in your working copy).")
    pristine = REPO_ROOT / "exercises" / path.name
    if not pristine.is_file():
        names = ", ".join(p.name for p in sorted((REPO_ROOT / "exercises").glob("*.ipynb")))
        raise FileNotFoundError(f"{path.name} is not the name of an exercise ({names}); keep the exercise's file name.")
    return grade_notebook("you", nbformat.read(path, as_version=4), prepare_exercise(pristine),
                          isolate=sandbox_problem() is None)


def _shown(path: Path) -> str:
    """``path`` as the learner would type it here: relative to the current folder when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path.resolve())


def learners_copy(name: str) -> Path:
    """The working copy's exercise of this file name (``workspace.default_workdir``)."""
    return default_workdir() / "exercises" / name


def course_copy_refusal(notebook: str | Path) -> str | None:
    """Why ``notebook`` is not graded, when it is the checkout's own exercise file; else None."""
    path = Path(notebook)
    pristine = REPO_ROOT / "exercises" / path.name
    if not (path.is_file() and pristine.is_file() and path.resolve() == pristine.resolve()):
        return None
    mine = learners_copy(path.name)
    made = "" if mine.is_file() else " (./course lab makes it)"
    return (f"{_shown(path)} is the course's own copy of the exercise, which stays untouched: JupyterLab opens "
            f"and saves your working copy. Grade yours{made}: ./course grade {_shown(mine)} (in JupyterLab's "
            f"Terminal, which opens in your working copy: ./course grade exercises/{path.name}).")


def unchanged_note(notebook: str | Path) -> str | None:
    """A note when every cell of ``notebook`` equals the course's exercise (its outputs may differ):
    nothing has been solved or saved yet. Names the learner's copy when this is another file."""
    path = Path(notebook)
    if sources_hash(path) != sources_hash(REPO_ROOT / "exercises" / path.name):
        return None
    mine = learners_copy(path.name)
    if mine.is_file() and mine.resolve() != path.resolve():
        return (f"{_shown(path)} is the course's exercise unchanged (every cell as shipped). Your working copy "
                f"is {_shown(mine)}: grade that one with ./course grade {_shown(mine)}.")
    return (f"{_shown(path)} is the course's exercise unchanged (every cell as shipped): fill in the *Your code* "
            "cells and save the notebook in JupyterLab (File > Save Notebook, Ctrl+S) before grading it.")


def build_targets(names: list[str]) -> tuple[list[Path], list[Path]]:
    """The solutions and lessons ``--build`` executes: every one when no name is given; a bare module
    name (``03_scheduler``) picks its solution and its lesson, which share the name; a path picks one
    of them (``solutions/`` or ``exercises/``: the exercise; ``notebooks/``: the lesson). A name that
    matches nothing raises ``ValueError`` naming what exists."""
    solutions = sorted((REPO_ROOT / "solutions").glob("*.ipynb"))
    lessons = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))
    if not names:
        return solutions, lessons
    sides = {"": None, "solutions": "exercise", "exercises": "exercise", "notebooks": "lesson"}
    wanted = set()
    for name in names:
        folder, stem = Path(name).parent.name, Path(name).stem
        if folder not in sides or not any(p.stem == stem for p in solutions + lessons):
            raise ValueError(f"--build {name}: name a module (e.g. 03_scheduler), solutions/NAME.ipynb or "
                             f"notebooks/NAME.ipynb; the modules are {', '.join(p.stem for p in lessons)}.")
        wanted.add((stem, sides[folder]))

    def chosen(path: Path, side: str) -> bool:
        return (path.stem, side) in wanted or (path.stem, None) in wanted

    return [s for s in solutions if chosen(s, "exercise")], [lesson for lesson in lessons if chosen(lesson, "lesson")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="course grade", description=__doc__)
    parser.add_argument("notebooks", nargs="*", help="notebooks to grade, e.g. exercises/01_paging.ipynb")
    parser.add_argument("--build", action="store_true",
                        help="execute solutions/ and notebooks/, and write exercises/ from the solutions; with "
                             "modules named (03_scheduler), build only those; solutions/NAME.ipynb builds only the "
                             "exercise, notebooks/NAME.ipynb only the lesson")
    args = parser.parse_args(argv)
    if args.build:
        try:
            solutions, lessons = build_targets(args.notebooks)
        except ValueError as error:
            parser.error(str(error))
        for solution in solutions:
            execute(solution, keep_all_outputs=True)
            exercise = write_exercise(solution, REPO_ROOT / "exercises" / solution.name)
            print("executed", solution.relative_to(REPO_ROOT), "and wrote", exercise.relative_to(REPO_ROOT))
        for lesson in lessons:
            execute(lesson, keep_all_outputs=False)
            print("executed", lesson.relative_to(REPO_ROOT))
        return 0
    if not args.notebooks:
        parser.error("name at least one notebook to grade, e.g. exercises/01_paging.ipynb")
    failed = 0
    for notebook in args.notebooks:
        print(f"== Grading {notebook}", flush=True)
        refusal = course_copy_refusal(notebook)
        if refusal:
            print(f"{refusal}\n== {notebook}: not graded", flush=True)
            failed += 1
            continue
        try:
            result = grade_file(notebook)
        except FileNotFoundError as error:
            print(error, flush=True)
            failed += 1
            continue
        if result.status != "graded":
            print(f"status: {result.status}")
        for check in result.checks:
            print("\n".join(check.details or (f"{check.name}: FAIL: {check.message}",)))
        for note in (*result.notes, unchanged_note(notebook)):
            if note:
                print(f"note: {note}")
        passed = result.status == "graded" and result.score == len(result.checks)
        print(f"== {notebook}: {result.score}/{len(result.checks)} tasks, {'PASS' if passed else 'FAIL'}", flush=True)
        failed += not passed
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
