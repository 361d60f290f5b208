"""Module 04's roofline: where prefill and decode steps of a model land on a GPU's two roofs.

A step's arithmetic intensity is its FLOPs over the bytes it moves (``perf/roofline.py``).
Below the ridge point (peak FLOP/s / bandwidth) a step is held by memory bandwidth, above it
by compute. The figure is log-log, one point per step, with the step's numbers on hover:
prefill steps of several prompt lengths climb to the compute roof, decode steps of several
batch sizes sit on the bandwidth slope until the batch is large.
"""

from __future__ import annotations

from dataclasses import dataclass

import ipywidgets as w
import plotly.graph_objects as go
from IPython.display import display

from course_lib.perf.hardware import GPU, GPUS, get_gpu
from course_lib.perf.models import MODELS, ModelSpec, get_model
from course_lib.perf.roofline import StepCost, ridge_point, step_cost
from course_lib.widgets.figure_pane import one_at_a_time

PROMPT_LENGTHS = (16, 64, 256, 1024, 4096, 16384)
BATCH_SIZES = (1, 4, 16, 64, 256, 1024)


@dataclass(frozen=True)
class StepPoint:
    phase: str        # "prefill" or "decode"
    label: str        # e.g. "prefill of 1024 tokens", "decode, batch 64"
    cost: StepCost

    @property
    def achieved_flops(self) -> float:
        """FLOP/s this step reaches: its FLOPs over its modelled time."""
        return self.cost.flops / self.cost.time_s


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
            text=[f"{p.label}<br>{p.cost.time_s * 1e3:.3g} ms, {p.cost.bound}-bound" for p in mine],
            hovertemplate="%{text}<br>%{x:.3g} FLOP/byte, %{y:.3s}FLOP/s<extra></extra>")
    fig.add_vline(x=ridge, line_dash="dash", line_color="grey",
                  annotation_text=f"ridge {ridge:.0f} FLOP/byte", annotation_position="top left")
    fig.update_xaxes(type="log", title="arithmetic intensity (FLOPs per byte moved)")
    fig.update_yaxes(type="log", title="achieved FLOP/s")
    fig.update_layout(title=title or f"Roofline of {gpu.name}", height=430, margin=dict(t=60))
    return fig


def gpu_roofline(model: ModelSpec, gpu: GPU, context_len: int = 1024) -> go.Figure:
    """The roofline of a GPU preset with ``model``'s prefill and decode steps on it."""
    return roofline_figure(gpu, step_points(model, gpu, context_len=context_len),
                           title=f"{model.name} on {gpu.name} (bf16): prefill and decode steps on the roofline "
                                 f"({context_len:,} tokens of decode context)")


class RooflineExplorer(w.VBox):
    """GPU and model presets and the decode context; the roofline redraws on every change."""

    def __init__(self, model: str = "Llama-3.1-8B", gpu: str = "H100-80GB", context_len: int = 1024) -> None:
        self.gpu = w.Dropdown(options=list(GPUS), value=get_gpu(gpu).name, description="GPU")
        self.model = w.Dropdown(options=list(MODELS), value=get_model(model).name, description="model")
        self.context = w.IntSlider(context_len, 128, 32768, 128, description="decode context (tokens)",
                                   continuous_update=False, style={"description_width": "12em"},
                                   layout=w.Layout(width="480px"))
        self.readout, self.output = w.HTML(), w.Output()
        for control in (self.gpu, self.model, self.context):
            control.observe(self._update, names="value")
        super().__init__([w.HBox([self.gpu, self.model]), self.context, self.readout, self.output])
        self._update()

    @one_at_a_time
    def _update(self, change=None) -> None:
        model, gpu = get_model(self.model.value), get_gpu(self.gpu.value)
        points = step_points(model, gpu, context_len=self.context.value)
        decode1 = next(p for p in points if p.phase == "decode")
        longest = [p for p in points if p.phase == "prefill"][-1]
        self.readout.value = (
            f"Ridge point {ridge_point(gpu):.0f} FLOP/byte. "
            f"Batch-1 decode: {decode1.cost.arithmetic_intensity:.2g} FLOP/byte, {decode1.cost.bound}-bound, "
            f"{decode1.cost.time_s * 1e3:.3g} ms per token. {longest.label.capitalize()}: "
            f"{longest.cost.arithmetic_intensity:.0f} FLOP/byte, {longest.cost.bound}-bound.")
        self.figure = gpu_roofline(model, gpu, self.context.value)
        self.output.clear_output(wait=True)
        with self.output:
            display(self.figure)
