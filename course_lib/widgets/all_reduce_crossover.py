"""One-shot, two-shot and ring all-reduce against message size: the alpha-beta model of
``course_lib.perf.tp_all_reduce`` with sliders, or rows measured by
``course_lib.collectives.symmetric.benchmark``, in one plotly pane redrawn in place.

Model mode marks where two-shot overtakes one-shot (K* = alpha B N / ((N-1)(N-2)), never on
N = 2) and where one-shot stops beating the ring, and says where vLLM's measured switch sits;
measured mode marks the crossover that ``symmetric.crossovers`` finds in the rows.
"""

from __future__ import annotations

import ipywidgets as w
import numpy as np
import plotly.graph_objects as go

from course_lib.collectives.symmetric import crossovers
from course_lib.perf.comm import LINKS
from course_lib.perf.tp_all_reduce import (
    DEFAULT_ALPHA_S,
    DEFAULT_BANDWIDTH,
    TP_ALGORITHMS,
    all_reduce_time,
    alpha_for_crossover,
    one_shot_ring_crossover_bytes,
    two_shot_crossover_bytes,
    vllm_two_shot_from,
)
from course_lib.perf.units import KiB, format_bytes
from course_lib.widgets.crossover import log_options
from course_lib.widgets.figure_pane import one_at_a_time
from course_lib.widgets.plotly_pane import PlotlyPane
from course_lib.widgets.selection_readout import with_readout

SIZES = np.logspace(10, 26, 129, base=2)  # 1 KiB .. 64 MiB
TICKS = [KiB * 4**k for k in range(9)]
RANK_OPTIONS = (2, 3, 4, 8, 16)
COLOURS = {"one-shot": "#1f77b4", "two-shot": "#ff7f0e", "ring": "#2ca02c"}
DASHES = {"one-shot": "solid", "two-shot": "dash", "ring": "solid"}  # at N = 2 two-shot lies on the ring
MEASURED = {"one_shot_s": ("one-shot", "#1f77b4", "solid"), "two_shot_s": ("two-shot", "#ff7f0e", "solid"),
            "ring_s": ("hand-written ring (collectives/ring.py)", "#2ca02c", "dash"),
            "gloo_s": ("gloo's dist.all_reduce", "#9467bd", "dot"),
            "nccl_s": ("NCCL's dist.all_reduce", "#9467bd", "dot")}
"""The columns of ``symmetric.benchmark``'s rows that are plotted, when a row has them: (label,
colour, dash). Every row has ``bytes``, ``one_shot_s`` and ``two_shot_s``; the baselines vary."""
SHORT_NAMES = {"one_shot": "one-shot", "two_shot": "two-shot", "ring": "the hand-written ring", "gloo": "gloo",
               "nccl": "NCCL"}
MODEL, MEASURED_MODE = "model", "measured"


def _axes(figure: go.Figure, title: str) -> go.Figure:
    figure.update_xaxes(type="log", title_text="message size K (bytes, log scale)", tickvals=TICKS,
                        ticktext=[format_bytes(t) for t in TICKS])
    figure.update_yaxes(type="log", title_text="all-reduce time (µs, log scale)")
    figure.update_layout(title=title, height=460, legend={"orientation": "h", "y": -0.22}, margin={"t": 80, "b": 120})
    return figure


def _vertical(figure: go.Figure, x: float, low: float, high: float, colour: str) -> None:
    """A dotted vertical line as a trace (shapes on log axes want log10 coordinates; traces do not)."""
    figure.add_trace(go.Scatter(x=[x, x], y=[low, high], mode="lines", showlegend=False, hoverinfo="skip",
                                line={"color": colour, "dash": "dot", "width": 1}))


def vllm_text(num_ranks: int, bandwidth: float) -> str:
    """Where vLLM's measured switch sits for ``num_ranks`` GPUs (``tp_all_reduce.vllm_two_shot_from``),
    and the alpha at which this model, at ``bandwidth``, would put K* there."""
    try:
        switch = vllm_two_shot_from(num_ranks)
    except ValueError:
        return f"vLLM's custom all-reduce has no kernel for {num_ranks} GPUs (it runs on 2, 4, 6 or 8)."
    if switch is None:
        return f"vLLM's custom all-reduce, tuned by measurement, also runs one-shot at every size on {num_ranks} GPUs."
    alpha = alpha_for_crossover(num_ranks, switch, bandwidth)
    return (f"vLLM's custom all-reduce, tuned by measurement on NVLink, switches to two-shot at "
            f"{format_bytes(switch)} on {num_ranks} GPUs: this model puts K* there with α = {alpha * 1e6:.2f} µs "
            f"at {bandwidth / 1e9:g} GB/s.")


def model_crossover_text(num_ranks: int, alpha_s: float, bandwidth: float) -> str:
    """What the model says, in words, with its sizes: where two-shot overtakes one-shot, and where
    one-shot stops beating the ring ("never at N = 2" for both on two ranks); then ``vllm_text``."""
    return f"{_model_text(num_ranks, alpha_s, bandwidth)} {vllm_text(num_ranks, bandwidth)}"


def _model_text(num_ranks: int, alpha_s: float, bandwidth: float) -> str:
    star = two_shot_crossover_bytes(num_ranks, alpha_s, bandwidth)
    ring = one_shot_ring_crossover_bytes(num_ranks, alpha_s, bandwidth)
    if star is None:
        return (f"<b>Never at N = {num_ranks}</b>: on {num_ranks} GPU{'s' if num_ranks > 1 else ''} one-shot and "
                "two-shot move the same bytes and two-shot pays one more round, so one-shot wins at every size "
                "(and beats the ring, which pays two rounds for the same bytes).")
    reach = "" if SIZES[0] <= star <= SIZES[-1] else " (off this plot's range)"
    ring_reach = "" if SIZES[0] <= ring <= SIZES[-1] else " (off this plot's range)"
    return (f"<b>Two-shot overtakes one-shot at {format_bytes(star)}</b>{reach}: K* = α B N / ((N−1)(N−2)) = "
            f"{alpha_s * 1e6:g} µs × {bandwidth / 1e9:g} GB/s × {num_ranks} / ({num_ranks - 1} × {num_ranks - 2}). "
            f"One-shot stops beating the ring at {format_bytes(ring)}{ring_reach} ((2N−3) K*); two-shot is never "
            "slower than the ring here: the same bytes in 2 rounds instead of 2(N−1).")


def model_figure(num_ranks: int, alpha_s: float = DEFAULT_ALPHA_S, bandwidth: float = DEFAULT_BANDWIDTH) -> go.Figure:
    """The three algorithms' times (µs) over ``SIZES``, and a marker on each crossover in range:
    "two-shot overtakes one-shot" at K* on the one-shot curve, "one-shot stops beating the ring" at
    (2N-3) K*. No marker when the crossover is None (N <= 2) or off the range."""
    figure = go.Figure()
    times = {name: [all_reduce_time(name, num_ranks, k, alpha_s, bandwidth) * 1e6 for k in SIZES]
             for name in TP_ALGORITHMS}
    for name, values in times.items():
        figure.add_trace(go.Scatter(x=SIZES, y=values, mode="lines", name=name,
                                    line={"color": COLOURS[name], "dash": DASHES[name], "width": 2.5},
                                    hovertemplate=f"{name}: %{{x:.3s}}B in %{{y:.3g}} µs<extra></extra>"))
    low, high = min(map(min, times.values())), max(map(max, times.values()))
    star = two_shot_crossover_bytes(num_ranks, alpha_s, bandwidth)
    ring = one_shot_ring_crossover_bytes(num_ranks, alpha_s, bandwidth)
    crossings = (("two-shot overtakes one-shot", star, "#d62728", "star"),
                 ("one-shot stops beating the ring", ring, "#7f7f7f", "circle-open"))
    for label, at, colour, symbol in crossings:
        if at is not None and SIZES[0] <= at <= SIZES[-1]:
            _vertical(figure, at, low, high, colour)
            at_us = all_reduce_time("one-shot", num_ranks, at, alpha_s, bandwidth) * 1e6  # both curves meet here
            figure.add_trace(go.Scatter(x=[at], y=[at_us],
                                        mode="markers", name=f"{label}: {format_bytes(at)}",
                                        marker={"size": 13, "color": colour, "symbol": symbol, "line": {"width": 2}},
                                        hovertemplate=f"{label} at {format_bytes(at)}: %{{y:.3g}} µs<extra></extra>"))
    return _axes(figure, f"All-reduce on {num_ranks} GPUs, α-β model: α = {alpha_s * 1e6:g} µs per round, "
                         f"{bandwidth / 1e9:g} GB/s per GPU")


def measured_crossover_text(rows: list[dict]) -> str:
    """``symmetric.crossovers(rows)`` in words, every pairing it finds."""
    found = crossovers(rows)
    parts = []
    for key, at in found.items():
        faster, slower = (SHORT_NAMES.get(name, name) for name in key.split("_over_"))
        parts.append(f"{faster} beats {slower} from {format_bytes(at)} on" if at is not None else
                     f"{faster} is not faster than {slower} at the largest size measured")
    star = found["two_shot_over_one_shot"]
    head = (f"<b>Measured: two-shot overtakes one-shot at {format_bytes(star)}</b>" if star is not None else
            "<b>Measured: two-shot never overtakes one-shot</b> (not faster at the largest size)")
    return f"{head}. In these rows {'; '.join(parts)}."


def measured_figure(rows: list[dict], world_size: int | None = None) -> go.Figure:
    """Rows of ``symmetric.benchmark`` (``bytes`` and the seconds of each column of ``MEASURED``
    they hold) as markers joined by lines, in µs, and a star on the two-shot point where
    ``symmetric.crossovers`` says two-shot overtakes one-shot (none when it never does)."""
    figure = go.Figure()
    sizes = [row["bytes"] for row in rows]
    columns = [column for column in MEASURED if column in rows[0]]
    for column in columns:
        label, colour, dash = MEASURED[column]
        figure.add_trace(go.Scatter(x=sizes, y=[row[column] * 1e6 for row in rows], mode="lines+markers", name=label,
                                    line={"color": colour, "dash": dash},
                                    hovertemplate=f"{label}: %{{x:.3s}}B in %{{y:.3g}} µs<extra></extra>"))
    star = crossovers(rows)["two_shot_over_one_shot"]
    if star is not None:
        values = [row[column] * 1e6 for row in rows for column in columns]
        _vertical(figure, star, min(values), max(values), "#d62728")
        at = next(row for row in rows if row["bytes"] == star)
        figure.add_trace(go.Scatter(x=[star], y=[at["two_shot_s"] * 1e6], mode="markers",
                                    name=f"measured crossover: two-shot overtakes one-shot at {format_bytes(star)}",
                                    marker={"size": 14, "color": "#d62728", "symbol": "star"}))
    on_gpus = "nccl_s" in rows[0]
    count = f"{world_size} " if world_size else ""
    where = (f"on {count}GPUs: PyTorch's symmetric-memory kernels against NCCL" if on_gpus else
             f"on {count}CPU ranks: symmetric shared-memory buffers against gloo")
    return _axes(figure, f"All-reduce measured {where}<br>median of the slowest rank per size")


class AllReduceCrossover(w.VBox):
    """Sliders for N, α (µs) and bandwidth (GB/s) over the model; with measured rows (passed in, or
    later with ``set_measured``) a toggle shows them instead. Invariants: ``pane`` and ``verdict``
    are the same widgets after every change (redrawn in place); in measured mode the sliders are
    disabled, since they do not change what was measured. It opens on the rows when given (the N
    slider at their ``world_size``), and hides the toggle while there are none."""

    def __init__(self, rows: list[dict] | None = None, world_size: int | None = None, num_ranks: int = 8,
                 alpha_us: float = DEFAULT_ALPHA_S * 1e6, bandwidth_gb_s: float = DEFAULT_BANDWIDTH / 1e9) -> None:
        style, layout = {"description_width": "10em"}, w.Layout(width="520px")
        self.rows, self.world_size = rows, world_size
        self.mode = w.ToggleButtons(options=[("α-β model", MODEL), ("measured", MEASURED_MODE)],
                                    value=MEASURED_MODE if rows else MODEL, description="show",
                                    layout=w.Layout(display=None if rows else "none"))  # no rows: nothing to toggle to
        if world_size in RANK_OPTIONS:  # the model opens at the measured N
            num_ranks = world_size
        self.num_ranks = w.SelectionSlider(options=RANK_OPTIONS, value=num_ranks, description="GPUs N",
                                           style=style, layout=layout)
        self.alpha_us = w.SelectionSlider(options=log_options(0.1, 100, [x.alpha_s * 1e6 for x in LINKS.values()]),
                                          value=alpha_us, description="α per round (µs)", style=style, layout=layout)
        self.bandwidth = w.SelectionSlider(options=log_options(1, 1000, [x.bandwidth / 1e9 for x in LINKS.values()]),
                                           value=bandwidth_gb_s, description="bandwidth (GB/s)", style=style,
                                           layout=layout)
        self.verdict, self.pane = w.HTML(), PlotlyPane()
        self.mode.observe(lambda _: self.redraw(), "value")
        for control in (self.num_ranks, self.alpha_us, self.bandwidth):
            control.observe(lambda _: self.redraw(), "value")
        sliders = [with_readout(slider) for slider in (self.num_ranks, self.alpha_us, self.bandwidth)]
        super().__init__([self.mode, *sliders, self.verdict, self.pane])
        self.redraw()

    def set_measured(self, rows: list[dict], world_size: int | None = None) -> None:
        """Take rows from ``symmetric.benchmark`` and show them."""
        self.rows, self.world_size = rows, world_size
        self.mode.layout.display = None
        if world_size in RANK_OPTIONS:
            self.num_ranks.value = world_size  # observed: redraws the model first, then the rows below
        if self.mode.value == MEASURED_MODE:
            self.redraw()
        else:
            self.mode.value = MEASURED_MODE  # observed: redraws

    @one_at_a_time
    def redraw(self) -> None:
        measured = self.mode.value == MEASURED_MODE
        for slider in (self.num_ranks, self.alpha_us, self.bandwidth):
            slider.disabled = measured
        if measured and not self.rows:
            self.verdict.value = ("No measurements yet: run <code>symmetric.benchmark(world_size)</code> and pass "
                                  "its rows to <code>set_measured</code>.")
            self.pane.show(_axes(go.Figure(), "All-reduce measured on CPU ranks: no rows yet"))
        elif measured:
            self.verdict.value = measured_crossover_text(self.rows)
            self.pane.show(measured_figure(self.rows, self.world_size))
        else:
            n, alpha, bandwidth = self.num_ranks.value, self.alpha_us.value * 1e-6, self.bandwidth.value * 1e9
            self.verdict.value = model_crossover_text(n, alpha, bandwidth)
            self.pane.show(model_figure(n, alpha, bandwidth))
