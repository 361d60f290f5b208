"""The communication-roofline widgets: numbers from course_lib.perf.comm_roofline, redrawn in place."""

import math

from course_lib.perf.comm_roofline import ddp_step, two_node_layouts
from course_lib.widgets.comm_roofline_explorer import (
    GPU_COUNTS,
    CommRooflineCalculator,
    LayoutChooser,
    ddp_scaling_figure,
    ddp_verdict,
)


def test_verdict_follows_the_roofline_test():
    inside, across = ddp_step(8), ddp_step(512)
    assert inside.hidden and not across.hidden
    assert "hidden" in ddp_verdict(inside) and "NVLink" in ddp_verdict(inside)
    assert "communication-bound" in ddp_verdict(across) and "InfiniBand" in ddp_verdict(across)


def test_scaling_figure_plots_each_step_and_stars_the_setting():
    steps = [ddp_step(n) for n in GPU_COUNTS]
    figure = ddp_scaling_figure(steps, highlight=64)
    throughput, comm, latency, backward, star = figure.data
    assert list(throughput.x) == list(GPU_COUNTS) and list(comm.x) == list(GPU_COUNTS[1:])  # 1 GPU: no all-reduce
    assert list(throughput.y) == [s.tokens_per_s_per_gpu for s in steps]
    assert all(total >= part for total, part in zip(comm.y, latency.y))
    assert list(star.x) == [64] and star.y[0] == ddp_step(64).tokens_per_s_per_gpu
    assert "GPUs" in figure.layout.xaxis.title.text and "time" in figure.layout.yaxis2.title.text
    assert list(comm.y) == [s.comm_s for s in steps[1:]]  # seconds, ticks labelled with their unit


def test_the_setting_shows_at_either_end_and_time_ticks_carry_their_unit():
    """At 1 GPU the right-hand axis began exactly at 1, hiding the setting's line; its ticks read '10k' beside
    '1000' (ms)."""
    steps = [ddp_step(n) for n in GPU_COUNTS]
    figure = ddp_scaling_figure(steps, highlight=1)
    for axis in (figure.layout.xaxis, figure.layout.xaxis2):
        low, high = axis.range  # log10 of the GPU counts
        assert low < math.log10(GPU_COUNTS[0]) and high > math.log10(GPU_COUNTS[-1])
    ticks = list(figure.layout.yaxis2.ticktext)
    assert ticks and all(text.endswith(("ns", "µs", "ms", " s")) for text in ticks) and "10 ms" in ticks


def test_calculator_redraws_its_pane_on_every_change():
    calculator = CommRooflineCalculator(num_gpus=1)
    assert "nothing to all-reduce" in calculator.verdict.value
    calculator.num_gpus.value = 8
    pane = calculator.pane
    assert "hidden" in calculator.verdict.value
    calculator.num_gpus.value = 512
    assert "communication-bound" in calculator.verdict.value and calculator.pane is pane
    calculator.all_reduce.value = "tree"  # log N hops instead of 2(N-1): the all-reduce hides again
    assert ddp_step(512, all_reduce="tree").hidden and "hidden" in calculator.verdict.value
    calculator.nics.value = 1  # one NIC per node: the trees cannot add bandwidth
    assert not ddp_step(512, all_reduce="tree", nics_per_node=1).hidden
    assert "communication-bound" in calculator.verdict.value


def test_layout_chooser_gives_feedback_with_the_models_numbers():
    chooser = LayoutChooser()
    assert "Pick the layout" in chooser.feedback.value
    chooser.layout_choice.value = "TP=16"
    tp16 = next(layout for layout in two_node_layouts() if layout.name == "TP=16" and layout.phase == "decode")
    assert "the bug" in chooser.feedback.value and f"{tp16.latency_s * 1e3:.1f} ms" in chooser.feedback.value
    chooser.layout_choice.value = "TP=8 x PP=2"
    assert "A fix" in chooser.feedback.value and "NVLink" in chooser.feedback.value
    chooser.layout_choice.value = "TP=8 x DP=2"
    assert "simplest fix" in chooser.feedback.value
    chooser.phase.value = "prefill"
    assert "prefill<br>the same 4,096 tokens" in chooser.pane.figure.layout.title.text
    assert [bar.name for bar in chooser.pane.data] == ["compute", "TP all-reduces", "PP activation sends"]
