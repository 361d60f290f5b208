"""Module 04's simulation widgets: the disaggregation comparison and the speculation QPS sweep."""

import re
import time

import pytest

from course_lib.engine.simulated_speculation import SimulatedSpeculation
from course_lib.engine.speculation_grid import ACCEPTANCE_RATES, DRAFT_COUNTS, DRAFTERS, grid_speculation, lookup
from course_lib.engine.speculation_sweep import SweepPoint
from course_lib.perf.serving import expected_tokens_per_step
from course_lib.perf.units import format_number
from course_lib.widgets import serving_simulations
from course_lib.widgets.serving_simulations import (DisaggregationExplorer, SpeculationSweepExplorer, sweep_figure,
                                                     sweep_verdict)
from tests.plotly_extents import decades_beyond, figure_extents

E_NOTATION = re.compile(r"\de[+-]?\d")


def test_disaggregation_explorer_shows_the_tail_gap_and_redraws():
    explorer = DisaggregationExplorer(document_tokens=8000)
    before, after = explorer.comparison.table("chat")["itl_max_ms"]
    assert after < before / 3  # the decode pool never runs a prefill chunk
    assert f"{format_number(before)} ms colocated, {format_number(after)} ms" in explorer.readout.value
    assert "<table>" in explorer.readout.value and "tokens/s to finish (all requests)" in explorer.readout.value
    explorer.prefill.value = 1
    assert "<b>8,000-token documents; 1 prefill + 2 decode GPUs against 3 colocated; KV sent layer by layer</b>" \
        in explorer.readout.value
    assert not E_NOTATION.search(explorer.readout.value)


def test_the_disaggregation_table_says_whose_latency_it_shows():
    """The headline is the chat users' worst gap; the table's latency rows are the chat users' too."""
    explorer = DisaggregationExplorer(document_tokens=8000)
    chat = explorer.comparison.table("chat")
    total = len(explorer.comparison.colocated.requests)
    assert total > 32 and f"Latency of the 32 chat requests (of {total} in the workload)" in explorer.readout.value
    assert f"<td>worst ITL gap (ms)</td><td>{format_number(chat['itl_max_ms'][0])}</td>" in explorer.readout.value
    assert f"<td>TTFT P99 (ms)</td><td>{format_number(chat['ttft_p99_ms'][0])}</td>" in explorer.readout.value


def test_while_the_disaggregation_simulates_the_readout_names_the_new_settings_not_old_numbers(monkeypatch):
    explorer = DisaggregationExplorer(document_tokens=8000)
    shown_while_running = []

    def compare(*args, **kwargs):
        shown_while_running.append(explorer.readout.value)
        return original(*args, **kwargs)

    original = serving_simulations.compare_disaggregation
    monkeypatch.setattr(serving_simulations, "compare_disaggregation", compare)
    explorer.decode.value = 3
    [during] = shown_while_running
    assert "Simulating 8,000-token documents; 2 prefill + 3 decode GPUs" in during and "ms colocated" not in during
    assert "2 prefill + 3 decode GPUs against 5 colocated" in explorer.readout.value


def test_the_sweep_explorer_finds_where_speculation_stops_paying():
    explorer = SpeculationSweepExplorer()
    assert explorer.points[0].speedup > 1 > explorer.points[-1].speedup
    assert "stops paying at about" in explorer.readout.value
    assert explorer.figure.figure.layout.xaxis.type == "log"
    explorer.rate.value = 0.95
    assert explorer.points[0].speedup > 2  # nearly every draft accepted, at a memory-bound load


def test_the_sweep_readout_names_its_setting_and_matches_the_formula():
    """The readout once said 7.33 tokens per step under a = 0.50 (a stale run); (1 - a^5) / (1 - a)
    is 1.94 there. Each change shows its own setting's sweep, named, at once."""
    explorer = SpeculationSweepExplorer(acceptance_rate=0.7, num_speculative_tokens=4)
    for control, value, shown, rate, k, drafter in (
            (explorer.rate, 0.5, "a = 0.50, k = 4, Llama-3.2-1B draft model", 0.5, 4, DRAFTERS[0]),
            (explorer.k, 8, "a = 0.50, k = 8, Llama-3.2-1B draft model", 0.5, 8, DRAFTERS[0]),
            (explorer.drafter, "n-gram lookup (free drafts)", "a = 0.50, k = 8, n-gram lookup", 0.5, 8, DRAFTERS[1])):
        started = time.perf_counter()
        control.value = value
        assert time.perf_counter() - started < 1.0, f"{control.description} took over a second"
        assert f"<b>Showing {shown}" in explorer.readout.value
        assert explorer.points == lookup(rate, k, drafter)
        expected = expected_tokens_per_step(rate, k)
        assert explorer.points[0].tokens_per_step == pytest.approx(expected, rel=0.03)
        assert f"= {expected:.2f}." in explorer.readout.value
        title = explorer.figure.figure.layout.title.text
        assert f"k = {k}, a = {rate:g}" in title


def test_a_typed_acceptance_rate_off_the_grid_shows_the_nearest_setting_and_says_so():
    explorer = SpeculationSweepExplorer()
    explorer.rate.value = 0.33
    assert "<b>Showing a = 0.35," in explorer.readout.value and explorer.speculation.acceptance_rate == 0.35
    with pytest.raises(ValueError, match="acceptance rates 0.30 to 0.95"):
        SpeculationSweepExplorer(acceptance_rate=0.42)


def test_the_sweep_controls_cover_exactly_the_grid():
    explorer = SpeculationSweepExplorer()
    assert (explorer.rate.min, explorer.rate.max, explorer.rate.step) == (ACCEPTANCE_RATES[0], ACCEPTANCE_RATES[-1], 0.05)
    assert (explorer.k.min, explorer.k.max) == (DRAFT_COUNTS[0], DRAFT_COUNTS[-1])
    assert list(explorer.DRAFTERS.values()) == list(DRAFTERS)


@pytest.mark.parametrize("drafter", DRAFTERS, ids=["draft model", "n-gram"])
def test_every_sweep_figure_spans_its_request_rates(drafter):
    """The crossover's label sits at its QPS in data units: the x axis stays within the swept
    1-64 QPS (a label at x = 26 on a log axis would sit at 10^26), the y axis near the speed-ups."""
    for k in DRAFT_COUNTS:
        for rate in ACCEPTANCE_RATES:
            fig = sweep_figure(lookup(rate, k, drafter), grid_speculation(rate, k, drafter))
            low, high = figure_extents(fig)["x"]
            assert 1 <= low and high <= 64, (rate, k, drafter)
            assert decades_beyond(fig, ("speed-up",), "x") <= 2


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
