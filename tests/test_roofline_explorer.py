"""Module 04's roofline widget: where the steps land, and the figure a learner reads values off."""

from course_lib.perf.hardware import get_gpu
from course_lib.perf.models import get_model
from course_lib.perf.roofline import ridge_point
from course_lib.widgets.roofline_explorer import RooflineExplorer, gpu_roofline, step_points


def test_long_prefills_are_compute_bound_and_small_decodes_memory_bound():
    points = {p.label: p for p in step_points(get_model("Llama-3.1-8B"), get_gpu("H100-80GB"))}
    assert points["prefill of 4,096 tokens"].cost.bound == "compute"
    assert points["decode, batch 1 at 1,024 tokens of context"].cost.bound == "memory"
    # batch-1 decode reads every weight for about 2 FLOPs each: about 1 FLOP per bf16 byte
    assert 0.9 < points["decode, batch 1 at 1,024 tokens of context"].cost.arithmetic_intensity < 1.2
    # a bigger batch raises the intensity, but every sequence's KV read keeps it below H100's ridge at 1K context
    decodes = [p.cost.arithmetic_intensity for p in points.values() if p.phase == "decode"]
    assert decodes == sorted(decodes) and decodes[-1] < ridge_point(get_gpu("H100-80GB"))


def test_the_figure_is_log_log_with_titled_axes_and_hover_text():
    fig = gpu_roofline(get_model("Llama-3.1-8B"), get_gpu("A100-80GB"))
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    assert "FLOPs per byte" in fig.layout.xaxis.title.text and "FLOP/s" in fig.layout.yaxis.title.text
    assert "A100-80GB" in fig.layout.title.text
    names = [trace.name for trace in fig.data]
    assert names == ["roofline", "prefill", "decode"]
    assert all("ms" in text and "-bound" in text for trace in fig.data[1:] for text in trace.text)
    roof = fig.data[0]
    assert max(roof.y) == 312e12  # A100's bf16 peak is the flat roof


def test_changing_a_preset_redraws():
    explorer = RooflineExplorer()
    before = explorer.readout.value
    explorer.gpu.value = "L4-24GB"
    assert explorer.readout.value != before and "Ridge point <b>403 FLOP/byte" in explorer.readout.value
    explorer.context.value = 8192
    assert "8,192 tokens" in explorer.figure.figure.layout.title.text and "L4-24GB" in explorer.figure.figure.layout.title.text


def test_your_steps_are_stars_and_the_sliders_move_them():
    explorer = RooflineExplorer(prompt_len=16, batch_size=1)
    assert "Your prefill of 16 tokens: " in explorer.readout.value and "memory-bound" in explorer.readout.value
    stars = explorer.figure.data[-1]
    assert stars.name == "your steps" and stars.marker.symbol == "star" and len(stars.x) == 2
    explorer.prompt.value = 8192
    assert "Your prefill of 8,192 tokens" in explorer.readout.value
    assert explorer.figure.data[-1].x[0] > stars.x[0]  # a longer prompt: more FLOPs per weight byte
    assert [trace.name for trace in explorer.figure.data] == ["roofline", "prefill", "decode", "your steps"]
