"""Module 09: a prefix's KV is not in GPU memory. Reload it from a tier, or recompute it by prefill?

Controls for the tier (``kv_tiers.TIERS``), model, GPU, prompt length, the FLOP/s recompute runs
at (an achieved figure, or a share of the bf16 peak) and whether attention's quadratic term is
counted; a readout of both times at the chosen length with the winner and the speedup, and a
plotly log-log chart of both times against prompt length with the crossover marked.

Every number comes from ``course_lib.perf.kv_tiers`` (``reload_vs_recompute_table``,
``crossover_tokens``, ``weight_read_bound_below``); the widget lays them out and redraws in place.
"""

from __future__ import annotations

import html

import ipywidgets as w
import numpy as np
import plotly.graph_objects as go

from course_lib.perf.hardware import GPU, GPUS, get_gpu
from course_lib.perf.kv_tiers import (
    COPY_KERNEL_BIDIRECTIONAL_BANDWIDTH,
    CPU_DRAM,
    DEFAULT_UTILIZATION,
    DMA_BIDIRECTIONAL_BANDWIDTH,
    TIERS,
    KVTier,
    ReloadOrRecompute,
    crossover_tokens,
    get_tier,
    recompute_flops_per_s,
    reload_vs_recompute_table,
    tier_on_gpu,
    weight_read_bound_below,
)
from course_lib.perf.models import MODELS, ModelSpec, get_model
from course_lib.perf.units import format_duration, format_number, format_si, plural
from course_lib.widgets.crossover import log_options
from course_lib.widgets.figure_pane import one_at_a_time
from course_lib.widgets.log_ticks import label_log_axis, time_ticks
from course_lib.widgets.plotly_pane import PlotlyPane
from course_lib.widgets.selection_readout import with_readout

MIN_LENGTH, MAX_LENGTH, WORKED_LENGTH = 16, 131_072, 10_100
LENGTH_STOPS = tuple(sorted({int(v) for _, v in log_options(MIN_LENGTH, MAX_LENGTH,
                                                             [MIN_LENGTH, 1024, WORKED_LENGTH, MAX_LENGTH])}))
CHART_LENGTHS = tuple(int(n) for n in np.unique(np.round(np.logspace(np.log2(MIN_LENGTH), np.log2(MAX_LENGTH),
                                                                      97, base=2))))
DEFAULT_MODEL, DEFAULT_GPU, DEFAULT_TFLOPS = "Llama-3.1-8B", "H100-80GB", 500.0
ACHIEVED, UTILIZATION = "achieved", "utilization"
H100_CLASS_BF16 = get_gpu("H100-80GB").bf16_flops
COLOURS = {"reload": "#1f77b4", "recompute": "#ff7f0e"}

DMA_NOTE = (
    "<b>Why DMA copies matter.</b> vLLM's KV offloading connector moves blocks between GPU and CPU memory with "
    "<code>cudaMemcpyAsync</code>, which runs on the GPU's copy (DMA) engines, instead of a copy kernel: the "
    "transfer then takes no SMs away from the model running beside it. On an H100 vLLM measured "
    f"{DMA_BIDIRECTIONAL_BANDWIDTH / 1e9:.1f} GB/s bidirectional for the DMA engines against "
    f"{COPY_KERNEL_BIDIRECTIONAL_BANDWIDTH / 1e9:.1f} GB/s for a custom copy kernel.")
PAYS_NOTE = (
    "<b>When offload pays.</b> Only when there is something to save: a prefix that is reused (a shared system "
    "prompt, a multi-turn chat) or a request preempted and resumed. Reloading then replaces a prefill. As reported "
    "by vLLM's offloading-connector post, that gave 2-22x lower time to first token for a single request and up "
    "to 9x the throughput with many concurrent prefills. KV that is never read again is only copy traffic.")


def default_tflops(gpu: GPU) -> float:
    """The achieved-FLOP/s default: 500 TFLOP/s on an H100-class GPU (H100, H200), else the bf16 peak
    times ``DEFAULT_UTILIZATION`` (``kv_tiers.recompute_flops_per_s``), in TFLOP/s."""
    if gpu.bf16_flops == H100_CLASS_BF16:
        return DEFAULT_TFLOPS
    return round(recompute_flops_per_s(gpu) / 1e12, 1)


def tier_label(name: str) -> str:
    """A tier's name in the menu, whatever the GPU: the CPU tiers ride the chosen GPU's own PCIe link
    (``kv_tiers.tier_on_gpu``), so the menu leaves the generation out and the readout names it."""
    return name.replace("PCIe Gen5", "the GPU's PCIe")


def point(model: ModelSpec, tier: KVTier, gpu: GPU, tokens: int, flops: float | None = None,
          include_attention: bool = False, utilization: float = DEFAULT_UTILIZATION) -> ReloadOrRecompute:
    """The two costs at one prompt length (``reload_vs_recompute_table`` for one length)."""
    (row,) = reload_vs_recompute_table(model, tier, gpu, [tokens], flops=flops, include_attention=include_attention,
                                       utilization=utilization)
    return row


def readout_html(model: ModelSpec, tier: KVTier, gpu: GPU, row: ReloadOrRecompute, flops_per_s: float) -> str:
    """Both times at the chosen length, the KV bytes, the winner and the speedup."""
    if tier.resident:
        verdict = "<b>reload wins</b>: the KV is already in HBM, nothing to copy"
    elif row.winner == "reload":
        verdict = f"<b>reload wins, {format_number(row.speedup)}x faster</b> than recomputing"
    else:
        verdict = f"<b>recompute wins, {format_number(1 / row.speedup)}x faster</b> than reloading"
    return (f"<p>{row.tokens:,} tokens of {html.escape(model.name)}: <b>{format_si(row.kv_bytes, 'B')}</b> of KV. "
            f"Reload from {html.escape(tier.name)}: <b>{format_duration(row.reload_s)}</b>; recompute on "
            f"{html.escape(gpu.name)} at {flops_per_s / 1e12:.1f} TFLOP/s: <b>{format_duration(row.recompute_s)}</b>. "
            f"{verdict}.</p>")


def crossover_html(model: ModelSpec, tier: KVTier, gpu: GPU, crossing: float | None,
                   first: ReloadOrRecompute) -> str:
    """The crossover in words, or which side wins everywhere (told apart at the first length)."""
    if crossing is not None:
        below = (f" (below the chart's {MIN_LENGTH} tokens: only the tier's fixed latency makes recompute win "
                 "there)" if crossing < MIN_LENGTH else "")
        return (f"<p><b>Crossover at {plural(round(crossing), 'token')}</b>{below}: recompute is faster below it, "
                "reload beyond it.</p>")
    if first.winner == "reload":
        return (f"<p><b>Reload wins at every length</b>, from the first token to {MAX_LENGTH:,}: no crossover "
                f"(the tier's latency costs less than recomputing even the first tokens).</p>")
    return f"<p><b>Recompute wins at every length</b> up to {MAX_LENGTH:,} tokens from this tier.</p>"


def floor_html(model: ModelSpec, gpu: GPU, floor: float) -> str:
    """Where a prefill stops being bound by reading the weights; at a FLOP/s so low that even one
    token's FLOPs outlast the weight read (``floor`` < 1), that there is no such length."""
    if floor < 1:
        return (f"<p><i>Weight-read floor:</i> none at this FLOP/s: even a one-token prefill of "
                f"{html.escape(model.name)} on {html.escape(gpu.name)} spends longer on its FLOPs than on reading "
                "the weights once, so the recompute time drawn is FLOP-bound at every length.</p>")
    return (f"<p><i>Weight-read floor:</i> below about {plural(round(floor), 'token')} a prefill of "
            f"{html.escape(model.name)} on {html.escape(gpu.name)} is bound by reading the weights once, not by its "
            "FLOPs, so the recompute time drawn there (FLOPs only) is an underestimate, and per-step overheads add more.</p>")


def reload_recompute_figure(model: ModelSpec, tier: KVTier, gpu: GPU, flops: float | None = None,
                            include_attention: bool = False, utilization: float = DEFAULT_UTILIZATION,
                            tokens: int | None = None) -> go.Figure:
    """Reload and recompute time (seconds, log-log) over ``CHART_LENGTHS``; a marker where
    ``crossover_tokens`` finds a crossover, a dotted line at the weight-read floor and a dashed
    one at the chosen ``tokens``. A resident tier has no reload curve: reload costs 0."""
    rows = reload_vs_recompute_table(model, tier, gpu, list(CHART_LENGTHS), flops=flops,
                                     include_attention=include_attention, utilization=utilization)
    figure = go.Figure()
    lengths = [r.tokens for r in rows]
    if not tier.resident:
        figure.add_trace(go.Scatter(x=lengths, y=[r.reload_s for r in rows], mode="lines",
                                    name=f"reload from {tier.name}", line={"color": COLOURS["reload"], "width": 2.5},
                                    customdata=[format_duration(r.reload_s) for r in rows],
                                    hovertemplate="reload: %{x:,} tokens in %{customdata}<extra></extra>"))
    figure.add_trace(go.Scatter(x=lengths, y=[r.recompute_s for r in rows], mode="lines",
                                name="recompute by prefill" + (" (with attention)" if include_attention else ""),
                                line={"color": COLOURS["recompute"], "width": 2.5},
                                customdata=[format_duration(r.recompute_s) for r in rows],
                                hovertemplate="recompute: %{x:,} tokens in %{customdata}<extra></extra>"))
    values = [v for r in rows for v in (r.reload_s, r.recompute_s) if v > 0]
    low, high = min(values), max(values)
    crossing = crossover_tokens(model, tier, gpu, flops=flops, include_attention=include_attention,
                                utilization=utilization, max_tokens=MAX_LENGTH)
    if crossing is not None and MIN_LENGTH <= crossing:  # one below the chart's range is told in words only
        at = point(model, tier, gpu, max(1, round(crossing)), flops, include_attention, utilization)
        figure.add_trace(go.Scatter(x=[crossing], y=[at.reload_s], mode="markers",
                                    name=f"crossover: {crossing:,.0f} tokens",
                                    marker={"size": 14, "color": "#d62728", "symbol": "star"},
                                    hovertemplate=f"crossover at {crossing:,.1f} tokens<extra></extra>"))
    floor = weight_read_bound_below(model, gpu, flops, utilization=utilization)
    if MIN_LENGTH <= floor <= MAX_LENGTH:
        figure.add_trace(go.Scatter(x=[floor, floor], y=[low, high], mode="lines", hoverinfo="skip",
                                    name=f"weight-read floor: {floor:,.0f} tokens",
                                    line={"color": "#7f7f7f", "dash": "dot", "width": 1}))
    if tokens is not None:
        figure.add_trace(go.Scatter(x=[tokens, tokens], y=[low, high], mode="lines", hoverinfo="skip",
                                    name=f"chosen length: {tokens:,} tokens",
                                    line={"color": "#444", "dash": "dash", "width": 1}))
    f = recompute_flops_per_s(gpu, flops, utilization)
    figure.update_xaxes(type="log", title_text="prompt length (tokens, log scale)")
    label_log_axis(figure, "x")  # plain token counts in one style, no '2' and '5' minor labels
    figure.update_yaxes(type="log", title_text="time to have the prefix's KV on the GPU (log scale)",
                        **time_ticks(low, high))
    figure.update_layout(title=f"{model.name}: reload from {tier.name}<br>or recompute on {gpu.name} at "
                               f"{f / 1e12:.1f} TFLOP/s", height=460, legend={"orientation": "h", "y": -0.22},
                         margin={"t": 80, "b": 120})
    return figure


class ReloadOrRecomputeExplorer(w.VBox):
    """Tier, model, GPU, prompt length, FLOP/s (achieved TFLOP/s or a share of the bf16 peak) and an
    attention toggle over a readout, the crossover line, the weight-read floor note, a chart and the
    fixed notes. Invariants: ``readout``, ``verdict``, ``floor`` and ``pane`` are the same widgets after
    every change (redrawn in place); choosing a GPU resets the achieved TFLOP/s to its default."""

    def __init__(self, tier: str = CPU_DRAM, model: str = DEFAULT_MODEL, gpu: str = DEFAULT_GPU,
                 tokens: int = WORKED_LENGTH, tflops: float | None = None, include_attention: bool = False) -> None:
        style = {"description_width": "13em"}  # 'prompt length (tokens)' whole

        def layout() -> w.Layout:  # one each: redraw hides one control by its layout
            return w.Layout(width="560px")

        self.tier = w.Dropdown(options=[(tier_label(name), name) for name in TIERS], value=tier, description="KV tier",
                               style=style, layout=layout())
        self.model = w.Dropdown(options=list(MODELS), value=model, description="model", style=style)
        self.gpu = w.Dropdown(options=list(GPUS), value=gpu, description="GPU", style=style)
        self.tokens = w.SelectionSlider(options=[(f"{n:,}", n) for n in LENGTH_STOPS], value=tokens,
                                        description="prompt length (tokens)",
                                        style=style, layout=layout())
        self.flops_mode = w.ToggleButtons(options=[("achieved TFLOP/s", ACHIEVED), ("share of bf16 peak", UTILIZATION)],
                                          value=ACHIEVED, description="recompute at", style=style)
        self.tflops = w.BoundedFloatText(value=default_tflops(get_gpu(gpu)) if tflops is None else tflops,
                                         min=1.0, max=10_000.0, step=10.0, description="achieved TFLOP/s", style=style)
        self.utilization = w.FloatSlider(value=DEFAULT_UTILIZATION, min=0.05, max=1.0, step=0.05,
                                         description="share of bf16 peak", style=style, layout=layout())
        self.include_attention = w.Checkbox(value=include_attention, description="count attention's quadratic term",
                                            indent=False)
        self.readout, self.verdict, self.floor, self.pane = w.HTML(), w.HTML(), w.HTML(), PlotlyPane()
        for control in (self.tier, self.model, self.tokens, self.flops_mode, self.tflops, self.utilization,
                        self.include_attention):
            control.observe(lambda _: self.redraw(), "value")
        self.gpu.observe(self._gpu_changed, "value")
        super().__init__([self.tier, self.model, self.gpu, with_readout(self.tokens), self.flops_mode, self.tflops,
                          self.utilization, self.include_attention, self.readout, self.verdict, self.pane, self.floor,
                          w.HTML(f"<p>{DMA_NOTE}</p><p>{PAYS_NOTE}</p>")])
        self.redraw()

    def _gpu_changed(self, _) -> None:
        default = default_tflops(get_gpu(self.gpu.value))
        if self.tflops.value != default:
            self.tflops.value = default  # observed: redraws
        else:
            self.redraw()

    def settings(self) -> dict:
        """The cost models' arguments for the current controls."""
        achieved, gpu = self.flops_mode.value == ACHIEVED, get_gpu(self.gpu.value)
        return {"model": get_model(self.model.value), "tier": tier_on_gpu(get_tier(self.tier.value), gpu),
                "gpu": gpu, "flops": self.tflops.value * 1e12 if achieved else None,
                "include_attention": self.include_attention.value, "utilization": self.utilization.value}

    @one_at_a_time
    def redraw(self) -> None:
        achieved = self.flops_mode.value == ACHIEVED
        self.tflops.layout.display = None if achieved else "none"
        self.utilization.layout.display = "none" if achieved else None
        s = self.settings()
        model, tier, gpu = s["model"], s["tier"], s["gpu"]
        args = (s["flops"], s["include_attention"], s["utilization"])
        f = recompute_flops_per_s(gpu, s["flops"], s["utilization"])
        row = point(model, tier, gpu, self.tokens.value, *args)
        peak = (f"<p style='color:#9a6700'>{f / 1e12:.0f} TFLOP/s is above {html.escape(gpu.name)}'s dense bf16 "
                f"peak of {gpu.bf16_flops / 1e12:.0f} TFLOP/s.</p>" if f > gpu.bf16_flops else "")
        beyond = (f"<p style='color:#9a6700'>{row.tokens:,} tokens is beyond {html.escape(model.name)}'s "
                  f"{model.max_context:,}-token context.</p>" if row.tokens > model.max_context else "")
        self.readout.value = readout_html(model, tier, gpu, row, f) + peak + beyond
        crossing = crossover_tokens(model, tier, gpu, flops=s["flops"], include_attention=s["include_attention"],
                                    utilization=s["utilization"], max_tokens=MAX_LENGTH)
        self.verdict.value = crossover_html(model, tier, gpu, crossing, point(model, tier, gpu, 1, *args))
        self.floor.value = floor_html(model, gpu, weight_read_bound_below(model, gpu, s["flops"],
                                                                          utilization=s["utilization"]))
        self.pane.show(reload_recompute_figure(model, tier, gpu, *args, tokens=self.tokens.value))
