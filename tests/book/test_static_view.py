"""What the website shows of a widget and of a lesson run: the widget as it first stood (controls
with their values, readouts, figures), never a repr, never a hidden part; the executed copy
holds the run's outputs and knows which lesson file it ran."""

from __future__ import annotations

import base64
import json

import ipywidgets as w
import nbformat
import plotly.graph_objects as go
import pytest

from course_lib.book.executed import fresh, write_executed
from course_lib.widgets.plotly_pane import PlotlyPane
from course_lib.widgets.serving_simulations import DisaggregationExplorer
from course_lib.widgets.staff_answer import StaffAnswer
from course_lib.widgets.static_view import NOTE, WIDGET_VIEW, static_html, static_outputs


def test_controls_show_their_values_as_the_slider_reads_them():
    explorer = DisaggregationExplorer(document_tokens=8000, num_prefill=3, num_decode=1)
    page = static_html(explorer)
    assert NOTE in page and "./course lab" in page
    for label, value in (("prefill GPUs", "3"), ("decode GPUs", "1"), ("send KV layer by layer", "☑")):
        assert f"<span class='course-control-label'>{label}</span> <span class='course-control-value'>{value}</span>" \
            in page
    # a selection slider shows no readout of its own: the plain label beside it names the choice, once
    assert "<span class='course-control-label'>document prompt (tokens)</span> </div><div>8,000</div>" in page
    assert page.count("8,000") == 1 + explorer.readout.value.count("8,000")
    assert explorer.readout.value in page  # the readout's own HTML, numbers included
    assert "DisaggregationExplorer(" not in page and "IntSlider(" not in page


def test_a_plotly_pane_stays_an_interactive_figure_and_an_image_stays_inline():
    figure = go.Figure(go.Scatter(x=[1, 2, 3], y=[4, 1, 9], name="the trace"))
    png = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")
    page = static_html(w.VBox([PlotlyPane(figure), w.Image(value=png, format="png")]))
    assert "Plotly.newPlot" in page and '"the trace"' in page
    assert f"data:image/png;base64,{base64.b64encode(png).decode()}" in page


def test_a_hidden_part_and_an_unrevealed_staff_answer_never_show():
    staff = StaffAnswer("Why page the KV cache?", "THE STAFF ANSWER TEXT", "what to compare")
    hidden = w.HTML("SECRET", layout=w.Layout(display="none"))
    page = static_html(w.VBox([staff, hidden]))
    assert "Why page the KV cache?" in page and "Compare with the staff answer" in page
    assert "THE STAFF ANSWER TEXT" not in page and "SECRET" not in page


def test_cell_outputs_keep_text_and_take_the_snapshot_in_place_of_the_view():
    figure = go.Figure(go.Bar(x=["a"], y=[1]))
    outputs = [{"output_type": "stream", "name": "stdout", "text": "printed\n"},
               {"output_type": "display_data", "metadata": {},
                "data": {WIDGET_VIEW: {"model_id": "m1", "version_major": 2, "version_minor": 0},
                         "text/plain": "Explorer(children=...)"}},
               {"output_type": "display_data", "metadata": {},
                "data": {WIDGET_VIEW: {"model_id": "gone"}, "text/plain": "Gone(...)"}},
               {"output_type": "display_data", "metadata": {}, "data": {
                   "application/vnd.plotly.v1+json": json.loads(figure.to_json()), "text/html": "<div>old</div>"}}]
    static = static_outputs(outputs, {"m1": "<div>SNAPSHOT</div>"})
    assert static[0] == outputs[0]
    assert static[1]["data"] == {"text/html": "<div>SNAPSHOT</div>"}
    assert len(static) == 3  # a view with no snapshot is dropped, never shown as its repr
    assert "Plotly.newPlot" in static[2]["data"]["text/html"]


def test_the_executed_copy_holds_the_run_and_goes_stale_with_the_lesson(tmp_path):
    lesson = tmp_path / "99_lesson.ipynb"
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Module 99 · x"),
                                               nbformat.v4.new_code_cell("print(1)"), nbformat.v4.new_code_cell("x")])
    nbformat.write(notebook, lesson)
    out = tmp_path / "executed"
    with pytest.raises(ValueError, match="has 2 code cells but 1 were run"):
        write_executed(lesson, [[]], {}, out)
    path = write_executed(lesson, [[{"output_type": "stream", "name": "stdout", "text": "1\n"}], None], {}, out)
    run = nbformat.read(path, as_version=4)
    assert run.cells[1].outputs[0].text == "1\n" and run.cells[2].outputs == []
    assert [cell.source for cell in run.cells] == [cell.source for cell in notebook.cells]
    assert fresh(lesson, out)
    notebook.cells[1].source = "print(2)"
    nbformat.write(notebook, lesson)
    assert not fresh(lesson, out)
