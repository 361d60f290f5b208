"""The widget probe behind each lesson's ``widget controls`` check (``lesson_time_checks.py``).

Each lesson's check runs ``widget_probe`` in the lesson's kernel after Run All: it moves every
control of every widget the lesson displayed and holds each answer under 1 s, counted as the
larger of the process's CPU seconds (``time.process_time``) and the wall time less the thread's
waits for a core, so CI's load does not fail a fast handler and a sleeping one still fails.
These tests hold the probe to that: each kind of control is driven to the values a learner
can give it, slow, sleeping, threaded and failing handlers are caught, a fast one passes on a
loaded machine, the quiz's buttons (which save answers) stay unclicked, and the lessons' widget
calls are found from their code.
"""

from __future__ import annotations

import glob
import subprocess
import sys
import threading
import time

import ipywidgets as w
import nbformat
import pytest

import widget_probe
from course_lib.paths import REPO_ROOT
from lesson_time_checks import require_schedstat
from process_times import CORES
from widget_probe import NOT_CLICKED, drive, widget_class, widget_factory_calls


def _watched(control: w.Widget, seen: list) -> w.Widget:
    control.observe(lambda change: seen.append(change["new"]), "value")
    return control


def _busy(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_each_kind_of_control_gets_the_values_a_learner_can_give_it():
    seen = {name: [] for name in ("int", "float", "range", "choice", "radio", "switch", "text", "number", "bounded")}
    clicks = []
    button = w.Button(description="go")
    button.on_click(lambda _: clicks.append(1))
    root = w.VBox([
        _watched(w.IntSlider(5, 1, 10, description="int"), seen["int"]),
        _watched(w.FloatSlider(0.5, min=0.3, max=0.95, step=0.05), seen["float"]),
        _watched(w.IntRangeSlider(value=(2, 4), min=0, max=10), seen["range"]),
        w.HBox([_watched(w.Dropdown(options=[f"o{i}" for i in range(10)], value="o3"), seen["choice"])]),
        _watched(w.RadioButtons(options=[("a", 1), ("b", 2)], value=None), seen["radio"]),
        _watched(w.Checkbox(False), seen["switch"]),
        _watched(w.Textarea(""), seen["text"]),
        _watched(w.FloatText(0.0), seen["number"]),
        _watched(w.BoundedIntText(value=3, min=0, max=8), seen["bounded"]),
        button,
        w.HTML("a readout"), w.IntProgress(3),  # shown, not controls
    ])
    events = drive(root, "toy", 1.0)
    assert seen["int"] == [1, 10, 5] and seen["bounded"] == [0, 8, 4, 3]  # extremes, a middle value, back
    assert [round(v, 2) for v in seen["float"]] == [0.3, 0.95, 0.6, 0.5]
    assert seen["range"] == [(0, 10), (0, 5), (2, 4)]
    assert seen["choice"] == ["o0", "o4", "o9", "o3"]  # first, middle and last of ten, then the lesson's
    assert seen["radio"] == [1, 2, None] and seen["switch"] == [True, False] and seen["number"] == [1.0, 0.0]
    assert seen["text"][0] and seen["text"][-1] == "" and clicks == [1]
    assert len(events) == sum(map(len, seen.values())) + 1 and not any(event["error"] for event in events)
    assert all(event["estimate_s"] < 0.5 for event in events)


def test_a_slow_handler_is_over_budget_and_the_rest_of_its_control_is_skipped():
    slow, fast = [], []
    slider = _watched(w.IntSlider(5, 1, 10, description="slow"), slow)
    slider.observe(lambda change: _busy(1.2), "value")
    events = drive(w.VBox([slider, _watched(w.IntSlider(1, 0, 3, description="fast"), fast)]), "toy", 1.0)
    slow_events = [event for event in events if event["control"] == "slow (IntSlider)"]
    assert slow == [1] and len(slow_events) == 1 and slow_events[0]["estimate_s"] >= 1.1
    assert slow_events[0]["cpu_s"] >= 1.1
    assert fast == [0, 3, 1]  # the next control is still driven


@pytest.mark.parametrize("handler", [lambda change: time.sleep(1.2),
                                     lambda change: threading.Thread(target=time.sleep, args=(1.2,)).start()],
                         ids=["sleeps", "answers from a thread"])
def test_an_answer_that_waits_is_counted_by_its_wall_time(handler):
    require_schedstat()
    checkbox = w.Checkbox(False, description="wait")
    checkbox.observe(handler, "value")
    event = drive(w.VBox([checkbox]), "toy", 1.0)[0]
    assert event["cpu_s"] < 0.5 and event["estimate_s"] >= 1.1


def test_a_fast_handler_stays_fast_on_a_loaded_machine():
    """One busy process more than there are cores doubles the wall time, not the estimate."""
    require_schedstat()
    switch = w.Checkbox(False)
    switch.observe(lambda change: _busy(0.3), "value")
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(CORES + 1)]
    try:
        time.sleep(0.2)
        events = drive(w.VBox([switch]), "toy", 1.0)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert all(0.29 <= event["estimate_s"] < 0.6 for event in events), events
    assert sum(event["wall_s"] for event in events) > 1.3 * sum(event["estimate_s"] for event in events)


def test_a_handler_error_is_reported():
    dropdown = w.Dropdown(options=["a", "b"])
    dropdown.observe(lambda change: 1 / 0, "value")
    (event,) = drive(w.VBox([dropdown]), "toy", 1.0)
    assert event["error"] == "ZeroDivisionError: division by zero"


def test_controls_revealed_by_a_change_are_driven_before_it_is_set_back():
    order = []
    extra = w.IntSlider(1, 0, 2, layout=w.Layout(display="none"))
    extra.observe(lambda change: order.append(("extra", change["new"])), "value")
    switch = w.Checkbox(False)
    switch.observe(lambda change: (order.append(("switch", change["new"])),
                                   setattr(extra.layout, "display", None if change["new"] else "none")), "value")
    hidden, disabled = w.IntSlider(layout=w.Layout(visibility="hidden")), w.IntSlider(disabled=True)
    drive(w.VBox([switch, extra, hidden, disabled]), "toy", 1.0)
    assert order == [("switch", True), ("extra", 0), ("extra", 2), ("extra", 1), ("switch", False)]
    assert hidden.value == 0 and disabled.value == 0


def test_buttons_of_a_not_clicked_widget_stay_unclicked_and_its_choices_are_driven():
    class QuizWidget(w.VBox):  # stands in for the real one, by name
        pass

    clicks = []
    check = w.Button(description="Check")
    check.on_click(lambda _: clicks.append(1))
    choice = w.RadioButtons(options=["x", "y"], value=None)
    events = drive(w.VBox([QuizWidget([choice, check])]), "toy", 1.0)
    assert not clicks and [event["value"] for event in events] == ["'x'", "'y'", "back to no choice"]


def test_a_control_of_no_known_kind_fails_instead_of_being_skipped():
    (event,) = drive(w.VBox([w.ColorPicker()]), "toy", 1.0)
    assert "no way to drive a ColorPicker" in event["error"]


def test_widget_calls_are_read_from_the_cells_code():
    cells = [
        "from course_lib.widgets.ring_stepper import record_ring, ring_stepper\n"
        "from course_lib.widgets.budget_explorer import TokenBudgetExplorer, plot_budget_sweep",
        "ring_stepper(record_ring(4))",  # a function returning a widget; record_ring returns traces
        "plot_budget_sweep({}, 50)",  # a figure, not a widget
        "def later():\n    return TokenBudgetExplorer(None, None, None)",  # made only when called
        "import course_lib.widgets.quiz as quizzes\nquizzes.show_quiz('01_paging')",
    ]
    names = [[factory.__name__ for factory in calls] for calls in widget_factory_calls(cells)]
    assert names == [[], ["ring_stepper"], [], [], ["show_quiz"]]


def _lesson_widget_classes() -> set[str]:
    classes = set()
    for path in sorted(glob.glob(str(REPO_ROOT / "notebooks" / "*.ipynb"))):
        sources = [cell.source for cell in nbformat.read(path, as_version=4).cells if cell.cell_type == "code"]
        classes |= {widget_class(factory).__name__ for calls in widget_factory_calls(sources) for factory in calls}
    return classes


def test_the_widgets_whose_buttons_are_not_clicked_are_widgets_the_lessons_show():
    """A stale entry would leave a renamed widget's buttons unclicked, or no longer protect the
    learner's saved answers."""
    shown = _lesson_widget_classes()
    assert {"KVCalculator", "QuizWidget", "StaffAnswer", "VBox"} <= shown  # VBox: ring_stepper's
    assert set(NOT_CLICKED) <= shown and all(reason.strip() for reason in NOT_CLICKED.values())


def test_the_probe_sees_every_ipywidgets_control_kind():
    """A new kind of ipywidgets value widget must be sorted into controls or display-only."""
    value_widgets = {cls for cls in vars(w).values() if isinstance(cls, type) and issubclass(cls, w.ValueWidget)}
    unknown = {cls.__name__ for cls in value_widgets
               if not issubclass(cls, widget_probe.CONTROLS + widget_probe.DISPLAY_ONLY)}
    assert unknown <= {"ValueWidget", "ColorPicker", "ColorsInput", "DatePicker", "DatetimePicker", "FileUpload",
                       "FloatsInput", "IntsInput", "NaiveDatetimePicker", "TagsInput", "TimePicker"}
