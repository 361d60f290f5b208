"""Module 09: "What fits, and which kernel wins?" Three scheme cards (BF16, W4A16, FP8-W8A8) for a
model, a GPU, a decode batch and a context length, and a plotly chart of tokens/s against the batch
with the FP8-over-W4A16 crossover marked.

Every number comes from ``course_lib.perf.quant_cost`` (``scheme_table``, ``min_gpus_for_weights``,
``max_batch_in_memory``, ``min_gpus_for_batch``, ``crossover_batch``) and ``course_lib.perf.kv``
(``kv_bytes_per_batch``); the widget only lays them out and redraws its cards and chart in place.
Times are for one GPU's roofs: with n GPUs in tensor parallel both roofs scale by n and the
crossover batch does not move (``quant_cost``'s docstring).
"""

from __future__ import annotations

import html

import ipywidgets as w
import numpy as np
import plotly.graph_objects as go

from course_lib.perf.hardware import GPU, GPUS, get_gpu
from course_lib.perf.kv import kv_bytes_per_batch
from course_lib.perf.models import MODELS, ModelSpec, get_model
from course_lib.perf.quant_cost import (
    SCHEMES,
    SERVING_MEMORY_UTILIZATION,
    crossover_batch,
    max_batch_in_memory,
    min_gpus_for_batch,
    min_gpus_for_weights,
    scheme_available,
    scheme_table,
    weight_memory,
)
from course_lib.perf.units import GB, format_si, plural
from course_lib.widgets.log_ticks import label_log_axis
from course_lib.widgets.figure_pane import one_at_a_time
from course_lib.widgets.plotly_pane import PlotlyPane
from course_lib.widgets.selection_readout import with_readout

BATCH_STOPS = tuple(2**k for k in range(11))  # the slider: 1, 2, 4, ... 1024
CHART_BATCHES = tuple(int(b) for b in np.unique(np.round(np.logspace(0, 10, 61, base=2))))  # 1 .. 1024
CONTEXT_STOPS = (128, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
COLOURS = {"BF16": "#7f7f7f", "W4A16": "#1f77b4", "FP8-W8A8": "#d62728"}
WINNER_COLOUR = "#1a7f37"
DEFAULT_MODEL, DEFAULT_GPU = "Llama-3.1-70B", "H100-80GB"

NOTES = {
    "BF16": ("The accuracy baseline: every weight kept at 16 bits, so it is what the other two are judged "
             "against. It is also the heaviest, two bytes a weight: the GPU count above is what its weights "
             "alone need, before a single byte of KV cache."),
    "W4A16": ("Weight-only int4: the fewest bytes to read per step. Mixed-input kernels such as Marlin or "
              "Machete unpack and dequantise each tile in registers and multiply on the bf16 tensor cores, so "
              "it wins while decode is bandwidth-bound, at small batches."),
    "FP8-W8A8": ("Weights and activations both in FP8: the matmuls run on FP8 tensor cores at twice BF16's "
                 "peak, with no dequantise step. Once the batch is large, W4A16's step becomes compute-bound on "
                 "the bf16 tensor cores while FP8's twice-as-fast ones keep its own step near the memory roof, "
                 "so FP8 wins. FP8 tensor cores need Hopper or Ada (Blackwell adds FP4)."),
}


def unsupported_text(scheme: str, gpu: GPU) -> str:
    """The line a card shows where the GPU cannot run the scheme."""
    return f"not supported on {gpu.name}: no FP8 tensor cores"


def scheme_cards(model: ModelSpec, gpu: GPU, batch: int, context_len: int = 1024) -> dict:
    """What the cards show, from the cost model: ``{"best", "kv_bytes", "schemes": {name: {"weight_bytes",
    "checkpoint_bytes" (embeddings and lm_head in 16 bits), "gpus_for_weights", "checkpoint_gpus" (the GPUs
    those checkpoint bytes need), "room" (sequences whose KV
    fits beside the weights on one GPU), "gpus_for_batch", "supported", and where supported "time_s",
    "tokens_per_s", "bound"}}}``. ``kv_bytes`` is the batch's bf16 KV cache, the same for every scheme."""
    (row,) = scheme_table(model, gpu, (batch,), context_len)
    cards = {}
    for name in SCHEMES:
        card = {"weight_bytes": weight_memory(model, name),
                "checkpoint_bytes": weight_memory(model, name, quantized_embeddings=False),
                "gpus_for_weights": min_gpus_for_weights(model, name, gpu),
                "checkpoint_gpus": min_gpus_for_weights(model, name, gpu, quantized_embeddings=False),
                "room": max_batch_in_memory(model, name, gpu, context_len),
                "gpus_for_batch": min_gpus_for_batch(model, name, gpu, batch, context_len),
                "supported": scheme_available(name, gpu)}
        cell = row["schemes"][name]
        if cell is not None:
            card.update(time_s=cell["time_s"], tokens_per_s=cell["tokens_per_s"], bound=cell["bound"])
        cards[name] = card
    return {"best": row["best"], "kv_bytes": kv_bytes_per_batch(model, context_len, batch, "bf16"), "schemes": cards}


def kv_line(card: dict, kv_bytes: float, gpu: GPU, batch: int, context_len: int) -> str:
    """Whether the batch's KV cache fits beside this scheme's weights on one GPU, and if not, how many
    GPUs the weights and KV need together (``min_gpus_for_batch``)."""
    kv = f"KV cache, batch {batch:,} x {context_len:,} tokens: <b>{format_si(kv_bytes, 'B')}</b>"
    if card["gpus_for_batch"] == 1:
        return f"{kv}, fits (room for {plural(card['room'], 'such sequence')})"
    return (f"{kv}: <b style='color:#cf222e'>does not fit</b> on one {html.escape(gpu.name)} beside the weights "
            f"(room for {card['room']:,}); with them it needs at least <b>{card['gpus_for_batch']}</b> GPUs")


def fit_text(shown: dict, model: ModelSpec, gpu: GPU, batch: int, context_len: int) -> str:
    """A warning when the fastest card's batch does not fit on one GPU, in words; else ''."""
    best = shown["schemes"][shown["best"]]
    if best["gpus_for_batch"] == 1:
        return ""
    return (f"<b style='color:#cf222e'>Batch {batch:,} does not fit on one {html.escape(gpu.name)}:</b> its KV cache "
            f"alone is {format_si(shown['kv_bytes'], 'B')} ({plural(batch, 'sequence')} of {context_len:,} tokens "
            f"of {html.escape(model.name)}, <code>perf/kv.py</code>), while beside {shown['best']}'s weights there is "
            f"room for {plural(best['room'], 'such sequence')} in {SERVING_MEMORY_UTILIZATION:.0%} of its memory "
            "(vLLM's default <code>gpu_memory_utilization</code>). The cards still cost the step on one GPU's roofs, "
            f"as if it fitted; serving this batch takes at least {best['gpus_for_batch']} GPUs for weights and KV "
            "together. ")


def card_html(name: str, card: dict, gpu: GPU, batch: int, winner: bool, kv_bytes: float, context_len: int) -> str:
    """One scheme's card: its numbers, the winner's border, and the static note."""
    border = f"3px solid {WINNER_COLOUR}" if winner else "1px solid #bbb"
    badge = f" <span style='color:{WINNER_COLOUR}'>★ fastest at batch {batch}</span>" if winner else ""
    gpus, shipped_gpus = card["gpus_for_weights"], card["checkpoint_gpus"]
    shipped = card["checkpoint_bytes"]
    lines = [f"weight memory: <b>{card['weight_bytes'] / GB:.1f} GB</b>"
             + (f" ({shipped / GB:.1f} GB as checkpoints ship it, embeddings and lm_head in 16 bits)"
                if shipped != card["weight_bytes"] else ""),
             f"GPUs for the weights ({html.escape(gpu.name)}): <b>{gpus}</b>"
             + (f", <b>{shipped_gpus}</b> as checkpoints ship it" if shipped_gpus != gpus else "")
             + (" (before any KV cache)" if max(gpus, shipped_gpus) > 1 else ""),
             kv_line(card, kv_bytes, gpu, batch, context_len)]
    if card["supported"]:
        bound = "bandwidth-bound" if card["bound"] == "memory" else "compute-bound"
        lines += [f"decode step at batch {batch}: <b>{card['time_s'] * 1e3:.2f} ms</b>",
                  f"throughput: <b>{card['tokens_per_s']:,.0f} tokens/s</b>",
                  f"<b>{bound}</b> here"]
    else:
        lines.append(f"<b style='color:#cf222e'>{html.escape(name)} {unsupported_text(name, gpu)}</b>")
    body = "<br>".join(lines)
    return (f"<div class='scheme-card' data-scheme='{name}' data-winner='{str(winner).lower()}' "
            f"style='border:{border};border-radius:6px;padding:8px;box-sizing:border-box;min-height:300px'>"
            f"<h4 style='margin:0 0 6px 0'>{html.escape(name)}{badge}</h4>"
            f"<div style='color:#444;font-size:90%'>{html.escape(SCHEMES[name].description)}</div>"
            f"<p>{body}</p><p style='font-size:90%'>{html.escape(NOTES[name])}</p></div>")


def crossover_text(model: ModelSpec, gpu: GPU, context_len: int) -> str:
    """Where FP8-W8A8 overtakes W4A16, in words (``crossover_batch``)."""
    if not scheme_available("FP8-W8A8", gpu):
        return (f"<b>No crossover on {html.escape(gpu.name)}</b>: it has no FP8 tensor cores, so W4A16 and BF16 "
                "are the only choices.")
    at = crossover_batch(model, gpu, context_len)
    if at is None:
        return (f"<b>FP8-W8A8 never overtakes W4A16</b> here (up to batch 65,536): at {context_len:,} tokens of "
                "context the KV reads keep the step on the memory roof, where W4A16's fewer bytes win.")
    reach = "" if at <= CHART_BATCHES[-1] else " (beyond this chart's batch 1024)"
    return (f"<b>FP8-W8A8 overtakes W4A16 from batch {at}</b>{reach}: below it the step is bandwidth-bound "
            "and W4A16 reads fewer bytes; from there W4A16's step is compute-bound on the bf16 tensor cores, "
            "and FP8's, twice as fast, win.")


def scheme_figure(model: ModelSpec, gpu: GPU, context_len: int = 1024, batch: int | None = None) -> go.Figure:
    """Tokens/s against the decode batch for each scheme the GPU can run (``scheme_table``), a star
    at ``crossover_batch`` on the FP8 curve when it lies in the chart's range, and a dotted line at
    the chosen ``batch``."""
    rows = scheme_table(model, gpu, CHART_BATCHES, context_len)
    figure = go.Figure()
    for name in SCHEMES:
        if rows[0]["schemes"][name] is None:
            continue
        figure.add_trace(go.Scatter(
            x=list(CHART_BATCHES), y=[row["schemes"][name]["tokens_per_s"] for row in rows], mode="lines",
            name=name, line={"color": COLOURS[name], "width": 2.5},
            hovertemplate=f"{name}: batch %{{x}}, %{{y:,.0f}} tokens/s<extra></extra>"))
    values = [c["tokens_per_s"] for row in rows for c in row["schemes"].values() if c]
    low, high = min(values), max(values)
    at = crossover_batch(model, gpu, context_len)
    if at is not None and at <= CHART_BATCHES[-1]:
        (row,) = scheme_table(model, gpu, (at,), context_len)
        figure.add_trace(go.Scatter(x=[at, at], y=[low, high], mode="lines", showlegend=False, hoverinfo="skip",
                                    line={"color": "#d62728", "dash": "dot", "width": 1}))
        figure.add_trace(go.Scatter(
            x=[at], y=[row["schemes"]["FP8-W8A8"]["tokens_per_s"]], mode="markers",
            name=f"FP8 overtakes W4A16: batch {at}",
            marker={"size": 14, "color": "#d62728", "symbol": "star", "line": {"width": 1}},
            hovertemplate=f"crossover at batch {at}: %{{y:,.0f}} tokens/s<extra></extra>"))
    if batch is not None:
        figure.add_trace(go.Scatter(x=[batch, batch], y=[low, high], mode="lines", name=f"chosen batch {batch}",
                                    hoverinfo="skip", line={"color": "#444", "dash": "dash", "width": 1}))
    no_fp8 = "" if scheme_available("FP8-W8A8", gpu) else " (no FP8 on this GPU)"
    figure.update_xaxes(type="log", title_text="decode batch (sequences, log scale)",
                        tickvals=list(BATCH_STOPS), ticktext=[str(b) for b in BATCH_STOPS])
    figure.update_yaxes(type="log", title_text="decode throughput (tokens/s, log scale)")
    label_log_axis(figure, "y")  # one style; 1-2-5 ticks where the curves span under two decades
    figure.update_layout(title=f"{model.name} on one {gpu.name}, {context_len:,} tokens of context: "
                               f"tokens/s by weight scheme{no_fp8}",
                         height=460, legend={"orientation": "h", "y": -0.22}, margin={"t": 80, "b": 120})
    return figure


class QuantSchemes(w.VBox):
    """Model, GPU, batch and context controls over three scheme cards, a crossover line and a chart.
    Invariants: ``cards`` (one ``w.HTML`` per scheme), ``verdict`` and ``pane`` are the same widgets
    after every change (redrawn in place); the winner's card is ``best``'s, from ``scheme_table``."""

    def __init__(self, model: str = DEFAULT_MODEL, gpu: str = DEFAULT_GPU, batch: int = 1,
                 context_len: int = 1024) -> None:
        style, layout = {"description_width": "9em"}, w.Layout(width="520px")
        self.model = w.Dropdown(options=list(MODELS), value=model, description="model", style=style)
        self.gpu = w.Dropdown(options=list(GPUS), value=gpu, description="GPU", style=style)
        self.batch = w.SelectionSlider(options=BATCH_STOPS, value=batch, description="decode batch",
                                       style=style, layout=layout)
        self.context_len = w.SelectionSlider(options=[(f"{c:,}", c) for c in CONTEXT_STOPS], value=context_len,
                                             description="context (tokens)", style=style, layout=layout)
        self.cards = {name: w.HTML(layout=w.Layout(flex="1 1 250px", min_width="250px", max_width="340px"))
                      for name in SCHEMES}
        self.verdict, self.pane = w.HTML(), PlotlyPane()
        self.best: str | None = None
        for control in (self.model, self.gpu, self.batch, self.context_len):
            control.observe(lambda _: self.redraw(), "value")
        cards = w.HBox(list(self.cards.values()), layout=w.Layout(flex_flow="row wrap", grid_gap="6px"))
        super().__init__([w.HTML("<h3>What fits, and which kernel wins?</h3>"), self.model, self.gpu,
                          with_readout(self.batch), with_readout(self.context_len), cards, self.verdict, self.pane])
        self.redraw()

    @one_at_a_time
    def redraw(self) -> None:
        model, gpu = get_model(self.model.value), get_gpu(self.gpu.value)
        batch, context_len = self.batch.value, self.context_len.value
        shown = scheme_cards(model, gpu, batch, context_len)
        self.best = shown["best"]
        for name, card in shown["schemes"].items():
            self.cards[name].value = card_html(name, card, gpu, batch, name == self.best, shown["kv_bytes"],
                                               context_len)
        beyond = (f" Note: {context_len:,} tokens is beyond {html.escape(model.name)}'s "
                  f"{model.max_context:,}-token context." if context_len > model.max_context else "")
        self.verdict.value = (f"<p>{fit_text(shown, model, gpu, batch, context_len)}"
                              f"{crossover_text(model, gpu, context_len)} Times use one GPU's roofs; with n GPUs "
                              f"in tensor parallel both roofs scale by n and the crossover stays put.{beyond}</p>")
        self.pane.show(scheme_figure(model, gpu, context_len, batch))
