"""Two checks nbval runs after each lesson's last cell, in the lesson's kernel, and the table
of Run All times printed at the end of the run (loaded by the root ``conftest.py``).

* ``notebooks/NN.ipynb::Run All time`` (``RunAllTime``): the lesson runs in under a minute.
* ``notebooks/NN.ipynb::widget controls`` (``WidgetControls``): each control answers in under 1 s.
  Before it moves a control, it writes the lesson as run, with every widget as it first showed,
  to ``build/executed/`` for the website (``course_lib.book.executed``).

Both are added only when every code cell of the lesson runs (a whole-lesson run: the suite,
``./course test``, or ``pytest notebooks/NN.ipynb``), after ``-k`` and ``-m`` have selected.
With pytest-xdist's ``--dist loadfile`` they run on the worker that ran the lesson's cells.
"""

from __future__ import annotations

import ast
import json
import os
import queue
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
from nbval.plugin import IPyNbCell, IPyNbFile

from course_lib.book.executed import write_executed
from process_times import CORES, ProcessTreeMeter, Usage, schedstat_available
from widget_probe import WIDGET_VIEW

LESSON_BUDGET_S = 60.0
HANDLER_BUDGET_S = 1.0
LISTED_FROM_S = 0.3  # widget answers slower than this are listed in the summary
PROBE_TIMEOUT_S = 900.0
TESTS = Path(__file__).resolve().parent
PLUGIN_NAME = "lesson-time-checks"
IN_CI = os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def require_schedstat() -> None:
    """For a test that needs waits for a core: skip where Linux does not report them, fail under CI."""
    if not schedstat_available():
        message = "needs Linux's /proc/<pid>/schedstat (waits for a core)"
        pytest.fail(f"CI=true but this test {message}") if IN_CI else pytest.skip(message)


class CheckFailed(Exception):
    """A failed check whose message says everything (no traceback is shown)."""


@dataclass
class CellRun:
    cell: int
    source: str
    model_ids: list[str]
    usage: Usage
    measured: bool  # False: the kernel could not be measured, usage is the wall time alone
    failed: bool  # the cell raised or its outputs differed
    outputs: list[dict] | None  # what the kernel sent back, as nbval received it (None: nothing)


@dataclass
class LessonRuns:
    cells: list[CellRun] = field(default_factory=list)


def _kernel_pid(nbfile: IPyNbFile) -> int | None:
    try:
        return nbfile.kernel.km.provisioner.pid
    except AttributeError:
        return None


def _is_lesson(nbfile: IPyNbFile) -> bool:
    return nbfile.path.parent == nbfile.config.rootpath / "notebooks"


class _LessonCheck(pytest.Item):
    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, CheckFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, f"{self.path.name}::{self.name}"

    @property
    def runs(self) -> LessonRuns:
        return self.config.pluginmanager.get_plugin(PLUGIN_NAME).runs.get(self.parent.nodeid, LessonRuns())


class RunAllTime(_LessonCheck):
    """The lesson's Run All takes under ``LESSON_BUDGET_S`` (60 s) on an idle 2-core machine.

    Each cell is measured while nbval runs it (``process_times.ProcessTreeMeter``): its wall
    time, the CPU seconds of the kernel and of every process it started (ranks and engine
    workers; children the kernel reaped count too), and how long those processes sat runnable,
    waiting for a core. The wall time alone cannot be held to a minute in CI: the other worker's
    lesson, browsers and ranks share the two cores and stretched one 15 s cell to 64 s. CPU
    seconds alone miss time spent waiting on purpose (a collective's timeout) and overcount
    ranks that compute side by side. So every quarter of a second of a cell counts for the
    largest of three times an idle machine could not beat: the kernel's CPU seconds, all the
    processes' CPU seconds over the cores, and the wall time less the waits for a core. The
    lesson's time is their sum over its cells, and it must stay under the budget.

    A lesson whose cells compute, or wait, for two minutes counts two minutes however busy the
    machine, and fails. Load adds nothing: a busy machine stretches the wall time only by waits
    for a core, which are taken off, and leaves CPU seconds as they are (shared caches add a
    few per cent: measured, 5.1 s for lesson 01 alone and 5.1 s beside another worker, 15.9 s
    and 15.4 s for lesson 02). Under ``CI=true`` the kernel and its waits must be measurable.
    """

    def runtest(self) -> None:
        runs = self.runs.cells
        if not runs:
            raise CheckFailed(f"None of {self.path.name}'s cells ran in this process: nothing to time.")
        estimates = [run.usage.idle_s for run in runs]
        row = {
            "lesson": self.path.stem, "cells": len(runs), "wall_s": sum(run.usage.wall_s for run in runs),
            "waited_s": sum(run.usage.waited_s or 0.0 for run in runs),
            "kernel_cpu_s": sum(run.usage.root_cpu_s for run in runs),
            "tree_cpu_s": sum(run.usage.tree_cpu_s for run in runs), "estimate_s": sum(estimates),
            "measured": all(run.measured for run in runs), "waits": schedstat_available(),
        }
        self.user_properties.append(("lesson_run_all", row))
        if IN_CI and not (row["measured"] and row["waits"]):
            raise CheckFailed(f"CI=true, but {self.path.name}'s kernel could not be measured (psutil and Linux's "
                              "/proc/<pid>/schedstat are needed), so its time would not be load-free.")
        if row["estimate_s"] > LESSON_BUDGET_S:
            slowest = sorted(zip(estimates, runs), key=lambda pair: -pair[0])[:3]
            raise CheckFailed(
                f"{self.path.name} takes about {row['estimate_s']:.0f} s to Run All on an idle machine, over the "
                f"{LESSON_BUDGET_S:g} s budget. Measured here: wall {row['wall_s']:.0f} s, of which "
                f"{row['waited_s']:.0f} s waiting for a core; kernel CPU {row['kernel_cpu_s']:.0f} s; all its "
                f"processes' CPU {row['tree_cpu_s']:.0f} s over {CORES} cores. Slowest cells: "
                + ", ".join(f"Cell {run.cell} {estimate:.1f} s" for estimate, run in slowest)
                + ". Make those cells do less (smaller sweeps, fewer ranks, results computed once).")


class WidgetControls(_LessonCheck):
    """Every control of every widget the lesson displayed answers in under ``HANDLER_BUDGET_S`` (1 s).

    ``widget_probe`` runs in the lesson's kernel after Run All: it moves each control of each
    displayed widget (slider extremes and a middle value, choices, switches, text, buttons) and
    times each handler, threads it started included. An answer is held to the budget by the
    larger of the kernel's CPU seconds (``time.process_time``) and the wall time less the time
    the kernel's thread waited for a core, the same idle-machine bound as ``RunAllTime``: the
    raw wall time doubles when CI's other worker is busy, and CPU time alone would pass a
    handler that sleeps or blocks (or waits for ranks: ``PrimitiveExplorer`` forks its ranks on
    every change, in 0.1 to 0.3 s here, so no widget is left out). The check also fails when a
    handler raises, and when a cell calls a widget class (or a function returning a widget) but
    displays no widget, since the probe only finds displayed ones.
    """

    def runtest(self) -> None:
        kernel = self.parent.kernel
        if kernel is None or not kernel.is_alive():
            raise CheckFailed(f"{self.path.name}'s kernel is not running: its widgets cannot be driven.")
        cells = [{"cell": run.cell, "source": run.source, "model_ids": run.model_ids, "failed": run.failed}
                 for run in self.runs.cells]
        code = (f"import json as _json, sys as _sys\n_sys.path.insert(0, {str(TESTS)!r})\n"
                f"import widget_probe as _widget_probe\n_sys.path.remove({str(TESTS)!r})\n"
                f"_widget_probe_result = _json.dumps(_widget_probe.probe_lesson(_json.loads({json.dumps(cells)!r}), "
                f"{HANDLER_BUDGET_S!r}))\n")
        started = time.perf_counter()
        try:
            result = json.loads(_run_in_kernel(kernel.kc, code, "_widget_probe_result", PROBE_TIMEOUT_S))
        except queue.Empty:
            kernel.interrupt()
            raise CheckFailed(f"Driving {self.path.name}'s widgets took over {PROBE_TIMEOUT_S:.0f} s.") from None
        events = result["events"]
        if len(self.runs.cells) == sum(cell.cell_type == "code" for cell in self.parent.nb.cells):
            write_executed(self.path, [run.outputs for run in sorted(self.runs.cells, key=lambda run: run.cell)],
                           result["snapshots"])
        self.user_properties.append(("widget_answers", {
            "lesson": self.path.stem, "actions": len(events),
            "probe_s": time.perf_counter() - started,
            "slowest_s": max((event["estimate_s"] for event in events), default=0.0),
            "listed": [event for event in events if event["estimate_s"] > LISTED_FROM_S or event["error"]]}))
        problems = [f"{_event_line(event)}: raised {event['error']}" for event in events if event["error"]]
        problems += [f"{_event_line(event)}: over {HANDLER_BUDGET_S:g} s" for event in events
                     if event["estimate_s"] > HANDLER_BUDGET_S and not event["error"]]
        problems += [f"Cell {cell['cell']} calls {', '.join(cell['factories'])} but " + (
            "failed before displaying a widget (its own failure says why)" if cell["failed"] else
            "displays no widget: display it in the cell that makes it, so this check can drive it")
            for cell in result["undisplayed"]]
        if problems:
            raise CheckFailed(f"{self.path.name}: {len(problems)} of {len(events)} widget actions fail:\n  "
                              + "\n  ".join(problems))


def _event_line(event: dict) -> str:
    times = f"{event['estimate_s']:.2f} s (CPU {event['cpu_s']:.2f} s, wall {event['wall_s']:.2f} s)"
    return f"{event['widget']} > {event['control']} = {event['value']}: {times}"


def _run_in_kernel(client, code: str, expression: str, timeout_s: float) -> str:
    """Run ``code`` in the kernel and return the string ``expression`` evaluates to there;
    raise CheckFailed with the kernel's traceback if it fails, queue.Empty on timeout."""
    msg_id = client.execute(code, store_history=False, allow_stdin=False, stop_on_error=False,
                            user_expressions={"result": expression})
    deadline = time.monotonic() + timeout_s
    while True:
        reply = client.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    _drain_until_idle(client, msg_id, deadline)
    content = reply["content"]
    if content["status"] != "ok":
        raise CheckFailed(f"The widget probe failed in the kernel: {content.get('ename')}: {content.get('evalue')}\n"
                          + "\n".join(content.get("traceback", [])))
    return ast.literal_eval(content["user_expressions"]["result"]["data"]["text/plain"])


def _drain_until_idle(client, msg_id: str, deadline: float) -> None:
    """Read, and drop, what the kernel published for ``msg_id`` (widget updates: images, mostly)
    up to its idle status, so the messages do not wait in memory until the kernel stops."""
    try:
        while True:
            message = client.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            if (message["parent_header"].get("msg_id") == msg_id and message["msg_type"] == "status"
                    and message["content"]["execution_state"] == "idle"):
                return
    except queue.Empty:
        return


class LessonTimeChecks:
    """Measures lesson cells (on the worker that runs them), appends the two checks, prints the table."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.runs: dict[str, LessonRuns] = {}
        self.rows: list[dict] = []
        self.answers: list[dict] = []

    @pytest.hookimpl(trylast=True)  # after -k, -m and --deselect
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        selected: dict[IPyNbFile, int] = {}
        for item in items:
            if isinstance(item, IPyNbCell) and _is_lesson(item.parent):
                selected[item.parent] = selected.get(item.parent, 0) + 1
        for nbfile, count in selected.items():
            if count != sum(cell.cell_type == "code" for cell in nbfile.nb.cells):
                continue  # not a Run All
            last = max(index for index, item in enumerate(items) if item.parent is nbfile)
            items[last + 1:last + 1] = [RunAllTime.from_parent(nbfile, name="Run All time"),
                                        WidgetControls.from_parent(nbfile, name="widget controls")]

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item):
        if not (isinstance(item, IPyNbCell) and _is_lesson(item.parent)):
            return (yield)
        pid = _kernel_pid(item.parent)
        try:
            meter = ProcessTreeMeter(pid).start() if pid is not None else None
        except psutil.NoSuchProcess:
            meter = None
        wall, failed = time.perf_counter(), True
        try:
            result = yield
            failed = False
            return result
        finally:
            wall = time.perf_counter() - wall
            usage = meter.stop() if meter else Usage(wall, 0.0, 0.0, 0.0, wall)
            views = [output.get("data", {}).get(WIDGET_VIEW, {}).get("model_id")
                     for output in getattr(item, "test_outputs", None) or []]
            self.runs.setdefault(item.parent.nodeid, LessonRuns()).cells.append(
                CellRun(item.cell_num, item.cell.source, [view for view in views if view], usage, meter is not None,
                        failed, getattr(item, "test_outputs", None)))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        for name, value in report.user_properties:
            if name == "lesson_run_all":
                self.rows.append(value)
            elif name == "widget_answers":
                self.answers.append(value)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.rows:
            _print_run_all_table(terminalreporter, sorted(self.rows, key=lambda row: row["lesson"]))
        if self.answers:
            _print_widget_answers(terminalreporter, sorted(self.answers, key=lambda answer: answer["lesson"]))


def _print_run_all_table(reporter, rows: list[dict]) -> None:
    reporter.section(f"Run All time per lesson (budget {LESSON_BUDGET_S:g} s on an idle machine)", sep="=")
    reporter.line(f"{'lesson':24} {'cells':>5} {'wall s':>7} {'waited s':>9} {'kernel CPU s':>13} "
                  f"{'all CPU s':>10} {'idle estimate s':>16}")
    for row in rows:
        flag = "" if row["estimate_s"] <= LESSON_BUDGET_S else "  OVER BUDGET"
        flag += "" if row["measured"] else "  (kernel not measured: wall time)"
        flag += "" if row["waits"] or not row["measured"] else "  (no waits for a core here: CPU bounds only)"
        reporter.line(f"{row['lesson']:24} {row['cells']:5d} {row['wall_s']:7.1f} {row['waited_s']:9.1f} "
                      f"{row['kernel_cpu_s']:13.1f} {row['tree_cpu_s']:10.1f} {row['estimate_s']:16.1f}{flag}")
    reporter.line(f"waited: runnable but waiting for a core; all CPU: the kernel and every process it started; idle "
                  f"estimate: per cell the largest of kernel CPU, all CPU / {CORES} cores and wall - waited, summed.")


def _print_widget_answers(reporter, answers: list[dict]) -> None:
    reporter.section(f"Widget answers per lesson (budget {HANDLER_BUDGET_S:g} s; over {LISTED_FROM_S:g} s listed)",
                     sep="=")
    for answer in answers:
        reporter.line(f"{answer['lesson']}: {answer['actions']} actions in {answer['probe_s']:.0f} s, slowest "
                      f"{answer['slowest_s']:.2f} s")
        for event in answer["listed"]:
            reporter.line(f"  {_event_line(event)}" + (f"  raised {event['error']}" if event["error"] else ""))


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(LessonTimeChecks(config), PLUGIN_NAME)
