"""Moves every control of the widgets a lesson displayed and times each handler's answer.

It runs inside the lesson's own kernel after nbval's Run All (``lesson_time_checks.py`` loads
it there), so each widget is the one the lesson built, with the lesson's arguments and data
(benchmarks measured on real ranks included), and no lesson code is repeated here. The widgets
are found from the cells' outputs (every widget view a cell displayed), so a new widget is
covered the day a lesson shows it; ``widget_factory_calls`` reads the cells' code to check that
every cell calling a ``course_lib.widgets`` class (or a function returning a widget) displayed one.

What a learner can do to each control is done once, in order: a slider goes to its minimum, its
maximum and a middle value; a drop-down, radio or toggle-button choice takes its first, a middle
and its last option; a check box or toggle button flips; a text box gets new text; a button is
clicked (except in ``NOT_CLICKED``); then the control returns to where the lesson left it.
Controls that a change reveals or enables (the staff answer's button once an answer is written)
are driven before that control is set back.
"""

from __future__ import annotations

import ast
import importlib
import threading
import typing
from collections.abc import Callable, Iterator

import ipywidgets as w
from ipywidgets.widgets import widget as widget_module

from course_lib.widgets.static_view import WIDGET_VIEW, static_html
from process_times import HandlerClock

SPREAD = 3  # options tried per drop-down or choice list: the first, a middle one and the last
THREAD_WAIT_S = 10.0  # how long an answer handed to a thread is waited for

NOT_CLICKED = {
    "QuizWidget": "its Check and line buttons save the learner's answers under ~/.course-quizzes, a folder "
                  "the tests must not write; its choices (radio buttons, boxes, drop-downs, numbers) are driven",
}
"""Widgets whose buttons are not clicked (their other controls are driven), with the reason."""

SLIDERS = (w.IntSlider, w.FloatSlider, w.FloatLogSlider, w.IntRangeSlider, w.FloatRangeSlider,
           w.SelectionSlider, w.SelectionRangeSlider, w.Play)
CHOICES = (w.Dropdown, w.RadioButtons, w.ToggleButtons, w.Select, w.SelectMultiple)
SWITCHES = (w.Checkbox, w.ToggleButton)
NUMBER_BOXES = (w.IntText, w.FloatText, w.BoundedIntText, w.BoundedFloatText)
TEXT_BOXES = (w.Text, w.Textarea)  # Text covers Password and Combobox
CONTROLS = SLIDERS + CHOICES + SWITCHES + NUMBER_BOXES + TEXT_BOXES + (w.Button,)
DISPLAY_ONLY = (w.HTML, w.HTMLMath, w.Label, w.Image, w.Audio, w.Video, w.IntProgress, w.FloatProgress, w.Valid)
NEW_TEXT = {w.Textarea: "Prefill and decode compete for the same GPUs; I would measure before choosing."}
NEW_LINE = "2"  # a valid number as well as a valid line of text


def _instances() -> dict:
    return getattr(widget_module, "_instances", None) or w.Widget.widgets


def _spread(count: int) -> list[int]:
    if count <= SPREAD:
        return list(range(count))
    return sorted({round(i * (count - 1) / (SPREAD - 1)) for i in range(SPREAD)})


def _middle(low, high, step):
    return low + step * (round((high - low) / step) // 2) if step else (low + high) / 2


def _targets(control: w.Widget) -> list[Callable[[w.Widget], object]]:
    """What to set on ``control``, in order, each read from its bounds and options when it is set."""
    if isinstance(control, w.SelectionSlider):
        return [lambda c: 0, lambda c: len(c.options) - 1, lambda c: len(c.options) // 2]
    if isinstance(control, w.SelectionRangeSlider):
        return [lambda c: (0, len(c.options) - 1), lambda c: (0, len(c.options) // 2)]
    if isinstance(control, w.SelectMultiple):
        return [lambda c: (0,), lambda c: tuple(range(len(c.options)))]
    if isinstance(control, CHOICES):
        return [lambda c, i=i: i for i in _spread(len(control.options))]
    if isinstance(control, (w.IntRangeSlider, w.FloatRangeSlider)):
        return [lambda c: (c.min, c.max), lambda c: (c.min, _middle(c.min, c.max, c.step))]
    if isinstance(control, w.FloatLogSlider):
        return [lambda c, e=e: c.base ** e(c) for e in (lambda c: c.min, lambda c: c.max,
                                                        lambda c: _middle(c.min, c.max, c.step))]
    if isinstance(control, (w.IntSlider, w.FloatSlider, w.Play, w.BoundedIntText, w.BoundedFloatText)):
        return [lambda c: c.min, lambda c: c.max, lambda c: _middle(c.min, c.max, c.step)]
    if isinstance(control, (w.IntText, w.FloatText)):
        return [lambda c: c.value + 1]
    if isinstance(control, SWITCHES):
        return [lambda c: not c.value]
    return [lambda c: NEW_TEXT.get(type(c), NEW_LINE)]


def _by_index(control: w.Widget) -> bool:
    return isinstance(control, (w.widgets.widget_selection._Selection, w.widgets.widget_selection._MultipleSelection))


def steps(control: w.Widget) -> tuple[Iterator[tuple[str, Callable[[], None]]], Callable[[], tuple | None]]:
    """The learner's actions on ``control``, as (what is done, doing it): a click for a button,
    else each new value in turn (values equal to the current one run no handler and are left
    out); and a function giving the action that sets the starting value back, if one is needed."""
    if isinstance(control, w.Button):
        return iter([("click", control.click)]), lambda: None
    key = "index" if _by_index(control) else "value"
    start = getattr(control, key)

    def shown(value) -> str:
        if key == "index":
            labels = control._options_labels
            value = labels[value] if isinstance(value, int) else tuple(labels[i] for i in value)
        text = repr(value)
        return text if len(text) <= 40 else text[:37] + "..."

    def changes():
        for target in _targets(control):
            value = target(control)
            if value != getattr(control, key):
                yield shown(value), lambda value=value: setattr(control, key, value)

    def restore():
        gone = key == "index" and start is not None and max(start if isinstance(start, tuple) else (start,)) >= len(
            control.options)  # the options changed under it
        if start == getattr(control, key) or gone:
            return None
        return f"back to {'no choice' if start is None else shown(start)}", lambda: setattr(control, key, start)

    return changes(), restore


def _visible(widget: w.Widget) -> bool:
    layout = getattr(widget, "layout", None)
    return layout is None or (layout.display != "none" and layout.visibility != "hidden")


def _children(widget: w.Widget) -> list[w.Widget]:
    if isinstance(widget, w.Box):
        return list(widget.children)
    if isinstance(widget, w.Output):  # widgets displayed inside an output area
        views = (output.get("data", {}).get(WIDGET_VIEW, {}).get("model_id") for output in widget.outputs)
        return [_instances()[model] for model in views if model in _instances()]
    return []


def controls(root: w.Widget) -> list[tuple[w.Widget, bool]]:
    """Each visible, enabled control under ``root`` in display order, with whether it may be clicked."""
    found, stack = [], [(root, True)]
    while stack:
        widget, clickable = stack.pop()
        if not _visible(widget) or getattr(widget, "disabled", False):
            continue
        clickable = clickable and type(widget).__name__ not in NOT_CLICKED
        if isinstance(widget, CONTROLS) or (isinstance(widget, w.ValueWidget) and not isinstance(widget, DISPLAY_ONLY)):
            found.append((widget, clickable))  # a value widget of no known kind is reported by drive()
        stack.extend((child, clickable) for child in reversed(_children(widget)))
    return found


def _describe(control: w.Widget) -> str:
    text = (getattr(control, "description", "") or getattr(control, "placeholder", "") or "").strip()
    text = " ".join(text.split())
    return f"{text[:50]} ({type(control).__name__})" if text else type(control).__name__


def _timed(act: Callable[[], None]) -> dict:
    """Usage of one action, waiting for threads it started (an answer computed in the background)."""
    before = set(threading.enumerate())
    error = None
    with HandlerClock() as clock:
        try:
            act()
        except Exception as exc:  # noqa: BLE001 - a handler's error is what this reports
            error = f"{type(exc).__name__}: {exc}"
        for thread in set(threading.enumerate()) - before:
            if not thread.daemon:
                thread.join(THREAD_WAIT_S)
                if thread.is_alive() and error is None:
                    error = f"handed its answer to thread {thread.name!r}, still running after {THREAD_WAIT_S:g} s"
    usage = clock.usage
    return {"wall_s": usage.wall_s, "cpu_s": usage.root_cpu_s, "waited_s": usage.waited_s,
            "estimate_s": usage.idle_s, "error": error}


def drive(root: w.Widget, label: str, budget_s: float) -> list[dict]:
    """Time every learner action on every control under ``root``, in display order. The controls
    a control's changes reveal or enable are driven before it is set back. After an action over
    ``budget_s`` or an error, the control's remaining actions are skipped."""
    events, driven = [], set()

    def usable() -> dict[str, tuple[w.Widget, bool]]:
        return {control.model_id: (control, clickable) for control, clickable in controls(root)}

    def record(control: w.Widget, action: str, act: Callable[[], None]) -> bool:
        events.append({"widget": label, "control": _describe(control), "value": action, **_timed(act)})
        return not events[-1]["error"] and events[-1]["estimate_s"] <= budget_s

    def drive_each(model_ids: list[str]) -> None:
        for model_id in model_ids:
            now = usable()
            if model_id in driven or model_id not in now:
                continue
            driven.add(model_id)
            control, clickable = now[model_id]
            if not isinstance(control, CONTROLS):
                unknown = f"no way to drive a {type(control).__name__}: add one to tests/widget_probe.py"
                events.append({"widget": label, "control": _describe(control), "value": "", "wall_s": 0.0,
                               "cpu_s": 0.0, "waited_s": 0.0, "estimate_s": 0.0, "error": unknown})
                continue
            if isinstance(control, w.Button) and not clickable:
                continue
            changes, restore = steps(control)
            if all(record(control, action, act) for action, act in changes):
                drive_each([revealed for revealed in usable() if revealed not in now])
                back = restore()
                if back is not None:
                    record(control, *back)

    while fresh := [model_id for model_id in usable() if model_id not in driven]:
        drive_each(fresh)
    return events


def widget_class(factory) -> type | None:
    """The widget class ``factory`` makes: itself if it is one, else its return annotation if
    that is one; None for anything else (a figure, a number, an unannotated function)."""
    if isinstance(factory, type):
        return factory if issubclass(factory, w.Widget) else None
    if not callable(factory):
        return None
    try:
        returned = typing.get_type_hints(factory).get("return")
    except Exception:  # noqa: BLE001 - an annotation that does not resolve names no widget
        return None
    return returned if isinstance(returned, type) and issubclass(returned, w.Widget) else None


class _Calls(ast.NodeVisitor):
    """Widget-factory calls run by a cell's own statements (not inside functions it defines)."""

    def __init__(self, names: dict, modules: dict) -> None:
        self.names, self.modules, self.found = names, modules, []

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module and node.module.startswith("course_lib.widgets"):
            for alias in node.names:
                module = importlib.import_module(node.module)
                target = getattr(module, alias.name, None)
                if target is None:  # a submodule: from course_lib.widgets import quiz
                    target = importlib.import_module(f"{node.module}.{alias.name}")
                (self.modules if isinstance(target, type(module)) else self.names)[alias.asname or alias.name] = target

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.startswith("course_lib.widgets.") and alias.asname:
                self.modules[alias.asname] = importlib.import_module(alias.name)

    def visit_Call(self, node: ast.Call) -> None:
        func, target = node.func, None
        if isinstance(func, ast.Name):
            target = self.names.get(func.id)
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in self.modules:
            target = getattr(self.modules[func.value.id], func.attr, None)
        if target is not None and widget_class(target) is not None:
            self.found.append(target)
        self.generic_visit(node)

    def visit_FunctionDef(self, node) -> None:
        pass

    visit_AsyncFunctionDef = visit_Lambda = visit_ClassDef = visit_FunctionDef


def widget_factory_calls(sources: list[str]) -> list[list]:
    """For each cell's source, in order, the widget factories (classes and functions) it calls;
    imports carry over from cell to cell, as in a kernel."""
    names, modules, calls = {}, {}, []
    for source in sources:
        visitor = _Calls(names, modules)
        try:
            visitor.visit(ast.parse(source))
        except SyntaxError:  # IPython syntax: nbval reports the cell itself
            pass
        calls.append(visitor.found)
    return calls


def probe_lesson(cells: list[dict], budget_s: float) -> dict:
    """Drive the widgets the lesson displayed. ``cells``: in order, each code cell's ``cell``
    number, ``source``, displayed ``model_ids`` and whether it ``failed``. Returns the timed
    ``events``, the cells that call a widget factory but displayed no widget, and each displayed
    widget's ``static_view.static_html`` taken before the first move (``snapshots``, by model id)."""
    instances, seen = _instances(), set()
    shown = dict.fromkeys(model for cell in cells for model in cell["model_ids"] if model in instances)
    # before any control moves: what the website shows of each widget (course_lib.book)
    result = {"events": [], "undisplayed": [], "snapshots": {model: static_html(instances[model]) for model in shown}}
    for cell, factories in zip(cells, widget_factory_calls([cell["source"] for cell in cells])):
        names = [factory.__name__ for factory in factories]
        models = [model for model in dict.fromkeys(cell["model_ids"]) if model in instances and model not in seen]
        if names and not cell["model_ids"]:
            result["undisplayed"].append({"cell": cell["cell"], "factories": names, "failed": cell["failed"]})
        for model in models:
            seen.add(model)
            root = instances[model]
            made_by = [name for name in names if name != type(root).__name__]
            plain = type(root).__module__.startswith("ipywidgets")  # made by a function: name it
            label = f"Cell {cell['cell']} {type(root).__name__}" + (f" from {made_by[0]}" if plain and made_by else "")
            result["events"] += drive(root, label, budget_s)
    return result
