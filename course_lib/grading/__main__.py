"""Command line: ``python -m course_lib.grading NOTEBOOK...`` grades notebooks (``./course grade``).

Each notebook is graded as the cohort grader grades it (``grade.py``): the learner's code runs
in a process of its own (in bubblewrap's sandbox where it works here), and every task's results
are compared by value with the reference's. A notebook is matched to its exercise by name
(``exercise_files``: ``04_roofline_exercise.ipynb`` is module 04_roofline's); the exercise's old name,
``04_roofline.ipynb``, which working copies made before the rename may still hold, is graded as that
module, with a note giving the new name.

The course's own exercise (``exercises/NN_name_exercise.ipynb`` of the checkout) is never graded: nobody solves
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

from course_lib.exercise_files import SOLUTION, course_exercise, exercise_file, exercise_modules, module_of
from course_lib.grading.execute import execute
from course_lib.grading.exercise import write_exercise
from course_lib.grading.grade import ExerciseGrade, grade_notebook, prepare_exercise
from course_lib.grading.sandbox import sandbox_problem
from course_lib.paths import REPO_ROOT
from course_lib.workspace import default_workdir, sources_hash


def exercise_module(path: Path) -> str | None:
    """The module whose exercise ``path`` is, by its file name: an exercise's or a solution's
    (``04_roofline_exercise.ipynb``, ``04_roofline_solution.ipynb``), or the exercise's old name
    (``04_roofline.ipynb``) anywhere but in a ``notebooks/`` folder, where that name is the lesson's.
    None when it names no module with an exercise."""
    module = module_of(path.name) or (path.stem if path.parent.name != "notebooks" else None)
    return module if module and course_exercise(module).is_file() else None


def grade_file(notebook: str | Path) -> ExerciseGrade:
    """Grade one notebook file against its module's exercise (``exercise_module``)."""
    path = Path(notebook)
    renamed = path.with_name(exercise_file(path.stem)) if path.suffix == ".ipynb" else path
    if not path.is_file() and renamed.is_file():
        raise FileNotFoundError(f"{notebook} is not there: the exercise is now named {renamed.name}; "
                                f"grade it with ./course grade {_shown(renamed)}")
    if not path.is_file() or path.suffix != ".ipynb":
        raise FileNotFoundError(f"{notebook} is not a notebook file; pass a path like "
                                "exercises/01_paging_exercise.ipynb (from JupyterLab's Terminal, which opens in your "
                                "working copy).")
    module = exercise_module(path)
    if module is None:
        names = ", ".join(map(exercise_file, exercise_modules()))
        lesson = f"; {path.name} is a lesson, its exercise is exercises/{exercise_file(path.stem)}" \
            if course_exercise(path.stem).is_file() else ""
        raise FileNotFoundError(f"{path.name} is not the name of an exercise ({names}){lesson}; keep the exercise's "
                                "file name.")
    return grade_notebook("you", nbformat.read(path, as_version=4), prepare_exercise(course_exercise(module)),
                          isolate=sandbox_problem() is None)


def _shown(path: Path) -> str:
    """``path`` as the learner would type it here: relative to the current folder when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path.resolve())


def learners_copy(module: str) -> Path:
    """The working copy's exercise of ``module`` (``workspace.default_workdir``)."""
    return default_workdir() / "exercises" / exercise_file(module)


def course_copy_refusal(notebook: str | Path) -> str | None:
    """Why ``notebook`` is not graded, when it is the checkout's own exercise file; else None."""
    path = Path(notebook)
    module = exercise_module(path) if path.is_file() else None
    if module is None or path.resolve() != course_exercise(module).resolve():
        return None
    mine = learners_copy(module)
    made = "" if mine.is_file() else " (./course lab makes it)"
    return (f"{_shown(path)} is the course's own copy of the exercise, which stays untouched: JupyterLab opens "
            f"and saves your working copy. Grade yours{made}: ./course grade {_shown(mine)} (in JupyterLab's "
            f"Terminal, which opens in your working copy: ./course grade exercises/{mine.name}).")


def renamed_note(notebook: str | Path) -> str | None:
    """A note when ``notebook`` has its exercise's old name (``04_roofline.ipynb``): the new name, and
    which file counts when the new one is beside it; else None."""
    path = Path(notebook)
    module = exercise_module(path)
    if module is None or module_of(path.name) is not None:
        return None
    new = path.with_name(exercise_file(module))
    if new.is_file():
        return (f"{_shown(path)} has the exercise's old name and was graded as module {module}. {_shown(new)}, its "
                "new name, is beside it: that is the file your course collects and grades, so move your work there.")
    return (f"{_shown(path)} has the exercise's old name and was graded as module {module}. The exercise is now "
            f"{new.name}: ./course refresh renames the one in your working copy, keeping your edits.")


def unchanged_note(notebook: str | Path) -> str | None:
    """A note when every cell of ``notebook`` equals the course's exercise (its outputs may differ):
    nothing has been solved or saved yet. Names the learner's copy when this is another file."""
    path = Path(notebook)
    module = exercise_module(path)
    if module is None or sources_hash(path) != sources_hash(course_exercise(module)):
        return None
    mine = learners_copy(module)
    if mine.is_file() and mine.resolve() != path.resolve():
        return (f"{_shown(path)} is the course's exercise unchanged (every cell as shipped). Your working copy "
                f"is {_shown(mine)}: grade that one with ./course grade {_shown(mine)}.")
    return (f"{_shown(path)} is the course's exercise unchanged (every cell as shipped): fill in the *Your code* "
            "cells and save the notebook in JupyterLab (File > Save Notebook, Ctrl+S) before grading it.")


def build_targets(names: list[str]) -> tuple[list[Path], list[Path]]:
    """The solutions and lessons ``--build`` executes: every one when no name is given; a bare module
    id (``03_scheduler``) picks its solution and its lesson; a path picks one of them (``solutions/`` or
    ``exercises/``: the exercise; ``notebooks/``: the lesson). A name that matches nothing raises
    ``ValueError`` naming what exists."""
    solutions = {module_of(path.name, SOLUTION): path for path in sorted((REPO_ROOT / "solutions").glob("*.ipynb"))}
    lessons = {path.stem: path for path in sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))}
    if not names:
        return list(solutions.values()), list(lessons.values())
    sides = {"": None, "solutions": "exercise", "exercises": "exercise", "notebooks": "lesson"}
    wanted = set()
    for name in names:
        folder, module = Path(name).parent.name, module_of(Path(name).name) or Path(name).stem
        if folder not in sides or module not in {**solutions, **lessons}:
            raise ValueError(f"--build {name}: name a module (e.g. 03_scheduler), solutions/NAME_solution.ipynb or "
                             f"notebooks/NAME.ipynb; the modules are {', '.join(lessons)}.")
        wanted.add((module, sides[folder]))

    def chosen(module: str, side: str) -> bool:
        return (module, side) in wanted or (module, None) in wanted

    return ([path for module, path in solutions.items() if chosen(module, "exercise")],
            [path for module, path in lessons.items() if chosen(module, "lesson")])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="course grade", description=__doc__)
    parser.add_argument("notebooks", nargs="*", help="notebooks to grade, e.g. exercises/01_paging_exercise.ipynb")
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
            exercise = write_exercise(solution, course_exercise(module_of(solution.name, SOLUTION)))
            print("executed", solution.relative_to(REPO_ROOT), "and wrote", exercise.relative_to(REPO_ROOT))
        for lesson in lessons:
            execute(lesson, keep_all_outputs=False)
            print("executed", lesson.relative_to(REPO_ROOT))
        return 0
    if not args.notebooks:
        parser.error("name at least one notebook to grade, e.g. exercises/01_paging_exercise.ipynb")
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
        for note in (renamed_note(notebook), *result.notes, unchanged_note(notebook)):
            if note:
                print(f"note: {note}")
        passed = result.status == "graded" and result.score == len(result.checks)
        print(f"== {notebook}: {result.score}/{len(result.checks)} tasks, {'PASS' if passed else 'FAIL'}", flush=True)
        failed += not passed
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
