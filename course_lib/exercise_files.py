"""The file names of a module's exercise and solution notebooks, from the module's id and back.

A module is known everywhere by its id, ``04_roofline``: its lesson ``notebooks/04_roofline.ipynb``,
its quiz bank, the graders' task tables, ``grades.csv`` and the outline. Its exercise is
``exercises/04_roofline_exercise.ipynb`` and its solution ``solutions/04_roofline_solution.ipynb``, so
that JupyterLab's tabs, which show only a file's name, tell lesson, exercise and solution apart.

Exercises were once named like their lessons (``exercises/04_roofline.ipynb``): working copies and
hand-ins made then still hold that name, which ``old_exercise_file`` gives so that each reader
can still find them.
"""

from __future__ import annotations

from pathlib import Path

from course_lib.paths import REPO_ROOT

EXERCISE, SOLUTION = "exercise", "solution"
SUFFIXES = {EXERCISE: f"_{EXERCISE}.ipynb", SOLUTION: f"_{SOLUTION}.ipynb"}


def exercise_file(module: str) -> str:
    """``04_roofline`` -> ``04_roofline_exercise.ipynb``."""
    return module + SUFFIXES[EXERCISE]


def solution_file(module: str) -> str:
    """``04_roofline`` -> ``04_roofline_solution.ipynb``."""
    return module + SUFFIXES[SOLUTION]


def old_exercise_file(module: str) -> str:
    """The exercise's name before it had its own: ``04_roofline`` -> ``04_roofline.ipynb``."""
    return f"{module}.ipynb"


def module_of(file_name: str, kind: str | None = None) -> str | None:
    """The module id in an exercise's or a solution's file name (only ``kind``'s, when given):
    ``04_roofline_exercise.ipynb`` -> ``04_roofline``; None for any other name (an old name too)."""
    for suffix in [SUFFIXES[kind]] if kind else SUFFIXES.values():
        module = file_name.removesuffix(suffix)
        if module != file_name and module:
            return module
    return None


def course_exercise(module: str) -> Path:
    """The course's own exercise of ``module``: the checkout's ``exercises/04_roofline_exercise.ipynb``."""
    return REPO_ROOT / "exercises" / exercise_file(module)


def exercise_modules(course_root: Path = REPO_ROOT) -> list[str]:
    """The ids of the modules with an exercise in ``course_root/exercises/``, in order."""
    names = (path.name for path in (course_root / "exercises").glob("*.ipynb"))
    return sorted(filter(None, (module_of(name, EXERCISE) for name in names)))
