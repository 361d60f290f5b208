"""A module's exercise as a read-only page of the website: its tasks to read, nothing run.

``exercise_notebook("04_roofline")`` is ``exercises/04_roofline_exercise.ipynb`` with a Markdown
cell under its title cell that says where to do and grade it (``./course lab``, ``./course grade``) and that its
solution is not on the site. The exercise is built from its solution with the solution's code taken
out (``grading/exercise.py``); the page is made from the exercise alone, so it shows nothing more.

Invariants: every cell of the exercise, in order, with its source unchanged; no outputs and no
execution counts; of a cell's metadata only its ``tags`` (the locks, ``editable`` and ``deletable``,
are JupyterLab's business); the notebook's ``mystnb`` metadata turns execution off, because its
*Your code* cells raise NotImplementedError until a learner fills them in.
"""

from __future__ import annotations

import nbformat

from course_lib.exercise_files import course_exercise, exercise_file, exercise_modules

NOTE_ID = "read-only-note"  # a fixed cell id, so that two builds write the same page


def read_only_note(file_name: str) -> str:
    """The note's Markdown for the exercise ``exercises/<file_name>`` (the cell after the title)."""
    return (
        "```{note}\n"
        "This page is the exercise to read. Do it in JupyterLab: run `./course lab` and open "
        f"`exercises/{file_name}` in your working copy (`my-work/`). When its checks pass, grade it in "
        f"JupyterLab's Terminal with `./course grade exercises/{file_name}`. The solution is not on this site.\n"
        "```"
    )


def read_only_copy(exercise: nbformat.NotebookNode, file_name: str) -> nbformat.NotebookNode:
    """A copy of ``exercise`` (saved as ``file_name``) made read-only as the module docstring says."""
    page = nbformat.from_dict(exercise)
    for cell in page.cells:
        tags = cell.metadata.get("tags")
        cell.metadata = nbformat.from_dict({"tags": tags} if tags else {})
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    page.cells.insert(1, nbformat.v4.new_markdown_cell(read_only_note(file_name), id=NOTE_ID))  # under the title
    page.metadata["mystnb"] = {"execution_mode": "off"}
    nbformat.validate(page)
    return page


def exercise_notebook(module_id: str) -> nbformat.NotebookNode:
    """The read-only page of module ``module_id``'s exercise (``04_roofline``)."""
    if module_id not in exercise_modules():
        raise ValueError(f"No exercise {exercise_file(module_id)} in exercises/; "
                         f"use one of the modules that have one: {exercise_modules()}.")
    return read_only_copy(nbformat.read(course_exercise(module_id), as_version=4), exercise_file(module_id))
