"""The figure checks themselves: each defect they exist for is reported, a good figure is not."""

from .plotly_checks import figure_problems


def _figure(**axes) -> dict:
    return {"drawn": True, "title": "Roofline of H100-80GB", "traces": 3, "tracesWithPoints": 3, "marks": 3,
            "axes": axes}


GOOD_LOG_X = {"type": "log", "title": "arithmetic intensity (FLOP/byte)", "range": [-0.9, 4.2], "count": 12,
              "low": -0.3, "high": 3.6}
GOOD_Y = {"type": "linear", "title": "speed-up (x)", "range": [0.4, 1.7], "count": 7, "low": 0.5, "high": 1.6}


def test_a_figure_that_spans_its_data_reads_right():
    assert figure_problems(_figure(xaxis=GOOD_LOG_X, yaxis=GOOD_Y)) == []


def test_a_log_axis_stretched_by_a_label_in_the_wrong_units_is_reported():
    stretched = GOOD_LOG_X | {"range": [-0.9, 264.0]}  # the ridge label at x = 295 read as 10^295
    (problem,) = figure_problems(_figure(xaxis=stretched))
    assert "10^264.0" in problem and "10^3.6" in problem and "xaxis" in problem


def test_a_linear_axis_far_beyond_its_data_is_reported_but_zero_is_allowed():
    assert figure_problems(_figure(yaxis=GOOD_Y | {"range": [0, 1.7]})) == []
    assert figure_problems(_figure(yaxis=GOOD_Y | {"range": [0, 40]}))


def test_empty_untitled_and_undrawn_figures_are_reported():
    assert figure_problems({"drawn": False}) == ["a plotly figure was never drawn (no layout or data)"]
    empty = _figure(xaxis=GOOD_LOG_X) | {"tracesWithPoints": 0, "marks": 0}
    assert "shows no data" in figure_problems(empty)[0]
    assert "no title" in figure_problems(_figure(xaxis=GOOD_LOG_X) | {"title": ""})[0]
    assert "has no title" in figure_problems(_figure(xaxis=GOOD_LOG_X | {"title": ""}))[0]


def test_a_saved_picture_counts_once_loaded():
    assert figure_problems({"drawn": True, "static": True, "title": "a saved figure"}) == []
    assert figure_problems({"drawn": False, "static": True, "title": "a saved figure"})
