"""The program that runs a learner's code for grading: ``python -m course_lib.grading.runner WORKDIR``.

It runs where the learner's code runs (in the cohort grader, inside the submission's sandbox),
so the grader trusts nothing it sends. It reads ``WORKDIR/program.json`` (written by the grader:
the notebook's code cells to run, and each task's function name, call and cases), runs the
cells one by one in an IPython shell, as a notebook kernel would (magics and all), then calls
each task's function on its cases (``calls.run_cases``). It reports as it goes, one JSON record
per line, on the channel the grader gave it (file descriptor ``COURSE_CHANNEL_FD``):

    {"start": "the set-up cell"}          before each cell and each task (the grader can say where a run died)
    {"cell": label, "error": "Type: message" or null}
    {"task": 1, "outcomes": [outcome, ...]}   or   {"task": 1, "missing": true}
    {"done": true}

then ends at once (threads the learner's code left running cannot keep it alive).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from course_lib.grading.calls import OutOfTime, deadline, run_cases

PROGRAM = "program.json"


class _Channel:
    def __init__(self) -> None:
        self.file = os.fdopen(int(os.environ["COURSE_CHANNEL_FD"]), "w", encoding="utf-8")

    def send(self, **record) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()


def _run_cells(shell, cells: list[dict], cell_timeout_s: float, channel: _Channel) -> None:
    for cell in cells:
        channel.send(start=cell["label"])
        try:
            with deadline(cell_timeout_s):
                result = shell.run_cell(cell["source"], store_history=False, silent=False)
            error = result.error_before_exec or result.error_in_exec
            text = None if error is None else f"{type(error).__name__}: {error}"[:1000]
        except OutOfTime:
            text = f"TimeoutError: the cell ran past {cell_timeout_s:g} s"
        channel.send(cell=cell["label"], error=text)


def _run_tasks(namespace: dict, tasks: list[dict], channel: _Channel) -> None:
    for task in tasks:
        channel.send(start=f"Task {task['number']}")
        function = namespace.get(task["function"])
        if callable(function):
            channel.send(task=task["number"], outcomes=run_cases(function, task["call"], task["cases"],
                                                                 task["time_limit_s"]))
        else:
            channel.send(task=task["number"], missing=True)


def main(workdir: str) -> None:
    from IPython.core.interactiveshell import InteractiveShell

    channel = _Channel()
    for folder in (os.environ.get("HOME"), os.environ.get("IPYTHONDIR")):
        if folder:
            os.makedirs(folder, exist_ok=True)
    program = json.loads((Path(workdir) / PROGRAM).read_text(encoding="utf-8"))
    shell = InteractiveShell.instance()
    _run_cells(shell, program["cells"], program["cell_timeout_s"], channel)
    _run_tasks(shell.user_ns, program["tasks"], channel)
    channel.send(done=True)
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
