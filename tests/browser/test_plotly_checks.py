"""The figure checks themselves: each defect they exist for is reported, a good figure is not."""

import json
from pathlib import Path

from .plotly_checks import FIGURES_ON_PAGE, figure_problems


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


def test_the_page_reader_measures_a_timeline_bar_from_its_base(browser):
    """``FIGURES_ON_PAGE`` run on plotly.js itself: a horizontal bar drawn from a base (module
    07's DDP timeline) spans base ... base + length, so an axis fitted to the bars reads right,
    and a stretched one is still reported."""
    import plotly
    import plotly.graph_objects as go

    script = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    page = browser.new_page()
    try:
        page.set_content("<div class='jp-RenderedPlotly'><div id='plot'></div></div>")
        page.add_script_tag(path=str(script))
        records = []
        for x_range in (None, [0, 400]):
            figure = go.Figure(go.Bar(y=["bucket 0", "bucket 1"], x=[1.0, 27.0], base=[20.0, 30.0], orientation="h"))
            figure.update_layout(title="One DDP step", xaxis_title="time (ms)", yaxis_title="")
            if x_range:
                figure.update_xaxes(range=x_range)
            page.evaluate("spec => Plotly.newPlot('plot', spec.data, spec.layout)", json.loads(figure.to_json()))
            (record,) = page.evaluate(FIGURES_ON_PAGE)
            records.append(record)
    finally:
        page.close()
    fitted, stretched = records
    assert (fitted["axes"]["xaxis"]["low"], fitted["axes"]["xaxis"]["high"]) == (20.0, 57.0)
    assert figure_problems(fitted) == []
    assert "runs 0 to 400" in figure_problems(stretched)[0]
