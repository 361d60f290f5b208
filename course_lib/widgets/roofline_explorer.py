"""Module 04's roofline: where prefill and decode steps of a model land on a GPU's two roofs.

A step's arithmetic intensity is its FLOPs over the bytes it moves (``perf/roofline.py``).
A step is compute-bound when its intensity is at or above the ridge point of the roofs it runs
against. The step times run against the reachable roofs (``Efficiency``: a share of peak FLOP/s
and of peak bandwidth, plus a fixed cost per step), so the figure draws the peak roofs and the
reachable ones, with both ridges, and the readout writes out each chosen step's arithmetic.
The figure is log-log, one point per step, with the step's numbers on hover: prefill steps of
several prompt lengths climb to the compute roof, decode steps of several batch sizes sit on
the bandwidth slope until the batch is large. Every x is in data units (FLOP/byte). The step
times are one GPU's roofs; where the model's weights (or the weights and the chosen decode
batch's KV cache) do not fit in that GPU's memory, the readout and the title say so and name the
fewest GPUs that hold them.
"""

from __future__ import annotations

import math

import ipywidgets as w
import plotly.graph_objects as go

from course_lib.perf.hardware import GPU, GPUS, get_gpu
from course_lib.perf.kv import kv_bytes_per_batch
from course_lib.perf.models import MODELS, ModelSpec, get_model
from course_lib.perf.quant_cost import (SERVING_MEMORY_UTILIZATION, min_gpus_for_batch, min_gpus_for_weights,
                                        weight_memory)
from course_lib.perf.roofline import (Efficiency, StepCost, StepPoint, peak_flops, reachable_ridge_point,
                                      ridge_point, step_cost)
from course_lib.perf.units import format_number, format_si, plural
from course_lib.widgets.figure_pane import one_at_a_time
from course_lib.widgets.log_ticks import label_log_axis, si_tick
from course_lib.widgets.plotly_marks import mark_x
from course_lib.widgets.plotly_pane import PlotlyPane

PROMPT_LENGTHS = (16, 64, 256, 1024, 4096, 16384)
BATCH_SIZES = (1, 4, 16, 64, 256, 1024)


def step_points(model: ModelSpec, gpu: GPU, prompt_lengths=PROMPT_LENGTHS, batch_sizes=BATCH_SIZES,
                context_len: int = 1024) -> list[StepPoint]:
    """One prefill step per prompt length (a single request, nothing cached) and one decode step
    per batch size (every sequence ``context_len`` tokens in), costed on ``gpu``."""
    points = [StepPoint("prefill", f"prefill of {n:,} tokens", step_cost(model, gpu, [(0, n)])) for n in prompt_lengths]
    points += [StepPoint("decode", f"decode, batch {b:,} at {context_len:,} tokens of context",
                         step_cost(model, gpu, [(context_len, 1)] * b)) for b in batch_sizes]
    return points


def roofline_figure(gpu: GPU, points: list[StepPoint], title: str | None = None,
                    efficiency: Efficiency | None = None) -> go.Figure:
    """The peak roofs of ``gpu`` (a preset, or a measured machine's ``MachineRoofline.as_gpu()``)
    and ``points`` on them; with ``efficiency`` (the one the points were costed at) also the
    reachable roofs, the peaks times its shares, and their ridge."""
    ridge = ridge_point(gpu)
    roofs = [("roofline" if efficiency is None else "peak roofs", 1.0, 1.0, ridge, dict(color="black"))]
    if efficiency is not None:
        roofs.append((f"reachable roofs ({efficiency.compute:.0%} of peak FLOP/s, {efficiency.memory:.0%} of peak "
                      "bandwidth)", efficiency.compute, efficiency.memory,
                      reachable_ridge_point(gpu, efficiency=efficiency), dict(color="grey", dash="dash")))
    intensities = [p.cost.arithmetic_intensity for p in points] + [roof[3] for roof in roofs]
    low, high = min(intensities) / 2, max(intensities) * 2  # the roofs run a little past the outermost step
    fig = go.Figure()
    for name, compute, memory, meet, line in roofs:
        flops, bandwidth = gpu.bf16_flops * compute, gpu.hbm_bandwidth * memory
        fig.add_scatter(x=[low, meet, high], y=[bandwidth * low, flops, flops], mode="lines", name=name, line=line,
                        hovertemplate=f"{name}<br>%{{x:,.3~r}} FLOP/byte: at most %{{y:.3s}}FLOP/s<extra></extra>")
    against = "the reachable roofs" if efficiency is not None else "the roofs"
    for phase, colour in (("prefill", "#d62728"), ("decode", "#1f77b4")):
        mine = [p for p in points if p.phase == phase]
        if not mine:
            continue
        fig.add_scatter(
            x=[p.cost.arithmetic_intensity for p in mine], y=[p.achieved_flops for p in mine], mode="markers+lines",
            name=phase, marker=dict(size=9, color=colour), line=dict(dash="dot", color=colour),
            text=[f"{p.label}<br>{format_number(p.time_s * 1e3)} ms{' measured' if p.measured_s is not None else ''}; "
                  f"against {against}: {p.cost.bound}-bound, {format_number(p.cost.time_s * 1e3)} ms" for p in mine],
            hovertemplate="%{text}<br>%{x:,.3~r} FLOP/byte, %{y:.3s}FLOP/s<extra></extra>")
    fig.update_xaxes(type="log", title="arithmetic intensity (FLOPs per byte moved)")
    if efficiency is None:
        mark_x(fig, ridge, f"ridge {format_number(ridge)} FLOP/byte", left=True)
    else:
        mark_x(fig, ridge, f"ridge {format_number(ridge)} (peaks)", line_color="black")
        mark_x(fig, roofs[1][3], f"{format_number(roofs[1][3])} (reachable)", left=True)
    fig.update_yaxes(type="log", title="achieved FLOP/s")
    label_log_axis(fig, "x")
    label_log_axis(fig, "y", si_tick)
    fig.update_layout(title=title or f"Roofline of {gpu.name}", height=430, margin=dict(t=60))
    return fig


CHOSEN_COLOURS = {"your prefill": "#d62728", "your decode": "#1f77b4"}
"""Each chosen step's colour: its phase's."""


def _name_position(phase: str, x: float, xs: list[float]) -> str:
    """Where a chosen star's name goes: the prefill's below it, the decode's above it (off the
    roofs, which rise to the right), each on the side that keeps it inside the plot."""
    low, high = math.log10(min(xs)), math.log10(max(xs))
    share = (math.log10(x) - low) / (high - low) if high > low else 0.5
    side = "right" if share < 0.25 else "left" if share > 0.75 else ("right" if phase == "your prefill" else "left")
    return f"{'bottom' if phase == 'your prefill' else 'top'} {side}"


def gpu_roofline(model: ModelSpec, gpu: GPU, context_len: int = 1024, chosen: list[StepPoint] = (),
                 note: str = "") -> go.Figure:
    """The roofline of a GPU preset with ``model``'s prefill and decode steps on it, and the
    ``chosen`` steps (phases 'your prefill' and 'your decode') as stars in their phase's colour,
    each named beside it, all costed at the default ``Efficiency``; ``note``, if any, is a second
    line of the title, in red."""
    title = (f"{model.name} on {gpu.name} (bf16): prefill and decode steps on the roofline "
             f"({context_len:,} tokens of decode context)")
    if note:
        title += f"<br><span style='font-size:13px;color:#cf222e'>{note}</span>"
    fig = roofline_figure(gpu, step_points(model, gpu, context_len=context_len) + list(chosen), title=title,
                          efficiency=Efficiency())
    xs = [x for trace in fig.data for x in trace.x]
    for p in chosen:
        x, colour = p.cost.arithmetic_intensity, CHOSEN_COLOURS[p.phase]
        fig.add_scatter(x=[x], y=[p.achieved_flops], mode="markers+text", name=p.phase,
                        marker=dict(size=18, symbol="star", color=colour, line=dict(width=1.5, color="black")),
                        text=[p.phase], textposition=_name_position(p.phase, x, xs), textfont=dict(color=colour),
                        customdata=[f"{p.label}<br>{format_number(p.time_s * 1e3)} ms, {p.cost.bound}-bound"],
                        hovertemplate="%{customdata}<br>%{x:,.3~r} FLOP/byte, %{y:.3s}FLOP/s<extra></extra>")
    if note:
        fig.update_layout(margin=dict(t=80))
    return fig


def memory_note(model: ModelSpec, gpu: GPU, batch: int, context_len: int) -> str:
    """'' when the weights and ``batch`` sequences' KV cache of ``context_len`` tokens fit one
    ``gpu`` (at vLLM's default 90% of its memory); otherwise what does not fit, with the sizes and
    the fewest GPUs that hold it (plain text)."""
    weights, memory = weight_memory(model, "BF16"), gpu.memory_bytes
    usable = memory * SERVING_MEMORY_UTILIZATION
    if min_gpus_for_weights(model, "BF16", gpu) > 1:
        return (f"{model.name}'s weights alone are {format_si(weights, 'B')} in bf16, more than one {gpu.name} "
                f"holds ({format_si(memory, 'B')}): serving it takes at least {min_gpus_for_weights(model, 'BF16', gpu)} "
                f"of them (tensor parallelism splits the weights). The times here are one GPU's roofs, as if the "
                f"weights fitted.")
    gpus = min_gpus_for_batch(model, "BF16", gpu, batch, context_len)
    if gpus > 1:
        kv = kv_bytes_per_batch(model, context_len, batch, "bf16")
        return (f"Your decode batch does not fit on one {gpu.name}: its KV cache ({batch:,} sequences of "
                f"{context_len:,} tokens) is {format_si(kv, 'B')}, and with the {format_si(weights, 'B')} of weights "
                f"that is more than {SERVING_MEMORY_UTILIZATION:.0%} of its {format_si(memory, 'B')} "
                f"({format_si(usable, 'B')}); it takes at least {gpus} GPUs. Its time here is one GPU's roofs, as if "
                f"it fitted.")
    return ""


def efficiency_statement(gpu: GPU, efficiency: Efficiency = Efficiency(), dtype: str = "bf16") -> str:
    """The reachable roofs and their ridge, with the arithmetic, in one sentence (plain text)."""
    peak, bandwidth = peak_flops(gpu, dtype), gpu.hbm_bandwidth
    return (f"The step times run against reachable roofs: {efficiency.compute:.0%} of the {format_si(peak, 'FLOP/s')} "
            f"peak ({format_si(peak * efficiency.compute, 'FLOP/s', 4)}) and {efficiency.memory:.0%} of the "
            f"{format_si(bandwidth, 'B/s')} bandwidth ({format_si(bandwidth * efficiency.memory, 'B/s', 4)}), plus "
            f"{format_number(efficiency.overhead_s * 1e3)} ms per step; they meet at "
            f"{format_number(ridge_point(gpu, dtype), 4)} × {efficiency.compute:.0%} / {efficiency.memory:.0%} = "
            f"{format_number(reachable_ridge_point(gpu, dtype, efficiency), 4)} FLOP/byte.")


def step_time_working(cost: StepCost, gpu: GPU, efficiency: Efficiency = Efficiency(), dtype: str = "bf16") -> str:
    """How ``step_cost`` reached ``cost.time_s``, written out so it can be redone by hand:
    max(FLOPs / reachable FLOP/s, bytes / reachable bandwidth) + overhead = time."""
    flops, bandwidth = peak_flops(gpu, dtype) * efficiency.compute, gpu.hbm_bandwidth * efficiency.memory
    ms = lambda seconds: f"{format_number(seconds * 1e3)} ms"  # noqa: E731
    return (f"max({format_si(cost.flops, 'FLOP')} / {format_si(flops, 'FLOP/s', 4)}, {format_si(cost.bytes, 'B')} / "
            f"{format_si(bandwidth, 'B/s', 4)}) + {ms(cost.overhead_s)} = max({ms(cost.compute_s)}, {ms(cost.memory_s)}) "
            f"+ {ms(cost.overhead_s)} = {ms(cost.time_s)}")


def bound_verdict(cost: StepCost, gpu: GPU, efficiency: Efficiency = Efficiency(), dtype: str = "bf16") -> str:
    """The step's intensity against the reachable ridge, and against the peaks' ridge where they differ."""
    intensity, reachable, peaks = (cost.arithmetic_intensity, reachable_ridge_point(gpu, dtype, efficiency),
                                   ridge_point(gpu, dtype))
    verdict = (f"{format_number(intensity)} FLOP/byte, {'at or above' if cost.bound == 'compute' else 'below'} "
               f"{format_number(reachable, 4)}: {cost.bound}-bound")
    if (intensity >= reachable) != (intensity >= peaks):
        verdict += f" (against the peaks' ridge of {format_number(peaks)} it would be " + (
            "memory-bound)" if intensity < peaks else "compute-bound)")
    return verdict


class RooflineExplorer(w.VBox):
    """GPU and model presets, the decode context, and one prefill and one decode step of your
    choosing (stars); the roofline redraws in place on every change, and the readout writes out
    the chosen steps' arithmetic at the efficiencies the step times use."""

    def __init__(self, model: str = "Llama-3.1-8B", gpu: str = "H100-80GB", context_len: int = 1024,
                 prompt_len: int = 2048, batch_size: int = 32) -> None:
        wide = dict(continuous_update=False, style={"description_width": "14em"}, layout=w.Layout(width="520px"),
                    readout_format=",d")
        self.gpu = w.Dropdown(options=list(GPUS), value=get_gpu(gpu).name, description="GPU")
        self.model = w.Dropdown(options=list(MODELS), value=get_model(model).name, description="model")
        self.context = w.IntSlider(context_len, 128, 32768, 128, description="decode context (tokens)", **wide)
        self.prompt = w.IntSlider(prompt_len, 1, 32768, 1, description="your prefill (tokens)", **wide)
        self.batch = w.IntSlider(batch_size, 1, 1024, 1, description="your decode batch", **wide)
        self.readout, self.figure = w.HTML(), PlotlyPane()
        for control in (self.gpu, self.model, self.context, self.prompt, self.batch):
            control.observe(self._update, names="value")
        super().__init__([w.HBox([self.gpu, self.model]), self.context, self.prompt, self.batch, self.readout,
                          self.figure])
        self._update()

    @one_at_a_time
    def _update(self, change=None) -> None:
        model, gpu, context = get_model(self.model.value), get_gpu(self.gpu.value), self.context.value
        prefill = StepPoint("your prefill", f"your prefill of {plural(self.prompt.value, 'token')}",
                            step_cost(model, gpu, [(0, self.prompt.value)]))
        decode = StepPoint("your decode", f"your decode, batch {self.batch.value:,} at "
                                          f"{plural(context, 'token')} of context",
                           step_cost(model, gpu, [(context, 1)] * self.batch.value))
        steps = "".join(f"<li>{p.label.capitalize()}: {bound_verdict(p.cost, gpu)}. Time = "
                        f"{step_time_working(p.cost, gpu)}.</li>" for p in (prefill, decode))
        note = memory_note(model, gpu, self.batch.value, context)
        self.readout.value = (
            f"<b>{model.name} on {gpu.name}</b>: ridge point of the peaks <b>{format_number(ridge_point(gpu))} "
            f"FLOP/byte</b>. {efficiency_statement(gpu)} A step at or above that ridge is compute-bound."
            + (f"<br><b style='color:#cf222e'>Does not fit:</b> {note}" if note else "") + f"<ul>{steps}</ul>")
        self.figure.show(gpu_roofline(model, gpu, context, [prefill, decode],
                                      "Does not fit one GPU: the readout says how many it takes" if note else ""))
