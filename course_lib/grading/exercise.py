"""Build an exercise notebook from its solution, so the two can never drift apart.

In a solution notebook:
  * a cell tagged ``student`` holds the learner's task; the code between the lines
    ``### BEGIN SOLUTION`` and ``### END SOLUTION`` is replaced in the exercise by a
    ``raise NotImplementedError`` at the same indentation, and its outputs are cleared;
  * every code cell starts without outputs (a check cell shows its verdict once the learner runs it);
  * cells tagged ``check`` or ``setup`` are locked (not editable, not deletable).
What a check cell runs, and what the graders compare, is in ``course_lib/grading/checks/``.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import nbformat

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
LOCKED_TAGS = {"check", "setup"}
_TODO = 'raise NotImplementedError("Your code here: replace this line (see the task above).")'


def strip_solution(source: str, where: str = "cell") -> str:
    """Replace each BEGIN/END SOLUTION region of ``source`` with a NotImplementedError line."""
    out, inside, indent = [], False, ""
    for line in source.splitlines():
        stripped = line.strip()
        if stripped == BEGIN:
            if inside:
                raise ValueError(f"{where}: '{BEGIN}' opened twice; close the first region with '{END}'.")
            inside, indent = True, re.match(r"\s*", line).group(0)
            out.append(indent + _TODO)
        elif stripped == END:
            if not inside:
                raise ValueError(f"{where}: '{END}' without a matching '{BEGIN}'.")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"{where}: '{BEGIN}' is never closed; add '{END}'.")
    return "\n".join(out)


def make_exercise(solution: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The starter twin of an executed solution notebook."""
    exercise = copy.deepcopy(solution)
    for index, cell in enumerate(exercise.cells):
        tags = set(cell.metadata.get("tags", []))
        if cell.cell_type != "code":
            continue
        if "student" in tags:
            if BEGIN not in cell.source:
                raise ValueError(f"cell {index}: a student cell needs a '{BEGIN}' region.")
            cell.source = strip_solution(cell.source, f"cell {index}")
        cell.outputs, cell.execution_count = [], None
        if tags & LOCKED_TAGS:
            cell.metadata["editable"] = False
            cell.metadata["deletable"] = False
    return exercise


def write_exercise(solution_path: str | Path, exercise_path: str | Path) -> Path:
    """Read a solution notebook, write its exercise twin; return the exercise path."""
    solution = nbformat.read(solution_path, as_version=4)
    exercise_path = Path(exercise_path)
    nbformat.write(make_exercise(solution), exercise_path)
    return exercise_path
