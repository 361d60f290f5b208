"""A displayed widget as static HTML: what it shows before anyone moves a control, for the website.

A page without a kernel cannot run a widget, and a notebook output that only names a widget
model renders as an empty box (or as the widget's repr). ``static_html(widget)`` walks the
widget's tree as it stands and writes what each part shows: boxes as rows and columns, HTML
and labels as they are, images inline, an ``Output``'s outputs (a ``PlotlyPane``'s figure stays
interactive, drawn by plotly.js, which the page must load), and each control as its
description and current value, drawn as a control that cannot be moved. A note above the whole
says where to move the controls. ``static_outputs(outputs, snapshots)`` puts those snapshots in
place of a cell's widget views, and draws a figure the cell returned the same way.

Invariants: nothing is read from the kernel's state but the widgets' traits (no callback runs,
no control is moved); every text is HTML-escaped except the HTML a widget or an output already
holds; a widget kind it does not know shows nothing rather than its repr.
"""

from __future__ import annotations

import base64
import html

import ipywidgets as w
import plotly.io as pio

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
PLOTLY = "application/vnd.plotly.v1+json"
NOTE = ("Interactive in JupyterLab: this is what the lesson shows before any control moves. "
        "To move the controls, run the course with <code>./course lab</code>.")


def plotly_html(figure: dict) -> str:
    """One plotly figure (its JSON dict) as a div that plotly.js, loaded by the page, draws, as
    wide as the page's column (a width set for JupyterLab's wider cells is dropped)."""
    layout = {key: value for key, value in figure.get("layout", {}).items() if key != "width"}
    return pio.to_html({**figure, "layout": {**layout, "autosize": True}}, include_plotlyjs=False, full_html=False,
                       config={"responsive": True})


def _data_html(data: dict) -> str:
    """The richest static form of one output's MIME bundle."""
    if PLOTLY in data:
        return plotly_html(data[PLOTLY])
    for kind in ("image/png", "image/jpeg"):
        if kind in data:
            return f"<img alt='figure' src='data:{kind};base64,{data[kind].strip()}'>"
    if "image/svg+xml" in data:
        return data["image/svg+xml"]
    if "text/html" in data:
        return data["text/html"]
    if "text/plain" in data and WIDGET_VIEW not in data:
        return f"<pre>{html.escape(data['text/plain'])}</pre>"
    return ""


def _output_html(output: dict) -> str:
    if output.get("output_type") == "stream":
        return f"<pre>{html.escape(output.get('text', ''))}</pre>"
    if output.get("output_type") == "error":
        return f"<pre>{html.escape(output.get('ename', ''))}: {html.escape(output.get('evalue', ''))}</pre>"
    return _data_html(output.get("data", {}))


def _labelled(widget: w.Widget, shown: str) -> str:
    label = getattr(widget, "description", "") or ""
    label = f"<span class='course-control-label'>{html.escape(label)}</span> " if label else ""
    return f"<div class='course-control'>{label}{shown}</div>"


def _value_text(widget: w.Widget) -> str:
    if isinstance(widget, (w.SelectionSlider, w.Dropdown, w.RadioButtons, w.ToggleButtons, w.Select)):
        return str(widget.label)
    if isinstance(widget, (w.SelectionRangeSlider, w.SelectMultiple)):
        return ", ".join(str(label) for label in widget.label)
    if getattr(widget, "readout_format", None) and isinstance(widget.value, (int, float)):
        return format(widget.value, widget.readout_format)  # the slider's own readout: '32,000', '0.70'
    return str(getattr(widget, "value", ""))


def _control_html(widget: w.Widget) -> str:
    if isinstance(widget, w.Button):
        return f"<button class='course-control-button' disabled>{html.escape(widget.description)}</button>"
    if isinstance(widget, (w.Checkbox, w.ToggleButton)):
        mark = "☑" if widget.value else "☐"
        return _labelled(widget, f"<span class='course-control-value'>{mark}</span>")
    if isinstance(widget, (w.Text, w.Textarea)):
        return _labelled(widget, f"<textarea class='course-control-text' disabled rows='2' placeholder="
                                 f"'{html.escape(widget.placeholder, quote=True)}'>{html.escape(widget.value)}</textarea>")
    if isinstance(widget, (w.ToggleButtons, w.RadioButtons)):
        choices = "".join(f"<span class='course-choice{' course-chosen' if label == widget.label else ''}'>"
                          f"{html.escape(str(label))}</span>" for label in widget._options_labels)
        return _labelled(widget, choices)
    if getattr(widget, "readout", True) is False:  # no readout: the value shows elsewhere (a label beside it)
        return _labelled(widget, "")
    return _labelled(widget, f"<span class='course-control-value'>{html.escape(_value_text(widget))}</span>")


def _hidden(widget: w.Widget) -> bool:
    layout = getattr(widget, "layout", None)
    return layout is not None and (layout.display == "none" or layout.visibility == "hidden")


def _tree_html(widget: w.Widget) -> str:
    """One widget and its children, as they stand; a hidden part shows nothing."""
    if _hidden(widget):
        return ""
    if isinstance(widget, w.Output):
        return "".join(_output_html(output) for output in widget.outputs)
    if isinstance(widget, (w.Tab, w.Accordion)):
        titles = [widget.get_title(i) if hasattr(widget, "get_title") else "" for i in range(len(widget.children))]
        return "".join(f"<div class='course-section'><b>{html.escape(title or '')}</b>{_tree_html(child)}</div>"
                       for title, child in zip(titles, widget.children))
    if isinstance(widget, w.Box):
        direction = "row" if isinstance(widget, w.HBox) else "column"
        return (f"<div class='course-box' style='display:flex;flex-direction:{direction};gap:4px;flex-wrap:wrap'>"
                + "".join(_tree_html(child) for child in widget.children) + "</div>")
    if isinstance(widget, (w.HTML, w.HTMLMath)):
        return f"<div>{widget.value}</div>"
    if isinstance(widget, w.Label):
        return f"<div>{html.escape(widget.value)}</div>"
    if isinstance(widget, w.Image):
        encoded = base64.b64encode(bytes(widget.value)).decode()
        return f"<img alt='figure' src='data:image/{widget.format};base64,{encoded}'>"
    if isinstance(widget, (w.ValueWidget, w.Button)):
        return _control_html(widget)
    return ""


def static_html(widget: w.Widget) -> str:
    """The widget as it stands, under the note that says where it moves."""
    return f"<div class='course-widget'><p class='course-widget-note'>{NOTE}</p>{_tree_html(widget)}</div>"


def static_outputs(outputs: list[dict], snapshots: dict[str, str]) -> list[dict]:
    """A cell's outputs for a page without a kernel: a widget view becomes its snapshot
    (``snapshots``: model id -> ``static_html`` taken in the kernel; a view without one is
    dropped), a plotly figure becomes its div; the rest is kept as it is."""
    static = []
    for output in outputs:
        data = output.get("data", {})
        if WIDGET_VIEW in data:
            snapshot = snapshots.get(data[WIDGET_VIEW].get("model_id"))
            if snapshot is None:
                continue
            data = {"text/html": snapshot}
        elif PLOTLY in data:
            data = {"text/html": plotly_html(data[PLOTLY])}
        else:
            static.append(output)
            continue
        static.append({"output_type": "display_data", "data": data, "metadata": {}})
    return static
