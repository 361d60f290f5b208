"""The communication roofline as widgets: DDP's t_comm against its backward pass as GPUs are
added, and the two-node layouts of a 70B model (the TP=16 spot-the-bug), all from
``course_lib.perf.comm_roofline``."""

from __future__ import annotations

import math

import ipywidgets as w
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from course_lib.perf.comm_roofline import (
    DDP_BUCKET_BYTES,
    DDP_GPU_COUNTS,
    DDPStep,
    ParallelLayout,
    ddp_step,
    two_node_layouts,
)
from course_lib.perf.topology import ALL_REDUCES
from course_lib.perf.units import MiB, format_duration
from course_lib.widgets.log_ticks import time_ticks
from course_lib.widgets.plotly_pane import PlotlyPane
from course_lib.widgets.selection_readout import with_readout

GPU_COUNTS = (1, 2, 4, *DDP_GPU_COUNTS, 1024)
NIC_COUNTS = (1, 2, 4, 8)
ALGORITHM_NAMES = {"nccl rings": "NCCL's rings (one per NIC)", "hierarchical": "the hierarchical scheme",
                   "tree": "trees", "flat ring": "a single ring"}
STYLE = {"description_width": "11em"}
GPU_AXIS_PAD = 0.12  # decades of room beyond the first and last GPU count


def ddp_scaling_figure(steps: list[DDPStep], highlight: int | None = None) -> go.Figure:
    """Left: tokens/s per GPU against GPUs. Right: the gradient all-reduce (its latency part
    shaded) against the backward pass it must hide behind, in seconds with a unit on every tick.
    Both x axes reach a little past the first and last GPU count, so the setting's line shows at
    either end."""
    gpus = [step.num_gpus for step in steps]
    figure = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                           subplot_titles=("Throughput per GPU", "Can overlap hide the all-reduce?"))
    figure.add_trace(go.Scatter(x=gpus, y=[s.tokens_per_s_per_gpu for s in steps], mode="lines+markers",
                                name="tokens/s per GPU", customdata=[[s.link, s.scaling_efficiency] for s in steps],
                                hovertemplate="%{x} GPUs: %{y:,.0f} tokens/s per GPU (%{customdata[1]:.0%} of one "
                                              "node's), ring over %{customdata[0]}<extra></extra>"), row=1, col=1)
    talking = [s for s in steps if s.comm_s > 0]  # one GPU has nothing to all-reduce: no point on a log axis
    figure.add_trace(go.Scatter(x=[s.num_gpus for s in talking], y=[s.comm_s for s in talking],
                                customdata=[format_duration(s.comm_s) for s in talking],
                                hovertemplate="%{x} GPUs: t_comm %{customdata}<extra></extra>",
                                mode="lines+markers", name="t_comm: gradient all-reduce", line_color="#ff7f0e"),
                     row=1, col=2)
    figure.add_trace(go.Scatter(x=[s.num_gpus for s in talking], y=[s.latency_s for s in talking],
                                customdata=[format_duration(s.latency_s) for s in talking],
                                hovertemplate="%{x} GPUs: latency part %{customdata}<extra></extra>",
                                mode="lines", name="its latency part (the alphas)",
                                line={"color": "#ffbb78", "dash": "dot"}), row=1, col=2)
    figure.add_trace(go.Scatter(x=gpus, y=[s.backward_s for s in steps], mode="lines",
                                customdata=[format_duration(s.backward_s) for s in steps],
                                hovertemplate="%{x} GPUs: backward %{customdata}<extra></extra>",
                                name="backward compute (what overlap can hide behind)",
                                line={"dash": "dash", "color": "#1f77b4", "width": 3}), row=1, col=2)
    if highlight in gpus:
        step = steps[gpus.index(highlight)]
        figure.add_trace(go.Scatter(x=[highlight], y=[step.tokens_per_s_per_gpu], mode="markers", name="your setting",
                                    marker={"size": 14, "color": "#d62728", "symbol": "star"}, cliponaxis=False),
                         row=1, col=1)
        for col in (1, 2):
            figure.add_vline(x=highlight, line_color="#d62728", line_width=1, opacity=0.5, row=1, col=col)
    span = [math.log10(min(gpus)) - GPU_AXIS_PAD, math.log10(max(gpus)) + GPU_AXIS_PAD]  # log axes take log10
    for col in (1, 2):
        figure.update_xaxes(type="log", title_text="GPUs (8 per node)", range=span, row=1, col=col,
                            tickvals=[n for n in gpus if n in (1, 8, 64, 512)])
    figure.update_yaxes(title_text="tokens/s per GPU", rangemode="tozero", row=1, col=1)
    times = [t for s in steps for t in (s.comm_s, s.latency_s, s.backward_s) if t > 0]
    figure.update_yaxes(title_text="time per step (log scale)", type="log", row=1, col=2,
                        **time_ticks(min(times), max(times)))
    figure.update_layout(title=f"DDP of Llama-3.2-1B on H100 nodes, {steps[0].tokens_per_gpu:,} tokens per GPU per step"
                               f"<br>gradients all-reduced by {ALGORITHM_NAMES[steps[0].all_reduce]}",
                         height=470, legend={"orientation": "h", "y": -0.32}, margin={"t": 90, "b": 130})
    return figure


def ddp_verdict(step: DDPStep) -> str:
    if step.comm_s == 0:
        return (f"<b>1 GPU</b>: nothing to all-reduce. Step {step.step_s * 1e3:.1f} ms, "
                f"{step.tokens_per_s_per_gpu:,.0f} tokens/s.")
    verdict = ("hidden: the all-reduce fits inside backward" if step.hidden else
               "communication-bound: t_comm exceeds the backward pass, so every step waits for the network")
    return (f"<b>{step.num_gpus} GPUs</b>, gradients all-reduced by {ALGORITHM_NAMES[step.all_reduce]}, paced by "
            f"{step.link}: compute {step.compute_s * 1e3:.1f} ms "
            f"(backward {step.backward_s * 1e3:.1f} ms), t_comm {step.comm_s * 1e3:.1f} ms in {step.num_buckets} "
            f"buckets, {step.latency_s / step.comm_s:.0%} of it latency. <b>{verdict}</b>. Step "
            f"{step.step_s * 1e3:.1f} ms, {step.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, "
            f"{step.scaling_efficiency:.0%} of one node's.")


class CommRooflineCalculator(w.VBox):
    """Controls for a DDP step of Llama-3.2-1B (GPUs, NICs per node, the all-reduce algorithm,
    tokens per GPU, bucket size, compute efficiency): the roofline test t_comm against backward,
    and the scaling curve with the setting starred."""

    def __init__(self, num_gpus: int = 64, nics_per_node: int = 8, all_reduce: str = "nccl rings",
                 tokens_per_gpu: int = 4096, bucket_mib: float = DDP_BUCKET_BYTES / MiB,
                 compute_efficiency: float = 0.5) -> None:
        slider = {"continuous_update": False, "style": STYLE, "layout": w.Layout(width="560px")}
        self.num_gpus = w.SelectionSlider(options=GPU_COUNTS, value=num_gpus, description="GPUs", **slider)
        self.nics = w.SelectionSlider(options=NIC_COUNTS, value=nics_per_node, description="NICs per node", **slider)
        self.all_reduce = w.ToggleButtons(options=ALL_REDUCES, value=all_reduce, description="all-reduce",
                                          style={**STYLE, "button_width": "110px"})
        self.tokens = w.SelectionSlider(options=[2**k for k in range(9, 17)], value=tokens_per_gpu,
                                        description="tokens per GPU", **slider)
        self.bucket = w.SelectionSlider(options=[1, 5, 25, 100, 400], value=bucket_mib,
                                        description="bucket_cap_mb (MiB)", **slider)
        self.efficiency = w.FloatSlider(min=0.1, max=1.0, step=0.05, value=compute_efficiency,
                                        description="share of peak FLOP/s", **slider)
        self.verdict = w.HTML()
        self.pane = PlotlyPane()
        controls = (self.num_gpus, self.nics, self.all_reduce, self.tokens, self.bucket, self.efficiency)
        for control in controls:
            control.observe(self._redraw, "value")
        self._redraw()
        super().__init__([*map(with_readout, controls), self.verdict, self.pane])

    def settings(self) -> dict:
        return {"nics_per_node": self.nics.value, "all_reduce": self.all_reduce.value,
                "tokens_per_gpu": self.tokens.value, "bucket_bytes": self.bucket.value * MiB,
                "compute_efficiency": self.efficiency.value}

    def _redraw(self, *_) -> None:
        steps = [ddp_step(n, **self.settings()) for n in GPU_COUNTS]
        self.verdict.value = f"<p>{ddp_verdict(steps[GPU_COUNTS.index(self.num_gpus.value)])}</p>"
        self.pane.show(ddp_scaling_figure(steps, self.num_gpus.value))


LAYOUT_FEEDBACK = {
    "TP=16": "This is the bug: tensor parallelism across the two nodes sends every one of its 2 all-reduces "
             "per layer over InfiniBand, on the critical path.",
    "TP=8 x PP=2": "A fix: TP = GPUs per node keeps the all-reduces on NVLink, PP = nodes sends only one "
                   "micro-batch's activations across, once per stage boundary. It is the layout for a model too "
                   "big for one node.",
    "TP=8 x DP=2": "The simplest fix here: this model already served on one node, so run two independent "
                   "replicas, with no traffic between the nodes at all.",
}


def layouts_figure(layouts: list[ParallelLayout], chosen: str) -> go.Figure:
    """Stacked bars per layout: compute, TP all-reduces and PP sends, in ms for one batch."""
    names = [layout.name for layout in layouts]
    figure = go.Figure()
    for label, field, color in (("compute", "compute_s", "#1f77b4"), ("TP all-reduces", "tp_comm_s", "#ff7f0e"),
                                ("PP activation sends", "pp_comm_s", "#2ca02c")):
        figure.add_trace(go.Bar(x=names, y=[getattr(layout, field) * 1e3 for layout in layouts], name=label,
                                marker_color=color, hovertemplate=f"%{{x}}: {label} %{{y:.2f}} ms<extra></extra>"))
    for position, layout in enumerate(layouts):
        sends = f"<br>PP sends {layout.pp_comm_s * 1e6:,.0f} µs" if layout.pp > 1 else ""
        figure.add_annotation(x=layout.name, y=layout.latency_s * 1e3, yshift=18 if sends else 10, showarrow=False,
                              text=f"{layout.tokens_per_s:,.0f} tok/s{sends}")
        if layout.name == chosen:
            figure.add_shape(type="rect", x0=position - 0.45, x1=position + 0.45, y0=0, y1=layout.latency_s * 1e3,
                             line={"color": "#d62728", "width": 3})
    first = layouts[0]
    figure.update_layout(barmode="stack", height=400, autosize=True,
                         title=f"Llama-3.1-70B on 2 nodes x 8 H100, {first.phase}<br>the same {first.total_tokens:,} "
                               "tokens served by each layout (PP and DP in two batches)",
                         yaxis_title="latency of one batch (ms)", xaxis_title="layout",
                         legend={"orientation": "h", "y": -0.25})
    return figure


class LayoutChooser(w.VBox):
    """Click a layout for the two-node 70B deployment; the bars and the feedback say what it costs."""

    def __init__(self) -> None:
        self.layout_choice = w.ToggleButtons(options=list(LAYOUT_FEEDBACK), value=None,
                                             description="your layout", style={"button_width": "130px"})
        self.phase = w.ToggleButtons(options=("decode", "prefill"), value="decode", description="step")
        self.all_reduce = w.ToggleButtons(options=ALL_REDUCES, value="nccl rings", description="TP all-reduce",
                                          style={"button_width": "110px"})
        self.feedback = w.HTML("<p>Pick the layout you would deploy.</p>")
        self.pane = PlotlyPane()
        for control in (self.layout_choice, self.phase, self.all_reduce):
            control.observe(self._redraw, "value")
        self._redraw()
        super().__init__([self.layout_choice, self.phase, self.all_reduce, self.feedback, self.pane])

    def layouts(self) -> list[ParallelLayout]:
        return [layout for layout in two_node_layouts(all_reduce=self.all_reduce.value)
                if layout.phase == self.phase.value]

    def _redraw(self, *_) -> None:
        layouts = self.layouts()
        chosen = self.layout_choice.value
        if chosen is not None:
            layout = next(layout for layout in layouts if layout.name == chosen)
            best = max(layouts, key=lambda candidate: candidate.tokens_per_s)
            self.feedback.value = (f"<p><b>{chosen}</b>: {LAYOUT_FEEDBACK[chosen]} One batch takes "
                                   f"{layout.latency_s * 1e3:.1f} ms, {layout.tp_comm_s / layout.latency_s:.0%} of "
                                   f"it in TP all-reduces over {layout.tp_link}; {layout.tokens_per_s:,.0f} tokens/s "
                                   f"with {layout.batches_in_flight} batch{'es' if layout.batches_in_flight > 1 else ''} "
                                   "in flight, "
                                   f"{layout.tokens_per_s / best.tokens_per_s:.0%} of the best layout's.</p>")
        self.pane.show(layouts_figure(layouts, chosen))
