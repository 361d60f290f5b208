"""One-shot, two-shot and ring all-reduce against message size: the alpha-beta model of
``course_lib.perf.tp_all_reduce`` with sliders, or rows measured by
``course_lib.collectives.symmetric.benchmark``, in one plotly pane redrawn in place.

Model mode marks where two-shot overtakes one-shot (K* = alpha B N / ((N-1)(N-2)), never on
N = 2) and where one-shot stops beating the ring, and says what vLLM runs on H100s
(``course_lib.perf.vllm_all_reduce``); measured mode reads the rows' crossovers
(``read_crossover``), reporting one only where the rows show it beyond noise.
"""

from __future__ import annotations

import json

import ipywidgets as w
import numpy as np
import plotly.graph_objects as go
from IPython.display import display

from course_lib.collectives.symmetric import crossovers
from course_lib.paths import RESULTS_DIR
from course_lib.perf.comm import LINKS
from course_lib.perf import vllm_all_reduce
from course_lib.perf.tp_all_reduce import (
    DEFAULT_ALPHA_S,
    DEFAULT_BANDWIDTH,
    TP_ALGORITHMS,
    all_reduce_time,
    alpha_for_crossover,
    one_shot_ring_crossover_bytes,
    two_shot_crossover_bytes,
)
from course_lib.perf.units import KiB, format_bytes, format_number
from course_lib.widgets.crossover import log_options
from course_lib.widgets.figure_pane import one_at_a_time
from course_lib.widgets.log_ticks import log_tick_values
from course_lib.widgets.plotly_pane import PlotlyPane
from course_lib.widgets.selection_readout import with_readout

SIZES = np.logspace(10, 26, 129, base=2)  # 1 KiB .. 64 MiB
TICKS = [KiB * 4**k for k in range(9)]
RANK_OPTIONS = (2, 3, 4, 8, 16)
COLOURS = {"one-shot": "#1f77b4", "two-shot": "#ff7f0e", "ring": "#2ca02c"}
DASHES = {"one-shot": "solid", "two-shot": "dash", "ring": "solid"}  # at N = 2 two-shot lies on the ring
DRAWN = ("one-shot", "ring", "two-shot")
"""Drawing order: two-shot last, so that its dashes show on top of the ring where they coincide."""
NOISE = 0.1
"""A measured crossover counts only if, below it, the slower algorithm was ahead by more than this
share at some size: differences smaller than that come and go between runs on a shared CPU."""
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
    """Log axes, the x ticks at the sizes of ``TICKS``, the y ticks at ``log_tick_values`` of the
    traces' times, each written in full ("1,000", "20"): no bare "2" or "5" minor labels."""
    figure.update_xaxes(type="log", title_text="message size K (bytes, log scale)", tickvals=TICKS,
                        ticktext=[format_bytes(t) for t in TICKS])
    times = [y for trace in figure.data for y in (trace.y or ()) if y and y > 0]
    ticks = log_tick_values(min(times), max(times)) if times else []
    figure.update_yaxes(type="log", title_text="all-reduce time (µs, log scale)", tickvals=ticks,
                        ticktext=[format_number(t) for t in ticks])
    figure.update_layout(title=title, height=460, legend={"orientation": "h", "y": -0.22}, margin={"t": 80, "b": 120})
    return figure


def _vertical(figure: go.Figure, x: float, low: float, high: float, colour: str) -> None:
    """A dotted vertical line as a trace (shapes on log axes want log10 coordinates; traces do not)."""
    figure.add_trace(go.Scatter(x=[x, x], y=[low, high], mode="lines", showlegend=False, hoverinfo="skip",
                                line={"color": colour, "dash": "dot", "width": 1}))


def vllm_text(num_ranks: int, bandwidth: float) -> str:
    """What vLLM runs on ``num_ranks`` H100s at each size (``vllm_all_reduce.describe``), and the
    alpha at which this model, at ``bandwidth``, would leave one-shot where vLLM does."""
    gpus = vllm_all_reduce.GPU_NAMES[vllm_all_reduce.HOPPER]
    routes = vllm_all_reduce.describe(num_ranks)
    limit = vllm_all_reduce.one_shot_below(num_ranks)
    if limit is None:
        return (f"vLLM on {num_ranks} {gpus}: {routes} (its own all-reduces run on "
                f"{', '.join(map(str, vllm_all_reduce.CUSTOM_SIZES[:-1]))} or {vllm_all_reduce.CUSTOM_SIZES[-1]} GPUs).")
    text = f"vLLM on {num_ranks} {gpus}, by measured thresholds: {routes}."
    if num_ranks < 3:
        return text
    alpha = alpha_for_crossover(num_ranks, limit, bandwidth)
    return (f"{text} This model leaves one-shot at {format_bytes(limit)}, where vLLM does, with "
            f"α = {alpha * 1e6:.2f} µs at {bandwidth / 1e9:g} GB/s.")


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
    for name in DRAWN:
        label = name
        if name == "two-shot" and times["two-shot"] == times["ring"]:
            label = f"two-shot (on the ring's line: at N = {num_ranks} both take 2 rounds and move K)"
        figure.add_trace(go.Scatter(x=SIZES, y=times[name], mode="lines", name=label,
                                    legendrank=list(TP_ALGORITHMS).index(name),
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


def read_crossover(rows: list[dict], faster: str, slower: str) -> tuple[str, int | None]:
    """Where column ``faster`` (e.g. "two_shot") overtakes ``slower`` in ``rows``, read as
    ``symmetric.crossovers`` does (faster at that size and every larger one) and then checked
    against noise: ("from", size) when, below that size, ``slower`` was ahead by more than
    ``NOISE`` somewhere; ("everywhere", None) when ``faster`` wins or ties within noise at every
    size, so the rows show no crossover; ("never", None) when it is not faster at the largest."""
    at = crossovers(rows)[f"{faster}_over_{slower}"]
    if at is None:
        return "never", None
    below = [row for row in rows if row["bytes"] < at]
    if any(row[f"{faster}_s"] > (1 + NOISE) * row[f"{slower}_s"] for row in below):
        return "from", at
    return "everywhere", None


def measured_summary(rows: list[dict]) -> list[str]:
    """One short sentence per pairing that ``symmetric.crossovers`` finds in ``rows``, each read
    by ``read_crossover``."""
    smallest, largest = format_bytes(rows[0]["bytes"]), format_bytes(rows[-1]["bytes"])
    lines = []
    for key in crossovers(rows):
        faster, slower = key.split("_over_")
        kind, at = read_crossover(rows, faster, slower)
        first, second = SHORT_NAMES.get(faster, faster), SHORT_NAMES.get(slower, slower)
        if kind == "from":
            lines.append(f"{first} beats {second} from {format_bytes(at)} on")
        elif kind == "never":
            lines.append(f"{first} is not faster than {second} at {largest}, the largest size: no crossover")
        elif all(row[f"{faster}_s"] < (1 - NOISE) * row[f"{slower}_s"] for row in rows):
            lines.append(f"{first} beats {second} at every size, {smallest} to {largest}")
        else:
            lines.append(f"{first} is ahead of {second} or within {NOISE:.0%} at every size: no crossover")
    return lines


def measured_crossover_text(rows: list[dict]) -> str:
    """The verdict above the measured figure: the two-shot/one-shot reading in bold, then
    ``measured_summary``."""
    kind, at = read_crossover(rows, "two_shot", "one_shot")
    if kind == "from":
        head = f"Measured: two-shot overtakes one-shot at {format_bytes(at)}"
    elif kind == "never":
        head = "Measured: two-shot never overtakes one-shot in these rows"
    else:
        head = "Measured: no crossover; two-shot is ahead of one-shot, or within noise, at every size"
    return f"<b>{head}</b>. In these rows: {'; '.join(measured_summary(rows))}."


def measured_figure(rows: list[dict], world_size: int | None = None) -> go.Figure:
    """Rows of ``symmetric.benchmark`` (``bytes`` and the seconds of each column of ``MEASURED``
    they hold) as markers joined by lines, in µs, and a star on the two-shot point where
    ``read_crossover`` finds two-shot overtaking one-shot (none when the rows show no crossover)."""
    figure = go.Figure()
    sizes = [row["bytes"] for row in rows]
    columns = [column for column in MEASURED if column in rows[0]]
    for column in columns:
        label, colour, dash = MEASURED[column]
        figure.add_trace(go.Scatter(x=sizes, y=[row[column] * 1e6 for row in rows], mode="lines+markers", name=label,
                                    line={"color": colour, "dash": dash},
                                    hovertemplate=f"{label}: %{{x:.3s}}B in %{{y:.3g}} µs<extra></extra>"))
    kind, star = read_crossover(rows, "two_shot", "one_shot")
    if kind == "from":
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
    hidden (``slider_rows``), since they do not describe what was measured, and they come back with
    the model's settings as they were. It opens on the rows when given (the N slider at their
    ``world_size``), and hides the toggle while there are none."""

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
        self.slider_rows = [with_readout(slider) for slider in (self.num_ranks, self.alpha_us, self.bandwidth)]
        super().__init__([self.mode, *self.slider_rows, self.verdict, self.pane])
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
        for row in self.slider_rows:
            row.layout.display = "none" if measured else None
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


def saved_gpu_runs() -> list[tuple[str, dict]]:
    """(file name, result) of every ``./course gpu-report`` in ``RESULTS_DIR`` whose tensor-parallel
    part passed: the symmetric-memory all-reduces measured on GPUs (``rows``, ``world_size``)."""
    runs = []
    for path in sorted(RESULTS_DIR.glob("gpu_report_*.json")):
        part = json.loads(path.read_text(encoding="utf-8"))["parts"].get("tensor_parallel", {})
        if part.get("status") == "passed":
            runs.append((path.name, part["result"]))
    return runs


def show_saved_runs() -> None:
    """For each of ``saved_gpu_runs``, its ``measured_summary`` and an ``AllReduceCrossover`` of its
    rows; where none is saved, how to make one."""
    runs = saved_gpu_runs()
    if not runs:
        print("No GPU run saved yet: on a machine with 2 or more GPUs, `./course gpu-report` measures one-shot and "
              "two-shot all-reduce on NVLink and saves it in benchmarks/results/, and this cell then draws it.")
    for name, result in runs:
        print(f"{name}, {result['world_size']} GPUs:")
        for line in measured_summary(result["rows"]):
            print(f"  {line}")
        display(AllReduceCrossover(result["rows"], world_size=result["world_size"]))
