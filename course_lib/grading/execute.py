"""Run notebooks in a fresh kernel and store their outputs (``--build``).

* Solutions keep every output: a reader sees each check's verdict and worked examples (the
  exercises built from them start without outputs; grading never compares printed text).
* Lessons keep only the outputs of cells tagged ``nbval-check-output`` (deterministic
  figures that the test suite compares); everything else is committed without outputs.
  A cell tag, not nbval's ``# NBVAL_CHECK_OUTPUT`` comment, so learners never see the marker.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbclient import NotebookClient

CHECK_TAG = "nbval-check-output"


def is_checked(cell) -> bool:
    """True for a code cell whose stored output the test suite compares."""
    return cell.get("cell_type") == "code" and CHECK_TAG in cell.get("metadata", {}).get("tags", [])


def execute(path: str | Path, keep_all_outputs: bool, timeout_s: int = 300) -> nbformat.NotebookNode:
    """Execute ``path`` in place (from its own folder) and return the stored notebook."""
    path = Path(path)
    book = nbformat.read(path, as_version=4)
    NotebookClient(book, timeout=timeout_s, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    for cell in book.cells:
        cell.metadata.pop("execution", None)  # timestamps would change on every rebuild
        if cell.cell_type == "code" and not keep_all_outputs and not is_checked(cell):
            cell.outputs, cell.execution_count = [], None
    book.metadata.pop("widgets", None)  # widget state is live-only; stale copies confuse front ends
    nbformat.write(book, path)
    return book
