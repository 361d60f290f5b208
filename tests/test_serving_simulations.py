"""Module 04's simulation widgets: the disaggregation comparison and the speculation QPS sweep."""

import pytest

from course_lib.engine.simulated_speculation import SimulatedSpeculation
from course_lib.engine.speculation_sweep import SweepPoint
from course_lib.widgets.serving_simulations import (DisaggregationExplorer, SpeculationSweepExplorer, sweep_figure,
                                                     sweep_verdict)


def test_disaggregation_explorer_shows_the_tail_gap_and_redraws():
    explorer = DisaggregationExplorer(document_tokens=8000)
    before, after = explorer.comparison.table("chat")["itl_max_ms"]
    assert after < before / 3  # the decode pool never runs a prefill chunk
    assert f"{before:.0f} ms colocated, {after:.0f} ms" in explorer.readout.value
    assert "<table>" in explorer.readout.value and "tokens/s to finish" in explorer.readout.value
    explorer.prefill.value = 1
    assert "1 prefill + 2 decode GPUs" in explorer.readout.value


def test_the_sweep_explorer_finds_where_speculation_stops_paying():
    explorer = SpeculationSweepExplorer(min_requests=100)
    assert explorer.points[0].speedup > 1 > explorer.points[-1].speedup
    assert "stops paying at about" in explorer.readout.value
    assert explorer.figure.figure.layout.xaxis.type == "log"
    explorer.rate.value = 0.95
    assert explorer.points[0].speedup > 2  # nearly every draft accepted, at a memory-bound load


def test_the_sweep_figure_has_titles_units_and_no_crossing_when_it_always_pays():
    points = [SweepPoint(1, 20.0, 10.0, 3.0, 200, 2.0, 0.0), SweepPoint(4, 20.0, 12.0, 3.0, 200, 8.0, 0.1)]
    fig = sweep_figure(points, SimulatedSpeculation(4, 0.8))
    assert "requests per second" in fig.layout.xaxis.title.text and "(x)" in fig.layout.yaxis.title.text
    assert "n-gram" in fig.layout.title.text
    assert not any("stops paying" in (a.text or "") for a in fig.layout.annotations)
    assert list(fig.data[0].y) == pytest.approx([2.0, 20 / 12])
    assert sweep_verdict(points) == "it pays at every rate up to 4 QPS"
    slower = [SweepPoint(1, 10.0, 12.0, 1.5, 200, 2.0, 0.0), SweepPoint(4, 10.0, 20.0, 1.5, 200, 8.0, 0.9)]
    assert sweep_verdict(slower) == "it never pays here"
    assert "stops paying at about" in sweep_verdict([points[0], slower[1]])
