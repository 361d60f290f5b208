"""Module 04's roofline: where prefill and decode steps of a model land on a GPU's two roofs.

A step's arithmetic intensity is its FLOPs over the bytes it moves (``perf/roofline.py``).
Below the ridge point (peak FLOP/s / bandwidth) a step is held by memory bandwidth, above it
by compute. The figure is log-log, one point per step, with the step's numbers on hover:
prefill steps of several prompt lengths climb to the compute roof, decode steps of several
batch sizes sit on the bandwidth slope until the batch is large.
"""

from __future__ import annotations

import ipywidgets as w
import plotly.graph_objects as go

from course_lib.perf.hardware import GPU, GPUS, get_gpu
from course_lib.perf.models import MODELS, ModelSpec, get_model
from course_lib.perf.roofline import StepPoint, ridge_point, step_cost
from course_lib.widgets.figure_pane import one_at_a_time
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


def roofline_figure(gpu: GPU, points: list[StepPoint], title: str | None = None) -> go.Figure:
    """The two roofs of ``gpu`` (a preset, or a measured machine's ``MachineRoofline.as_gpu()``)
    and ``points`` on them."""
    peak_flops, bandwidth = gpu.bf16_flops, gpu.hbm_bandwidth
    ridge = ridge_point(gpu)
    intensities = [p.cost.arithmetic_intensity for p in points] or [ridge]
    low, high = min(min(intensities), ridge) / 4, max(max(intensities), ridge) * 4
    roof_x = [low, ridge, high]
    fig = go.Figure()
    fig.add_scatter(x=roof_x, y=[bandwidth * x for x in roof_x[:2]] + [peak_flops], mode="lines", name="roofline",
                    line=dict(color="black"), hovertemplate="%{x:.3g} FLOP/byte: at most %{y:.3s}FLOP/s<extra></extra>")
    for phase, colour in (("prefill", "#d62728"), ("decode", "#1f77b4")):
        mine = [p for p in points if p.phase == phase]
        if not mine:
            continue
        fig.add_scatter(
            x=[p.cost.arithmetic_intensity for p in mine], y=[p.achieved_flops for p in mine], mode="markers+lines",
            name=phase, marker=dict(size=9, color=colour), line=dict(dash="dot", color=colour),
            text=[f"{p.label}<br>{p.time_s * 1e3:.3g} ms{' measured' if p.measured_s is not None else ''}; "
                  f"the roofline says {p.cost.bound}-bound, {p.cost.time_s * 1e3:.3g} ms" for p in mine],
            hovertemplate="%{text}<br>%{x:.3g} FLOP/byte, %{y:.3s}FLOP/s<extra></extra>")
    fig.update_xaxes(type="log", title="arithmetic intensity (FLOPs per byte moved)")
    mark_x(fig, ridge, f"ridge {ridge:,.0f} FLOP/byte", left=True)
    fig.update_yaxes(type="log", title="achieved FLOP/s")
    fig.update_layout(title=title or f"Roofline of {gpu.name}", height=430, margin=dict(t=60))
    return fig


def gpu_roofline(model: ModelSpec, gpu: GPU, context_len: int = 1024, chosen: list[StepPoint] = ()) -> go.Figure:
    """The roofline of a GPU preset with ``model``'s prefill and decode steps on it, and the
    ``chosen`` steps as stars."""
    fig = roofline_figure(gpu, step_points(model, gpu, context_len=context_len) + list(chosen),
                          title=f"{model.name} on {gpu.name} (bf16): prefill and decode steps on the roofline "
                                f"({context_len:,} tokens of decode context)")
    if chosen:
        fig.add_scatter(x=[p.cost.arithmetic_intensity for p in chosen], y=[p.achieved_flops for p in chosen],
                        mode="markers", name="your steps", marker=dict(size=16, symbol="star", color="#2ca02c"),
                        text=[f"{p.label}<br>{p.time_s * 1e3:.3g} ms, {p.cost.bound}-bound" for p in chosen],
                        hovertemplate="%{text}<br>%{x:.3g} FLOP/byte, %{y:.3s}FLOP/s<extra></extra>")
    return fig


class RooflineExplorer(w.VBox):
    """GPU and model presets, the decode context, and one prefill and one decode step of your
    choosing (stars); the roofline redraws in place on every change."""

    def __init__(self, model: str = "Llama-3.1-8B", gpu: str = "H100-80GB", context_len: int = 1024,
                 prompt_len: int = 2048, batch_size: int = 32) -> None:
        wide = dict(continuous_update=False, style={"description_width": "12em"}, layout=w.Layout(width="480px"))
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
        prefill = StepPoint("chosen", f"your prefill of {self.prompt.value:,} tokens",
                            step_cost(model, gpu, [(0, self.prompt.value)]))
        decode = StepPoint("chosen", f"your decode, batch {self.batch.value:,}",
                           step_cost(model, gpu, [(context, 1)] * self.batch.value))
        self.readout.value = f"Ridge point <b>{ridge_point(gpu):.0f} FLOP/byte</b>. " + " ".join(
            f"{p.label.capitalize()}: {p.cost.arithmetic_intensity:.3g} FLOP/byte, <b>{p.cost.bound}-bound</b>, "
            f"{p.cost.time_s * 1e3:.3g} ms." for p in (prefill, decode))
        self.figure.show(gpu_roofline(model, gpu, context, [prefill, decode]))
