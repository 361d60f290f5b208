"""Module 04's simulation widgets: the disaggregation comparison and the speculation QPS sweep."""

import json
import re
import time

import pytest

from course_lib.engine import disaggregation_grid
from course_lib.engine.disaggregated import long_prompts_among_chats
from course_lib.engine.precomputed_grid import grid_json
from course_lib.engine.simulated_speculation import SimulatedSpeculation
from course_lib.engine.speculation_grid import ACCEPTANCE_RATES, DRAFT_COUNTS, DRAFTERS, grid_speculation, lookup
from course_lib.engine.speculation_sweep import SweepPoint
from course_lib.perf.serving import expected_tokens_per_step
from course_lib.perf.units import format_number
from course_lib.widgets.serving_simulations import (DisaggregationExplorer, SpeculationSweepExplorer, sweep_figure,
                                                     sweep_verdict)
from tests.plotly_extents import decades_beyond, figure_extents

E_NOTATION = re.compile(r"\de[+-]?\d")


def test_disaggregation_explorer_shows_the_tail_gap_and_redraws():
    explorer = DisaggregationExplorer(document_tokens=8000)
    before, after = explorer.summary.table("chat")["itl_max_ms"]
    assert after < before / 3  # the decode pool never runs a prefill chunk
    assert f"{format_number(before)} ms colocated, {format_number(after)} ms" in explorer.readout.value
    assert "<table" in explorer.readout.value and "output tokens / time to finish" in explorer.readout.value
    explorer.prefill.value = 1
    assert "<b>8,000-token documents; 1 prefill GPU + 2 decode GPUs against 3 colocated; KV sent layer by layer</b>" \
        in explorer.readout.value
    assert not E_NOTATION.search(explorer.readout.value)


def test_the_disaggregation_table_says_whose_latency_it_shows():
    """The headline is the chat users' worst gap; the table's latency rows are the chat users' too."""
    explorer = DisaggregationExplorer(document_tokens=8000)
    chat = explorer.summary.table("chat")
    total = explorer.summary.colocated.requests
    assert total > 32 and f"Latency of the 32 chat requests (of {total} in the workload)" in explorer.readout.value
    cells = re.sub(r"<(t[dh])[^>]*>", r"<\1>", explorer.readout.value)
    assert f"<td>worst ITL gap (ms)</td><td>{format_number(chat['itl_max_ms'][0])}</td>" in cells
    assert f"<td>TTFT P99 (ms)</td><td>{format_number(chat['ttft_p99_ms'][0])}</td>" in cells


def test_the_disaggregation_explorer_answers_every_control_from_the_grid_without_simulating(monkeypatch):
    """A live comparison took 0.8-1.4 s of CPU on a slow 2-core machine, over the 1 s a control
    may take: every move is now a lookup of the same comparison run ahead."""
    explorer = DisaggregationExplorer(document_tokens=8000)

    def refuse(*args, **kwargs):
        raise AssertionError("the explorer simulated instead of looking its setting up")

    monkeypatch.setattr(disaggregation_grid, "compare_disaggregation", refuse)
    for control, value in ((explorer.document, 32000), (explorer.prefill, 4), (explorer.decode, 1),
                           (explorer.pipelined, False), (explorer.document, 1000)):
        started = time.perf_counter()
        control.value = value
        assert time.perf_counter() - started < 0.2
        assert f"<b>{explorer.settings()}</b>" in explorer.readout.value
    assert "1,000-token documents; 4 prefill GPUs + 1 decode GPU against 5 colocated; KV sent after each prefill" \
        in explorer.readout.value
    assert [label for label, _ in explorer.document.options][::3] == ["1,000", "8,000", "20,000", "32,000"]


def test_a_disaggregation_setting_off_the_grid_is_refused_with_the_grid_named():
    with pytest.raises(ValueError, match=r"documents of 1,000, 2,000, 4,000.*32,000 tokens and 1 to 4 GPUs"):
        DisaggregationExplorer(document_tokens=3000)
    with pytest.raises(ValueError, match="run compare_disaggregation"):
        disaggregation_grid.lookup(16000, 5, 2, True)


def test_the_disaggregation_grid_holds_every_setting_and_equals_live_runs():
    """The shipped file against compare_disaggregation run now, at the corners and the lesson's
    setting (six significant digits stored)."""
    grid = disaggregation_grid.load_grid()
    assert list(grid) == [disaggregation_grid.grid_key(*s) for s in disaggregation_grid.grid_settings()]
    assert len(grid) == 10 * 4 * 4 * 2
    text = disaggregation_grid.GRID_PATH.read_text()
    assert grid_json(json.loads(text), "summaries") == text  # one setting per line, as recompute_main writes it
    for setting in ((16000, 2, 2, True), (32000, 4, 1, False), (1000, 1, 4, True)):
        assert disaggregation_grid.run_setting(*setting).rounded() == disaggregation_grid.lookup(*setting)


def test_the_summary_keeps_one_tag_and_says_so():
    summary = disaggregation_grid.lookup(16000, 2, 2, True)
    assert summary.table("chat") is summary.rows
    with pytest.raises(ValueError, match="kept the rows of the 'chat' requests only"):
        summary.table(None)


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


def test_the_sweep_readout_says_slower_when_speculation_loses_at_qps_1():
    """a = 0.30, k = 8 with the draft model loses even at QPS 1: the readout once said '0.94x
    faster'; a loss is worded as 'slower', by its inverse."""
    explorer = SpeculationSweepExplorer(acceptance_rate=0.3, num_speculative_tokens=8)
    low = explorer.points[0]
    assert low.speedup < 1
    assert f"QPS {low.qps:g}: <b>{1 / low.speedup:.2f}x slower</b> per token" in explorer.readout.value
    assert "x faster" not in explorer.readout.value.replace(f"{1 / low.speedup:.2f}x slower", "")


def test_the_sweep_axis_labels_only_the_swept_rates():
    """Plotly's own log ticks labelled '8 9 1 2 3 ... 8 9 10 2 ...': only the QPS swept are ticks."""
    explorer = SpeculationSweepExplorer()
    axis = explorer.figure.figure.layout.xaxis
    assert axis.tickmode == "array" and list(axis.tickvals) == [p.qps for p in explorer.points]
    assert list(axis.ticktext) == ["1", "2", "4", "8", "16", "32", "64"]


def test_the_disaggregation_table_keeps_its_columns_apart_and_says_how_its_ratio_divides():
    """Its headers once ran together ('colocated, 4 GPUsdisaggregated, ...') and the ratio column
    did not say which way it divides."""
    explorer = DisaggregationExplorer(document_tokens=8000)
    html = explorer.readout.value
    headers = re.findall(r"<th style='([^']*)'>([^<]*)</th>", html)
    assert [text for _, text in headers][1:] == ["colocated, 4 GPUs", "disaggregated, 2 prefill GPUs + 2 decode GPUs",
                                                 "ratio: disaggregated ÷ colocated"]
    assert all("padding" in style for style, _ in headers)
    table = explorer.summary.table("chat")
    assert f">{table['itl_max_ms'][1] / table['itl_max_ms'][0]:.2f}</td>" in html
    assert ("32,000", 32000) in explorer.document.options  # 32,000 on the slider, as in the text


def test_one_gpu_per_pool_is_singular():
    explorer = DisaggregationExplorer(document_tokens=2000, num_prefill=1, num_decode=1)
    assert "1 prefill GPU + 1 decode GPU against 2 colocated" in explorer.readout.value
    assert "disaggregated, 1 prefill GPU + 1 decode GPU" in explorer.readout.value and "GPUs</th>" in explorer.readout.value


def test_every_document_length_is_compared_on_the_same_chats_and_follow_ups():
    """58 requests at 16,000 tokens, 66 at 32,000: the follow-ups were drawn after the documents'
    tokens, so the length changed them. Now only the documents' prompts change."""
    short, long = (long_prompts_among_chats(n) for n in (1000, 32000))
    assert len(short) == len(long)
    others = [[r for r in workload if r.tag != "document"] for workload in (short, long)]
    assert others[0] == others[1]
    documents = [[r for r in workload if r.tag == "document"] for workload in (short, long)]
    assert [r.arrival_time for r in documents[0]] == [r.arrival_time for r in documents[1]] == [1.0, 2.0, 3.0, 4.0]
    assert {len(r.prompt_token_ids) for r in documents[1]} == {32000}


@pytest.mark.parametrize("document_tokens", [1000, 16000, 32000])
def test_the_readout_says_what_the_time_to_finish_measures_computed(document_tokens):
    """At 32,000-token documents the split finished the workload sooner (more output tokens per
    second) while the lesson said throughput barely moves: the row is how soon this workload was
    done, set by its last chat stream's first token and gaps, not capacity. The readout says so
    with this run's numbers, whichever layout wins."""
    explorer = DisaggregationExplorer(document_tokens=document_tokens)
    summary, text = explorer.summary, explorer.readout.value
    ratio = summary.table("chat")["output_tokens_per_s"]
    assert f"Output tokens / time to finish, disaggregated ÷ colocated: {ratio[1] / ratio[0]:.2f}." in text
    for finish in (summary.colocated, summary.disaggregated):
        assert finish.last_token_s == finish.duration_s and finish.last_tag == "chat"
        assert finish.last_output_tokens == 1000
        assert f"then gaps of {format_number(finish.last_mean_gap_ms)} ms on average" in text
    assert "not how many the GPUs could serve" in text


def test_the_split_finishes_sooner_the_longer_the_documents():
    """What lesson 04 says of the slider: with short documents the colocated layout finishes the
    workload first, with long ones the split does, by more the longer they are."""
    explorer = DisaggregationExplorer()
    ratios = []
    for tokens in (1000, 8000, 16000, 24000, 32000):
        explorer.document.value = tokens
        ratios.append(explorer.summary.colocated.duration_s / explorer.summary.disaggregated.duration_s)
    assert ratios[0] < 1 < ratios[-1] and ratios == sorted(ratios)
