"""Rebuild a learner's submission around the pristine exercise, so only the learner's own code counts.

The graded notebook is the pristine exercise, cell for cell, except that each ``student`` cell
is replaced by the learner's version: matched by cell id, or, for learner cells whose ids match
no pristine student cell (ids lost on the way), by order. A student cell the learner deleted is
graded as the starter. Cells the learner added right after a student cell (helpers) come along with
it. Every other cell (instructions, the locked ``setup`` and ``check`` cells) is the pristine
one, whatever the submission holds.
"""

from __future__ import annotations

import copy

import nbformat


def _is_student(cell) -> bool:
    return "student" in cell.metadata.get("tags", [])


def restore_locked_cells(submission: nbformat.NotebookNode, pristine: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The notebook to grade: pristine cells with the learner's student cells (and their helpers)."""
    pristine_ids = {cell.get("id") for cell in pristine.cells}
    # the learner's student cells, each with the unknown cells that follow it
    learner_groups: list[tuple[object, list]] = []
    for cell in submission.cells:
        if _is_student(cell):
            learner_groups.append((cell, []))
        elif learner_groups and cell.get("id") not in pristine_ids:
            learner_groups[-1][1].append(cell)
    by_id = {student.get("id"): (student, extra) for student, extra in learner_groups}
    pristine_student_ids = {cell.get("id") for cell in pristine.cells if _is_student(cell)}
    # groups whose id names no pristine student cell (ids lost on the way) are matched by order
    unmatched = [group for group in learner_groups if group[0].get("id") not in pristine_student_ids]
    graded = copy.deepcopy(pristine)
    cells = []
    for cell in pristine.cells:
        if not _is_student(cell):
            cells.append(copy.deepcopy(cell))
            continue
        match = by_id.get(cell.get("id"))
        if match is None and unmatched:
            match = unmatched.pop(0)
        if match is None:  # the learner deleted it: grade the starter
            cells.append(copy.deepcopy(cell))
            continue
        student, extra = match
        restored = copy.deepcopy(cell)
        restored.source = student.source
        cells.append(restored)
        for helper in extra:
            helper = copy.deepcopy(helper)
            if helper.cell_type == "code":  # runs like a student cell
                helper.outputs, helper.execution_count = [], None
            cells.append(helper)
    graded.cells = cells
    return graded
