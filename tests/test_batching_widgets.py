"""Module 02's batching explorer: static against continuous batching as output lengths spread out."""

import re

import matplotlib
import pytest

from course_lib.engine.llm import LLM
from course_lib.engine.sampling_params import SamplingParams
from course_lib.perf.hardware import get_gpu
from course_lib.perf.models import get_model
from course_lib.widgets.batching_explorer import (
    SPREADS,
    BatchingExplorer,
    coefficient_of_variation,
    output_lengths,
    plot_spread_sweep,
    serve_both,
    spread_workload,
    sweep_spread,
)

matplotlib.use("Agg")

MODEL, GPU = get_model("Llama-3.1-8B"), get_gpu("H100-80GB")


def test_spread_is_the_coefficient_of_variation_at_a_fixed_mean():
    assert output_lengths(20, 64, 0.0) == [64] * 20
    draws = [output_lengths(64, 64, spread) for spread in (0.5, 1.0, 2.0)]
    for spread, lengths in zip((0.5, 1.0, 2.0), draws):
        assert coefficient_of_variation(lengths) == pytest.approx(spread, abs=0.02)
        assert sum(lengths) / 64 == pytest.approx(64, abs=0.5)
    for smaller, bigger in zip(draws, draws[1:]):  # a bigger spread stretches the same requests: no order flips
        assert not any(smaller[i] < smaller[j] and bigger[i] > bigger[j] for i in range(64) for j in range(64))
    assert output_lengths(64, 64, 1.0, seed=1) != output_lengths(64, 64, 1.0)
    with pytest.raises(ValueError, match="sqrt"):
        output_lengths(4, 64, 2.0)  # 4 requests cannot reach a spread of sqrt(3) or more


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_simulated_schedule_is_the_tiny_engines(policy):
    lengths = output_lengths(7, 12, 1.0)
    simulated = serve_both(lengths, 3, MODEL, GPU)[policy]
    llm = LLM("tiny-llama", max_num_seqs=3, scheduling_policy=policy, max_model_len=64, num_gpu_blocks=64)
    for i, request in enumerate(spread_workload(lengths)):
        llm.add_request(list(request.prompt_token_ids), SamplingParams(temperature=0, max_tokens=request.output_len,
                                                                       ignore_eos=True), request_id=str(i))
    while llm.scheduler.has_unfinished_requests():
        llm.step()
    assert [s.scheduled for s in simulated.steps] == [s.scheduled for s in llm.step_trace]


def test_continuous_gains_grow_with_the_spread():
    ratios = sweep_spread([0.0, 0.5, 1.5], slot_counts=(4, 8), num_requests=32, draws=2)
    for by_spread in ratios.values():
        assert by_spread[0.0] == pytest.approx(1.0)  # equal lengths: both policies schedule identically
        assert 1.2 < by_spread[0.5] < by_spread[1.5]
    fig = plot_spread_sweep(ratios, num_requests=32, mean_output=64)
    assert [trace.name for trace in fig.data] == ["4 slots", "8 slots"]
    assert list(fig.data[1].y) == list(ratios[8].values())
    assert fig.layout.title.text and "(" in fig.layout.xaxis.title.text and "(" in fig.layout.yaxis.title.text
    assert fig.data[1].hovertemplate.startswith("8 slots, spread %{x:.2f}") and "%{y:.2f}x" in fig.data[1].hovertemplate


def ratio_in(readout: str) -> float:
    return float(re.search(r"throughput: ([\d.]+)x", readout).group(1))


def test_explorer_readout_and_timelines_follow_the_sliders():
    explorer = BatchingExplorer(num_slots=4, num_requests=32, mean_output=32, spread=0.0)
    assert ratio_in(explorer.readout.value) == 1.0 and explorer.idle["static"] == pytest.approx(0.0)
    explorer.spread.value = 1.5
    assert ratio_in(explorer.readout.value) > 1.3
    static, continuous = (len(explorer.reports[p].steps) for p in ("static", "continuous"))
    assert static > continuous and explorer.idle["static"] > explorer.idle["continuous"] + 0.2
    assert f"{static:,}" in explorer.readout.value and "measured spread 1.5" in explorer.readout.value
    fig = explorer.draw()
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[0].startswith(f"static batching: {static} steps") and titles[1].startswith("continuous")
    assert all(ax.get_xlabel() == "engine step" and ax.get_ylabel() for ax in fig.axes[1:])
    explorer.num_slots.value = 1  # one slot: nothing to fill, the policies agree
    assert ratio_in(explorer.readout.value) == 1.0
    explorer.num_slots.value = 4
    assert len(explorer.runs) == 3  # the 4-slot run came back from memory


def test_explorer_kept_figure_draws_what_a_new_figure_would():
    explorer = BatchingExplorer()
    explorer.num_slots.value, explorer.mean_output.value = 32, 128  # longer runs: other ticks and margins
    assert explorer.figure.value == BatchingExplorer(num_slots=32, mean_output=128).figure.value
    explorer.num_requests.value, explorer.spread.value = 16, 2.0
    assert explorer.figure.value == BatchingExplorer(num_slots=32, num_requests=16, mean_output=128,
                                                     spread=2.0).figure.value


def test_explorer_spreads_stop_where_the_sweep_does_and_say_when_rounding_moves_them():
    explorer = BatchingExplorer(num_slots=1, num_requests=48, mean_output=8, spread=2.0)
    assert explorer.spread.max == max(SPREADS) == 2.0
    assert "measured spread 1.93: rounding the lengths to whole tokens, at least 1 each, moves it from 2.00" in \
        explorer.readout.value
    assert explorer.plot._suptitle.get_text().startswith("48 requests on 1 slot, ")
    explorer.num_slots.value, explorer.mean_output.value, explorer.spread.value = 8, 64, 1.0
    assert "measured spread 1.00;" in explorer.readout.value and "moves it" not in explorer.readout.value
    assert explorer.plot._suptitle.get_text().startswith("48 requests on 8 slots, ")


def test_explorer_table_cells_are_spaced_and_timelines_share_one_step_scale():
    explorer = BatchingExplorer(num_slots=8, num_requests=64, mean_output=64, spread=1.0)
    headers = re.findall(r"<th([^>]*)>([^<]*)</th>", explorer.readout.value)
    assert [name for _, name in headers] == ["policy", "steps", "idle slot-steps", "output tokens/s"]
    assert all("padding" in style for style, _ in headers)
    static, continuous = explorer.plot.axes
    longest = max(len(report.steps) for report in explorer.reports.values())
    assert static.get_xlim() == continuous.get_xlim() == (-0.5, longest - 0.5)
