"""The plotly pane holds its figure as widget state, and a labelled line sits where it is drawn."""

import base64
import json
import math

import plotly.graph_objects as go
import pytest

from course_lib.widgets.plotly_marks import axis_coordinate, mark_x
from course_lib.widgets.plotly_pane import PlotlyPane

PLOTLY_MIME = "application/vnd.plotly.v1+json"


def _figure(title: str, xs=(1, 10, 100)) -> go.Figure:
    fig = go.Figure(go.Scatter(x=list(xs), y=[2, 4, 8], name="line"))
    fig.update_layout(title=title)
    return fig


def test_the_pane_holds_exactly_the_last_figure_as_plotly_display_data():
    pane = PlotlyPane()
    assert pane.outputs == () and pane.data == () and pane.figure is None
    pane.show(_figure("first"))
    second = _figure("second", xs=(3, 30, 300))
    pane.show(second)
    (output,) = pane.outputs  # replaced, never appended
    assert output["output_type"] == "display_data" and set(output["data"]) == {PLOTLY_MIME}
    shown = output["data"][PLOTLY_MIME]
    assert shown["layout"]["title"]["text"] == "second" and list(shown["data"][0]["x"]) == [3, 30, 300]
    assert pane.figure is second and pane.data[0].name == "line"
    json.dumps(pane.get_state()["outputs"])  # plain JSON: it travels to the browser as widget state


def test_numpy_values_become_plain_json():
    """NumPy arrays go out as plotly's typed-array JSON ({dtype, bdata: base64}), which plotly.js reads."""
    np = pytest.importorskip("numpy")
    pane = PlotlyPane(go.Figure(go.Scatter(x=np.arange(3), y=np.array([1.5, 2.5, 3.5]))))
    y = json.loads(json.dumps(pane.outputs[0]["data"][PLOTLY_MIME]))["data"][0]["y"]
    assert np.frombuffer(base64.b64decode(y["bdata"]), dtype=y["dtype"]).tolist() == [1.5, 2.5, 3.5]


def test_a_mark_on_a_log_axis_labels_the_line_at_its_own_value():
    """Plotly reads an annotation's x on a log axis as log10 of the value: 295 must be sent as
    2.47, or the axis stretches to 10^295 to reach the label."""
    fig = _figure("roofline", xs=(0.5, 50, 5000))
    fig.update_xaxes(type="log")
    mark_x(fig, 295, "ridge 295 FLOP/byte", left=True)
    (line,) = fig.layout.shapes
    (label,) = fig.layout.annotations
    assert line.x0 == line.x1 == 295  # a shape is placed by value
    assert label.x == pytest.approx(math.log10(295)) and label.text == "ridge 295 FLOP/byte"
    assert label.xanchor == "right" and label.yref == "paper"


def test_a_mark_on_a_linear_axis_keeps_its_value():
    fig = _figure("timeline")
    mark_x(fig, 42, "here")
    assert fig.layout.annotations[0].x == 42 and fig.layout.shapes[0].x0 == 42


def test_a_log_axis_cannot_mark_zero():
    fig = _figure("log")
    fig.update_xaxes(type="log")
    with pytest.raises(ValueError, match="positive"):
        axis_coordinate(fig, 0)
