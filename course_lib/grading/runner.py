"""The program that runs a learner's code for grading: ``python -m course_lib.grading.runner WORKDIR``.

It runs where the learner's code runs (in the cohort grader, inside the submission's sandbox),
so the grader trusts nothing it writes. It reads ``WORKDIR/program.json`` (written by the
grader: the notebook's code cells to run, and each task's function name, call and cases),
runs the cells one by one in an IPython shell, as a notebook kernel would (magics and all),
then calls each task's function on its cases (``calls.run_cases``) and writes
``WORKDIR/results.json``:

    {"cells": [{"id": ..., "error": "Type: message" or null}, ...],
     "tasks": {"1": [outcome, ...] or {"missing": "why"}, ...}}

``WORKDIR/progress.txt`` gets one line before each cell and each task, so when the process
dies (``os._exit``, a crash, the time limit) the grader can say where.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from course_lib.grading.calls import deadline, OutOfTime, run_cases

PROGRAM, RESULTS, PROGRESS = "program.json", "results.json", "progress.txt"


def _run_cells(shell, cells: list[dict], cell_timeout_s: float, progress) -> list[dict]:
    report = []
    for cell in cells:
        progress.write(f"cell {cell['id']}\n")
        progress.flush()
        try:
            with deadline(cell_timeout_s):
                result = shell.run_cell(cell["source"], store_history=False, silent=False)
            error = result.error_before_exec or result.error_in_exec
            text = None if error is None else f"{type(error).__name__}: {error}"[:1000]
        except OutOfTime:
            text = f"TimeoutError: the cell ran past {cell_timeout_s:g} s"
        report.append({"id": cell["id"], "error": text})
    return report


def _run_tasks(namespace: dict, tasks: list[dict], progress) -> dict:
    results = {}
    for task in tasks:
        progress.write(f"task {task['number']}\n")
        progress.flush()
        function = namespace.get(task["function"])
        if not callable(function):
            results[str(task["number"])] = {"missing": (
                f"{task['function']} is not defined: keep the function name the task gives, and make sure its "
                "cell runs without an error")}
            continue
        results[str(task["number"])] = run_cases(function, task["call"], task["cases"], task["time_limit_s"])
    return results


def main(workdir: str) -> int:
    from IPython.core.interactiveshell import InteractiveShell

    work = Path(workdir)
    program = json.loads((work / PROGRAM).read_text(encoding="utf-8"))
    shell = InteractiveShell.instance()
    with open(work / PROGRESS, "w", encoding="utf-8") as progress:
        cells = _run_cells(shell, program["cells"], program["cell_timeout_s"], progress)
        tasks = _run_tasks(shell.user_ns, program["tasks"], progress)
        progress.write("done\n")
    partial = work / (RESULTS + ".partial")
    partial.write_text(json.dumps({"cells": cells, "tasks": tasks}), encoding="utf-8")
    os.replace(partial, work / RESULTS)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
