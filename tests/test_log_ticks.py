"""Log-axis ticks from the data: labelled in one style, never a pile of minor labels."""

import plotly.graph_objects as go
import pytest

from course_lib.widgets.log_ticks import label_log_axis, log_tick_values, si_tick


def test_wide_spans_get_powers_of_ten_and_narrow_ones_one_two_five():
    assert log_tick_values(0.3, 2e4) == [1, 10, 100, 1000, 10000]
    assert log_tick_values(2e9, 3e11) == [2e9, 5e9, 1e10, 2e10, 5e10, 1e11, 2e11]  # under two decades
    assert log_tick_values(22, 28) == [22, 28]  # no round value inside: the ends
    with pytest.raises(ValueError, match="0 < low <= high"):
        log_tick_values(0, 10)


def test_si_labels_are_short_and_plain():
    assert [si_tick(v) for v in (2e12, 5e8, 1e15, 20)] == ["2T", "500M", "1P", "20"]


def test_an_axis_gets_ticks_from_every_trace():
    fig = go.Figure(go.Scatter(x=[1, 2], y=[3e9, 1.5e11]))
    fig.add_scatter(x=[1, 2], y=[2.5e11, 2.6e11])
    fig.update_yaxes(type="log")
    label_log_axis(fig, "y", si_tick)
    assert fig.layout.yaxis.tickmode == "array" and fig.layout.yaxis.ticktext[-1] == "200G"
    assert fig.layout.yaxis.ticktext[0] == "5G"


def test_a_narrow_axis_still_gets_two_ticks_inside_its_data():
    """200 to 290 µs holds one whole multiple (200): the rounded ends join it, never a tick outside."""
    assert log_tick_values(200, 290) == [200, 290]
    assert log_tick_values(100.001, 267) == [110, 200, 260]
    assert log_tick_values(5, 5) == [5]
