"""Each lesson's ``Run All time`` check and the table CI prints (``lesson_time_checks.py``).

The rule (``RunAllTime``'s docstring): every cell counts for the largest of its kernel's CPU
seconds, all its processes' CPU seconds over the cores, and its wall time less the waits for a
core; the lesson's sum stays under 60 s. These tests hold the rule to what it promises: a lesson
that computes or waits for two minutes fails whatever the load, load alone fails nothing, the
kernel's ranks are counted, and a real nbval run fails and reports a slow lesson and widget.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

from lesson_time_checks import LESSON_BUDGET_S, require_schedstat
from process_times import CORES, ProcessTreeMeter, idle_bound_s

TESTS = Path(__file__).resolve().parent


@pytest.mark.parametrize("wall_s, waited_s, root_cpu_s, tree_cpu_s, idle_s", [
    (300, 180, 120, 121, 120),  # two minutes of kernel compute, loaded
    (125, 2, 3, 3, 123),  # two minutes spent waiting on a timeout
    (200, 330, 5, 245, 245 / CORES),  # ranks computing side by side
    (300, None, 120, 121, 120),  # no schedstat: the CPU bounds alone
], ids=["compute", "waiting", "ranks", "no schedstat"])
def test_two_minutes_of_work_count_as_two_minutes_however_loaded(wall_s, waited_s, root_cpu_s, tree_cpu_s, idle_s):
    assert idle_bound_s(wall_s, waited_s, root_cpu_s, tree_cpu_s) == pytest.approx(idle_s)
    assert idle_s > LESSON_BUDGET_S


def test_load_does_not_count():
    """A 40 s lesson whose wall time load stretched to 100 s."""
    assert idle_bound_s(wall_s=100, waited_s=62, root_cpu_s=37, tree_cpu_s=39) == pytest.approx(38)


_TREE = """
import subprocess, sys, time
sys.stdin.readline()
children = [subprocess.Popen([sys.executable, "-c", "import time\\nend = time.process_time() + 0.6\\n"
                              "while time.process_time() < end: pass"]) for _ in range(2)]
for child in children:
    child.wait()
time.sleep(0.6)
print("done", flush=True)
sys.stdin.readline()
"""


def test_a_process_tree_is_measured_the_same_on_a_loaded_machine():
    """A root that runs two children side by side, each computing for 0.6 s, then sleeps 0.6 s:
    about 1.2 s on an idle machine, measured with one busy process more than there are cores."""
    require_schedstat()
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(CORES + 1)]
    root = subprocess.Popen([sys.executable, "-c", _TREE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        meter = ProcessTreeMeter(root.pid).start()
        root.stdin.write("go\n")
        root.stdin.flush()
        assert root.stdout.readline() == "done\n"
        usage = meter.stop()
    finally:
        for process in hogs:
            process.kill()
        root.kill()
        for process in (*hogs, root):
            process.wait()
    assert usage.tree_cpu_s >= 1.2 and usage.root_cpu_s < 0.3  # the children's CPU, counted once reaped
    assert 1.1 <= usage.idle_s <= 1.8, usage
    assert usage.wall_s > usage.idle_s + 0.5, usage  # the load was real


def _lesson(path: Path, sources: list[str]) -> None:
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in sources])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, path)


def test_an_nbval_run_fails_a_slow_lesson_and_a_slow_control_and_prints_the_table(tmp_path):
    """Budgets cut to 1.5 s and 0.5 s so that a short lesson can cross them."""
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider --nbval-lax --nbval-current-env\n")
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(TESTS)!r})
        import lesson_time_checks
        lesson_time_checks.LESSON_BUDGET_S, lesson_time_checks.HANDLER_BUDGET_S = 1.5, 0.5
        pytest_plugins = ["lesson_time_checks"]
    """))
    (tmp_path / "notebooks").mkdir()
    _lesson(tmp_path / "notebooks" / "slow.ipynb", [
        "import time\ntime.sleep(2)",
        "import ipywidgets as w\nslow = w.IntSlider(1, 0, 4, description='slow')\n"
        "slow.observe(lambda change: time.sleep(0.8), 'value')\nslow",
        "from course_lib.widgets.staff_answer import StaffAnswer\nanswer = StaffAnswer('q', 'a', 'c')",
    ])
    _lesson(tmp_path / "notebooks" / "quick.ipynb", ["import ipywidgets as w\nw.Checkbox(description='quick')"])
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:xdist", "notebooks"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": ""})
    out = run.stdout
    assert run.returncode == 1, out + run.stderr
    failures = out.split("short test summary info")[-1]
    assert "notebooks/slow.ipynb::Run All time" in failures and "notebooks/quick.ipynb" not in failures, out
    assert re.search(r"slow.ipynb takes about \d+ s to Run All on an idle machine, over the 1.5 s budget", out), out
    assert re.search(r"Slowest cells: Cell 0 2\.\d s", out), out
    assert re.search(r"Cell 1 IntSlider > slow \(IntSlider\) = 0: (0\.[89]|1\.0)\d s .* over 0.5 s", out), out
    assert "Cell 2 calls StaffAnswer but displays no widget" in out, out
    table = out.split("Run All time per lesson (budget 1.5 s on an idle machine)")[1].splitlines()
    rows = {line.split()[0]: line for line in table[2:4]}
    assert set(rows) == {"quick", "slow"} and "OVER BUDGET" in rows["slow"] and "OVER" not in rows["quick"], out
    assert re.search(r"quick: 2 actions in \d+ s, slowest", out), out
    assert re.search(r"slow: 1 actions in \d+ s, slowest (0\.[89]|1\.0)", out), out
