"""Rebuild a learner's submission around the pristine exercise, so only the learner's own code counts.

The graded notebook is the pristine exercise, cell for cell, with:

* each ``student`` cell replaced by the learner's version, matched by cell id (a cell whose id
  is a pristine student cell's is the learner's version, whatever its tags); a ``student`` cell
  with an unknown id takes the place of the next pristine student cell the submission lacks (ids
  lost on the way, or a cell copied and its original deleted). When no cell id of the submission
  is the pristine notebook's, the copies of set-up, check and text cells are passed over;
* every cell the learner added (an id the pristine notebook does not have: a helper, an extra
  import, a copy of a *Your code* cell) kept, right after the pristine cell it followed in the
  submission, so it runs where the learner ran it (a copied cell after its original, so the
  later definition wins, as in the kernel). Cells added above every pristine cell run just
  before the first *Your code* cell, after the set-up. Added cells are tagged ``ADDED_TAG``;
* a student cell the learner deleted graded as the starter, placed before every cell the learner
  wrote, so it never replaces a definition they moved elsewhere;
* every other cell (instructions, the locked ``setup`` and ``check`` cells) the pristine one,
  whatever the submission holds.
"""

from __future__ import annotations

import copy
from collections import defaultdict

import nbformat

ADDED_TAG = "learner-added"


def _is_student(cell) -> bool:
    return "student" in cell.metadata.get("tags", [])


def restore_locked_cells(submission: nbformat.NotebookNode, pristine: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The notebook to grade: the pristine cells, the learner's student cells and the cells they added."""
    pristine_ids = {cell.get("id") for cell in pristine.cells}
    pristine_students = [cell.get("id") for cell in pristine.cells if _is_student(cell)]
    ids_lost = not any(cell.get("id") in pristine_ids for cell in submission.cells)
    present = {cell.get("id") for cell in submission.cells}
    unmatched = [cell_id for cell_id in pristine_students if cell_id not in present]
    learner_version: dict[str, object] = {}
    added: dict[str | None, list] = defaultdict(list)  # pristine cell id it follows (None: before all) -> cells
    anchor, seen = None, set()
    for cell in submission.cells:
        cell_id = cell.get("id")
        if _is_student(cell) and cell_id not in pristine_ids and unmatched:
            cell_id = unmatched.pop(0)
        if ids_lost and (cell.cell_type != "code" or {"setup", "check"} & set(cell.metadata.get("tags", []))):
            continue  # a copy of a pristine cell: the pristine one is used
        if cell_id in pristine_ids and cell_id not in seen:
            seen.add(cell_id)
            anchor = cell_id
            if cell_id in pristine_students:
                learner_version[cell_id] = cell
        else:
            added[anchor].append(cell)
    graded = copy.deepcopy(pristine)
    starters = [copy.deepcopy(cell) for cell in pristine.cells if _is_student(cell)
                and cell.get("id") not in learner_version]
    cells, first_student = [], True
    for cell in pristine.cells:
        if _is_student(cell):
            if first_student:
                cells += starters + _added(added[None])
                first_student = False
            if cell.get("id") not in learner_version:
                continue  # deleted: its starter is above
            restored = copy.deepcopy(cell)
            restored.source = learner_version[cell.get("id")].source
        else:
            restored = copy.deepcopy(cell)
        cells.append(restored)
        cells += _added(added[cell.get("id")])
    if first_student:  # no student cell at all: added cells go last
        cells += _added(added[None])
    graded.cells = cells
    return graded


def _added(learner_cells: list) -> list:
    out = []
    for cell in learner_cells:
        cell = copy.deepcopy(cell)
        tags = [tag for tag in cell.metadata.get("tags", []) if tag not in ("student", "check", "setup")]
        cell.metadata["tags"] = tags + [ADDED_TAG]
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        out.append(cell)
    return out
