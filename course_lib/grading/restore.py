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
* a student cell the learner deleted graded as its starter, where it stood, but only for the names
  no cell of the learner's defines (``starter_left``): the learner's last definition wins wherever
  it stands (a new cell in its place, above or below it, a pasted copy, a lambda, an import), and
  a learner who never wrote the function is still told the task is not done. A ``from x import *``
  may define anything, so it leaves no starter. (In the learner's own kernel nothing is restored:
  a check cell judges whatever the name holds when it runs.);
* every other cell (instructions, the locked ``setup`` and ``check`` cells) the pristine one,
  whatever the submission holds.
"""

from __future__ import annotations

import ast
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
    learner_code = [cell.source for cell in [*learner_version.values(), *(c for cs in added.values() for c in cs)]
                    if cell.cell_type == "code"]
    cells, first_student = [], True
    for cell in pristine.cells:
        if _is_student(cell):
            if first_student:
                cells += _added(added[None])
                first_student = False
            restored = copy.deepcopy(cell)
            if cell.get("id") in learner_version:
                restored.source = learner_version[cell.get("id")].source
            else:  # deleted: its starter, less what the learner defines anywhere
                restored.source = starter_left(cell.source, learner_code)
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


def starter_left(starter: str, learner_code: list[str]) -> str:
    """The deleted cell's ``starter`` without the top-level statements whose names some learner cell in
    ``learner_code`` defines ("" when it defines every one, or may define anything)."""
    defined: set[str] = set()
    for source in learner_code:
        names = bound_names(source)
        if names is None:
            return ""
        defined |= names
    try:
        statements = ast.parse(starter).body
    except SyntaxError:
        return starter
    lines, dropped, kept_a_definition = starter.splitlines(keepends=True), [], False
    for statement in statements:
        names = bound_names(ast.Module(body=[statement], type_ignores=[]))
        if names and names <= defined:
            first = min([statement.lineno] + [d.lineno for d in getattr(statement, "decorator_list", [])])
            dropped.append(range(first - 1, statement.end_lineno))
        elif names:
            kept_a_definition = True
    if not dropped:
        return starter
    if not kept_a_definition:
        return ""
    return "".join(line for number, line in enumerate(lines) if not any(number in gone for gone in dropped))


def bound_names(code: str | ast.Module) -> set[str] | None:
    """The names a cell binds in the notebook's namespace: ``def``/``class``, assignments (a lambda
    too), imports, loop and ``with`` targets, at its top level or in its blocks, never inside a
    function or class body. None when it may bind any name (``from x import *``). IPython's syntax
    (magics, ``!`` commands, a ``%%`` cell magic's body) is read as IPython runs it; a cell that is
    not Python binds nothing."""
    if isinstance(code, str):
        try:
            code = ast.parse(_as_python(code))
        except (SyntaxError, ValueError):
            return set()
    names: set[str] = set()
    todo: list[ast.AST] = list(code.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            todo += node.decorator_list  # its body is a scope of its own
            continue
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    return None
                names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names.add(node.rest)
        todo += ast.iter_child_nodes(node)
    return names


def _as_python(source: str) -> str:
    """A cell's source as the Python IPython runs: the body of a ``%%time`` or ``%%capture`` cell
    (which run it in the notebook's namespace; any other cell magic's body binds nothing here), line
    magics and ``!`` commands as calls."""
    while source.lstrip().startswith("%%"):
        magic, _, source = source.lstrip().partition("\n")
        if magic[2:].split(" ", 1)[0] not in ("time", "capture"):
            return ""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:
        return source
    try:
        return TransformerManager().transform_cell(source)
    except Exception:  # noqa: BLE001 - learner text IPython cannot read binds nothing we can see
        return source
