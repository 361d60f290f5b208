"""Module 04's roofline widget: where the steps land, and the figure a learner reads values off."""

import math
import re
import time

import pytest

from course_lib.perf.hardware import GPUS, get_gpu
from course_lib.perf.machine import MachineRoofline
from course_lib.perf.models import get_model
from course_lib.perf.roofline import AT_THE_ROOFS, Efficiency, StepPoint, reachable_ridge_point, ridge_point, step_cost
from course_lib.perf.units import format_number
from course_lib.widgets.roofline_explorer import (RooflineExplorer, gpu_roofline, roofline_figure, step_points,
                                                  step_time_working)
from tests.plotly_extents import decades_beyond, figure_extents

E_NOTATION = re.compile(r"\de[+-]?\d")


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
    assert names == ["peak roofs", "reachable roofs (50% of peak FLOP/s, 80% of peak bandwidth)", "prefill", "decode"]
    assert all("ms" in text and "-bound" in text for trace in fig.data[2:] for text in trace.text)
    peaks, reachable = fig.data[0], fig.data[1]
    assert max(peaks.y) == 312e12  # A100's bf16 peak is the flat roof
    assert max(reachable.y) == pytest.approx(312e12 * Efficiency().compute)
    assert reachable.x[1] == pytest.approx(reachable_ridge_point(get_gpu("A100-80GB")))  # where the reachable roofs meet


def test_changing_a_preset_redraws():
    explorer = RooflineExplorer()
    before = explorer.readout.value
    explorer.gpu.value = "L4-24GB"
    assert explorer.readout.value != before and "ridge point of the peaks <b>403 FLOP/byte" in explorer.readout.value
    explorer.context.value = 8192
    assert "8,192 tokens" in explorer.figure.figure.layout.title.text and "L4-24GB" in explorer.figure.figure.layout.title.text


def test_your_steps_are_stars_told_apart_by_colour_and_name_and_the_sliders_move_them():
    explorer = RooflineExplorer(prompt_len=16, batch_size=1)
    assert "Your prefill of 16 tokens: " in explorer.readout.value and "memory-bound" in explorer.readout.value
    prefill, decode = explorer.figure.data[-2:]
    assert (prefill.name, decode.name) == ("your prefill", "your decode")
    assert prefill.marker.symbol == decode.marker.symbol == "star"
    assert prefill.marker.color != decode.marker.color  # told apart without hovering
    assert prefill.marker.color == explorer.figure.data[2].marker.color  # each in its phase's colour
    assert decode.marker.color == explorer.figure.data[3].marker.color
    assert prefill.text == ("your prefill",) and decode.text == ("your decode",)  # named on the plot
    explorer.prompt.value = 8192
    assert "Your prefill of 8,192 tokens" in explorer.readout.value
    assert explorer.figure.data[-2].x[0] > prefill.x[0]  # a longer prompt: more FLOPs per weight byte
    assert [trace.name for trace in explorer.figure.data][2:] == ["prefill", "decode", "your prefill", "your decode"]


def test_one_token_is_singular():
    explorer = RooflineExplorer(prompt_len=1)
    assert "Your prefill of 1 token:" in explorer.readout.value and "1 tokens" not in explorer.readout.value


@pytest.mark.parametrize("gpu", list(GPUS))
@pytest.mark.parametrize("model", ["Llama-3.1-8B", "Mixtral-8x7B"])
def test_every_tick_is_labelled_in_one_style(gpu, model):
    """Ticks only where labelled, all in one style: plain FLOP/byte on x, SI FLOP/s on y (no '10¹⁵'
    beside '100T'), at powers of ten, or 1-2-5 where the axis spans under two decades."""
    fig = RooflineExplorer(gpu=gpu, model=model).figure.figure
    for axis, pattern in (("x", r"^[\d,.]+$"), ("y", r"^[\d.]+[kMGTP]?$")):
        layout = fig.layout[f"{axis}axis"]
        assert layout.tickmode == "array" and len(layout.tickvals) >= 3
        assert all(re.match(pattern, text) for text in layout.ticktext), layout.ticktext
    assert fig.layout.yaxis.ticktext[-1].endswith(("T", "P"))


def test_a_model_whose_weights_do_not_fit_one_gpu_says_so_with_the_gpus_it_needs():
    """Mixtral-8x7B (46.7 B parameters, 93.4 GB in bf16) and Llama-3.1-70B (141 GB) do not fit one
    80 GiB H100 (85.9 GB): both take 2; the 8B fits, and its batch of 1,024 at 32,768 tokens does not."""
    for model, gpus in (("Mixtral-8x7B", 2), ("Llama-3.1-70B", 2)):
        explorer = RooflineExplorer(model=model, gpu="H100-80GB")
        text = explorer.readout.value
        assert "Does not fit:" in text and f"serving it takes at least {gpus} of them" in text
        assert "85.9 GB" in text and "Does not fit one GPU" in explorer.figure.figure.layout.title.text
    assert "Does not fit" not in RooflineExplorer(model="Mixtral-8x7B", gpu="H200-141GB").readout.value
    fits = RooflineExplorer(model="Llama-3.1-8B", gpu="H100-80GB")
    assert "Does not fit" not in fits.readout.value and "fit" not in fits.figure.figure.layout.title.text
    fits.batch.value, fits.context.value = 1024, 32768
    assert "Your decode batch does not fit on one H100-80GB" in fits.readout.value
    assert "4.4 TB" in fits.readout.value  # 1,024 x 32,768 tokens x 128 KiB per token = 4.4e12 bytes


def test_slider_labels_have_room():
    explorer = RooflineExplorer()
    for control in (explorer.context, explorer.prompt, explorer.batch):
        width_em = float(control.style.description_width.removesuffix("em"))
        assert len(control.description) * 0.6 <= width_em, control.description
        assert control.readout_format == ",d"  # 32,768, as the text writes it


@pytest.mark.parametrize("gpu", list(GPUS))
@pytest.mark.parametrize("prompt, batch, context", [(2048, 32, 1024), (1, 1, 128), (32768, 1024, 32768)])
def test_the_axes_span_the_steps_on_every_gpu(gpu, prompt, batch, context):
    """Every mark is placed in data units: no axis runs more than 2 decades past the steps (a
    ridge label at x = 295 on a log axis would sit at 10^295); intensities stay in 0.1-10^5 (a
    32,768-token prefill does about 3 x 10^4 FLOP/byte)."""
    explorer = RooflineExplorer(gpu=gpu, prompt_len=prompt, batch_size=batch, context_len=context)
    fig = explorer.figure.figure
    steps = ("prefill", "decode", "your steps")
    assert decades_beyond(fig, steps, "x") <= 2 and decades_beyond(fig, steps, "y") <= 2
    low, high = figure_extents(fig)["x"]
    assert 0.1 <= low and high <= 1e5


def test_the_measured_roofline_spans_its_steps():
    """This machine's roofline (ridge about 5 FLOP/byte) with a tiny model's steps on it."""
    machine = MachineRoofline("a 2-core CPU", 100e9, 20e9, 2048, 1 << 28, 2, 1.0).as_gpu()  # ridge 5 FLOP/byte
    model = get_model("Llama-3.2-1B")
    points = [StepPoint("prefill", f"prefill of {n}", step_cost(model, machine, [(0, n)], "fp32", AT_THE_ROOFS), 0.5)
              for n in (16, 512)]
    points += [StepPoint("decode", f"decode, batch {b}", step_cost(model, machine, [(64, 1)] * b, "fp32", AT_THE_ROOFS),
                         0.05) for b in (1, 32)]
    fig = roofline_figure(machine, points, title="measured")
    assert [trace.name for trace in fig.data] == ["roofline", "prefill", "decode"]  # one pair of roofs: the measured ones
    assert decades_beyond(fig, ("prefill", "decode"), "x") <= 2
    assert any("ridge 5 FLOP/byte" in note.text for note in fig.layout.annotations)
    assert all("against the roofs: " in text for trace in fig.data[1:] for text in trace.text)


def test_a_prefill_between_the_two_ridges_is_labelled_by_the_reachable_one_and_says_so():
    """H100: the peaks meet at 295 FLOP/byte, the reachable roofs (50% and 80%) at 184.5. A prefill
    of 190 tokens (190 FLOP/byte) spends longer computing than moving bytes: compute-bound, and
    the readout says the peaks' ridge alone would call it memory-bound."""
    explorer = RooflineExplorer(gpu="H100-80GB", prompt_len=190)
    text = explorer.readout.value
    assert "ridge point of the peaks <b>295 FLOP/byte" in text
    assert "295.2 × 50% / 80% = 184.5 FLOP/byte" in text
    assert "Your prefill of 190 tokens: 190 FLOP/byte, at or above 184.5: compute-bound (against the peaks' " \
           "ridge of 295 it would be memory-bound)" in text


def test_the_readout_states_the_efficiencies_from_the_cost_model():
    explorer = RooflineExplorer(gpu="H100-80GB")
    efficiency, text = Efficiency(), explorer.readout.value
    assert f"{efficiency.compute:.0%} of the 989 TFLOP/s peak" in text
    assert f"{efficiency.memory:.0%} of the 3.35 TB/s bandwidth" in text
    assert f"plus {format_number(efficiency.overhead_s * 1e3)} ms per step" in text


def test_the_step_time_is_written_out_so_it_can_be_redone_by_hand():
    """2,048-token prefill of Llama-3.1-8B on an H100: 34 TFLOP at half of 989 TFLOP/s is 68.7 ms,
    plus 0.5 ms; dividing by the peak alone would give 34 ms."""
    gpu = get_gpu("H100-80GB")
    cost = step_cost(get_model("Llama-3.1-8B"), gpu, [(0, 2048)])
    assert step_time_working(cost, gpu) == ("max(34 TFLOP / 494.5 TFLOP/s, 16.6 GB / 2.68 TB/s) + 0.5 ms = "
                                            "max(68.7 ms, 6.19 ms) + 0.5 ms = 69.2 ms")
    assert format_number(cost.time_s * 1e3) == "69.2"


@pytest.mark.parametrize("gpu", list(GPUS))
def test_readouts_and_hover_text_are_plain_numbers(gpu):
    """No e-notation (2.05e+03) anywhere a learner reads a number: readout, hover text, hover formats."""
    explorer = RooflineExplorer(gpu=gpu, model="Llama-3.1-70B", prompt_len=32768, batch_size=1024, context_len=32768)
    fig = explorer.figure.figure
    texts = [explorer.readout.value] + [text for trace in fig.data for text in (trace.text or ())]
    texts += [note.text for note in fig.layout.annotations]
    assert not [text for text in texts if E_NOTATION.search(text)]
    assert not [t.hovertemplate for t in fig.data if re.search(r"%\{[xy]:[^}]*[eg]\}", t.hovertemplate)]


def test_every_control_answers_within_a_second():
    explorer = RooflineExplorer()
    for control, value in ((explorer.gpu, "L4-24GB"), (explorer.model, "Mixtral-8x7B"), (explorer.context, 32768),
                           (explorer.prompt, 190), (explorer.batch, 1024)):
        started = time.perf_counter()
        control.value = value
        assert time.perf_counter() - started < 1.0, f"{control.description} took over a second"


def test_a_measured_roofline_spanning_under_two_decades_labels_only_one_two_five():
    """A rerun's y axis spanned under two decades and plotly labelled every minor tick ('5' to '9'
    stacked): ticks are now 1, 2 and 5 times each power of ten, each labelled once in SI."""
    machine = MachineRoofline("a CPU", 300e9, 23e9, 2048, 1 << 28, 1, 1.0).as_gpu()
    model = get_model("Llama-3.2-1B")
    steps = {"prefill": [[(0, 64)], [(0, 512)]], "decode": [[(64, 1)] * 4, [(64, 1)] * 32]}
    points = [StepPoint(phase, phase, cost, cost.time_s * 3) for phase, shapes in steps.items() for shape in shapes
              for cost in [step_cost(model, machine, shape, "fp32", AT_THE_ROOFS)]]
    fig = roofline_figure(machine, points)
    axis = fig.layout.yaxis
    low, high = figure_extents(fig)["y"]
    assert 1 < math.log10(high / low) < 2  # the case: under two decades
    assert axis.tickmode == "array" and len(axis.tickvals) <= 7
    assert {round(v / 10 ** math.floor(math.log10(v))) for v in axis.tickvals} <= {1, 2, 5}
    assert all(text.endswith(("G", "T")) for text in axis.ticktext)
