"""Lessons as the suite ran them, for the website: each code cell's real outputs, widgets as they
first showed.

The lesson files keep only their text outputs; figures and widgets exist only in a run. So when
the test suite runs a lesson whole (``tests/lesson_time_checks.py``), it hands the outputs nbval
received and each displayed widget's snapshot (``widgets.static_view.static_html``, taken in
the lesson's kernel before any control moves) to ``write_executed``, which writes the lesson
under ``build/executed/`` with those outputs in place.

Invariants: an executed copy holds the source lesson's cells unchanged apart from outputs and
execution counts; its metadata records the SHA-256 of the source file it ran, and ``fresh``
holds only while the lesson file is unchanged since.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import nbformat

from course_lib.paths import REPO_ROOT
from course_lib.widgets.static_view import static_outputs

EXECUTED_DIR = REPO_ROOT / "build" / "executed"
KEY = "course_executed"  # the notebook metadata entry naming the run's source


def source_digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def executed_path(lesson: Path, folder: Path = EXECUTED_DIR) -> Path:
    """Where the executed copy of ``notebooks/NN.ipynb`` lives."""
    return Path(folder) / Path(lesson).name


def write_executed(lesson: Path, code_outputs: list[list[dict] | None], snapshots: dict[str, str],
                   folder: Path = EXECUTED_DIR) -> Path:
    """Write ``lesson`` with its code cells' outputs, in order, replaced by ``code_outputs`` (None:
    the cell gave none) made static with ``snapshots`` (model id -> HTML). Answers the path."""
    notebook = nbformat.read(lesson, as_version=4)
    cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    if len(cells) != len(code_outputs):
        raise ValueError(f"{Path(lesson).name} has {len(cells)} code cells but {len(code_outputs)} were run: "
                         "write an executed copy only after a whole-lesson run.")
    for number, (cell, outputs) in enumerate(zip(cells, code_outputs), start=1):
        cell.outputs = [nbformat.from_dict(output) for output in static_outputs(outputs or [], snapshots)]
        cell.execution_count = number
        for output in cell.outputs:
            if output.output_type == "execute_result":
                output.execution_count = number
    notebook.metadata[KEY] = {"source": Path(lesson).name, "sha256": source_digest(lesson)}
    nbformat.validate(notebook)
    target = executed_path(lesson, folder)
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, target)
    return target


def fresh(lesson: Path, folder: Path = EXECUTED_DIR) -> bool:
    """Whether ``lesson`` has an executed copy made from the file as it is now."""
    target = executed_path(lesson, folder)
    if not target.exists():
        return False
    recorded = nbformat.read(target, as_version=4).metadata.get(KEY, {})
    return recorded.get("sha256") == source_digest(lesson)
