"""Ring against trees in the alpha-beta model: time against message size, with sliders."""

from __future__ import annotations

import math

import ipywidgets as w
import numpy as np
import plotly.graph_objects as go

from course_lib.perf.comm import (
    ALGORITHMS,
    DOUBLE_BINARY_TREE,
    LINKS,
    RING,
    TREE_CHUNK_BYTES,
    Link,
    crossover_bytes,
)
from course_lib.perf.interconnect import ACROSS_NODES, HOST, IN_NODE
from course_lib.perf.units import KiB, format_bytes, format_duration
from course_lib.widgets.figure_pane import one_at_a_time
from course_lib.widgets.log_ticks import bytes_ticks, time_ticks
from course_lib.widgets.plotly_pane import PlotlyPane
from course_lib.widgets.selection_readout import with_readout

SIZES = np.logspace(10, 32, 200, base=2)  # 1 KiB .. 4 GiB
COLOURS = {"ring": "#1f77b4", "binary tree": "#ff7f0e", "double binary tree": "#2ca02c"}  # the message: red
CHUNKS = [("whole message (the lesson's table)", 0),
          *((f"{format_bytes(chunk, whole=True)} per tree{' (typical)' * (chunk == TREE_CHUNK_BYTES)}", chunk)
            for chunk in (32 * KiB, TREE_CHUNK_BYTES, 512 * KiB))]
CUSTOM = "custom (the α and bandwidth sliders)"
NODE_GPUS = 8  # GPUs that share one NVLink (or PCIe) domain in an H100 node
PRESET_RANKS = {IN_NODE: NODE_GPUS, HOST: NODE_GPUS, ACROSS_NODES: 512}
"""The N a link preset sets: the GPUs of one node for a link inside it, 512 (64 nodes) across nodes."""


def _alpha_us(link: Link) -> float:
    return link.alpha_s * 1e6


def _gb_per_s(link: Link) -> float:
    return link.bandwidth / 1e9


def log_options(low: float, high: float, presets: list[float]) -> list[tuple[str, float]]:
    """Slider stops from ``low`` to ``high``: ten a decade (two significant digits) plus every
    preset value exactly, so choosing a preset never rounds it; grid stops within 10% of a
    preset give way to it (3.2 to 3). Sorted (label, value) pairs."""
    decades = range(round(10 * math.log10(low)), round(10 * math.log10(high)) + 1)
    grid = {float(f"{10 ** (k / 10):.2g}") for k in decades}
    grid = {g for g in grid if all(abs(g - p) > 0.1 * p for p in presets)}
    return [(f"{value:g}", value) for value in sorted(grid | set(presets))]


def _vertical(figure: go.Figure, x: float, low: float, high: float, name: str, colour: str, dash: str) -> None:
    """A vertical line as a trace with a legend entry (shapes on log axes want log10 coordinates)."""
    figure.add_trace(go.Scatter(x=[x, x], y=[low, high], mode="lines", name=name,
                                line={"color": colour, "dash": dash, "width": 1.5},
                                hovertemplate=f"{name}<extra></extra>"))


def crossover_figure(num_ranks: int, alpha_s: float, beta: float, message_bytes: float | None = None,
                     chunk_bytes: float | None = TREE_CHUNK_BYTES, link_name: str | None = None) -> go.Figure:
    """All-reduce time against message size for each algorithm (ticks in s, ms or µs), and dashed,
    where the fastest becomes the ring: the double binary tree is never slower than the single tree (fewer
    bytes, fewer chunks), so the verdict switches once, where the ring overtakes it. Hovering
    any curve gives the message size and every algorithm's time there."""
    times = {cost.name: [cost.time(num_ranks, size, alpha_s, beta, chunk_bytes) for size in SIZES]
             for cost in ALGORITHMS.values()}
    names = list(times)
    customdata = [[format_bytes(size)] + [format_duration(times[name][i]) for name in names]
                  for i, size in enumerate(SIZES)]
    listing = "<br>".join(f"{name}: %{{customdata[{k + 1}]}}" for k, name in enumerate(names))
    figure = go.Figure()
    for name, values in times.items():
        figure.add_trace(go.Scatter(x=SIZES, y=values, mode="lines", name=name, customdata=customdata,
                                    line={"color": COLOURS.get(name), "width": 2.5},
                                    hovertemplate=f"<b>{name}</b>, message %{{customdata[0]}}<br>{listing}"
                                                  "<extra></extra>"))
    low, high = min(map(min, times.values())), max(map(max, times.values()))
    crossing = crossover_bytes(DOUBLE_BINARY_TREE, RING, num_ranks, alpha_s, beta, chunk_bytes)
    if crossing and SIZES[0] <= crossing <= SIZES[-1]:
        _vertical(figure, crossing, low, high, f"ring overtakes double binary tree: {format_bytes(crossing)}",
                  "grey", "dash")
    if message_bytes:
        _vertical(figure, message_bytes, low, high, f"your message: {format_bytes(message_bytes, whole=True)}",
                  "#d62728", "solid")
    figure.update_xaxes(type="log", title_text="message size (bytes, log scale)", **bytes_ticks(SIZES[0], SIZES[-1]))
    figure.update_yaxes(type="log", title_text="all-reduce time (log scale)", **time_ticks(low, high))
    figure.update_layout(title=f"All-reduce on {num_ranks} ranks{f' over {link_name}' if link_name else ''}: "
                               f"α = {alpha_s * 1e6:g} µs, {1 / beta / 1e9:g} GB/s per link", height=540,
                         legend={"orientation": "h", "y": -0.22}, margin={"t": 60, "b": 120})
    return figure


def preset_of(alpha_us: float, bandwidth_gb_s: float) -> str:
    """The link preset with exactly this α (µs) and bandwidth (GB/s), else ``CUSTOM``."""
    return next((name for name, link in LINKS.items()
                 if (_alpha_us(link), _gb_per_s(link)) == (alpha_us, bandwidth_gb_s)), CUSTOM)


def scope_note(link_name: str, num_ranks: int) -> str:
    """What the setting models when N is more GPUs than one node's link joins; '' otherwise."""
    link = LINKS.get(link_name)
    if link is None or link.scope == ACROSS_NODES or num_ranks <= NODE_GPUS:
        return ""
    return (f"<p style='color:#9a6700'>{link.name} joins the {NODE_GPUS} GPUs of one node: {num_ranks} ranks on it "
            "model an imagined node where every GPU shares that link. More ranks means crossing nodes, "
            "over InfiniBand.</p>")


class CrossoverExplorer(w.VBox):
    """Sliders for N, alpha, bandwidth, the message size and the trees' chunk. A link preset sets
    alpha and bandwidth exactly (their sliders hold every preset value) and the N that it serves
    (``PRESET_RANKS``); once the α and bandwidth sliders leave every preset, the menu says
    ``CUSTOM``. One redraw per change, serialised by ``one_at_a_time``, so the picture always
    matches the sliders."""

    def __init__(self, num_ranks: int = 512, message_bytes: int = 4096,
                 link: str = "InfiniBand NDR 400 Gb/s (across nodes)") -> None:
        style, layout = {"description_width": "10em"}, w.Layout(width="520px")
        self.link = w.Dropdown(options=[*LINKS, CUSTOM], value=link, description="link preset", style=style,
                               layout=layout)
        self.num_ranks = w.SelectionSlider(options=[2**k for k in range(1, 13)], value=num_ranks, description="ranks N",
                                           style=style, layout=layout)
        self.alpha_us = w.SelectionSlider(options=log_options(0.1, 100, [_alpha_us(x) for x in LINKS.values()]),
                                          value=_alpha_us(LINKS[link]), description="α per hop (µs)",
                                          style=style, layout=layout)
        self.bandwidth = w.SelectionSlider(options=log_options(1, 1000, [_gb_per_s(x) for x in LINKS.values()]),
                                           value=_gb_per_s(LINKS[link]), description="bandwidth (GB/s)",
                                           style=style, layout=layout)
        self.message = w.SelectionSlider(options=[(format_bytes(2**k, whole=True), 2**k) for k in range(10, 33)],
                                         value=message_bytes, description="message", style=style, layout=layout)
        self.chunk = w.Dropdown(options=CHUNKS, value=TREE_CHUNK_BYTES, description="tree pipeline chunk",
                                style=style, layout=layout)
        self.verdict, self.model, self.note, self.pane = w.HTML(), w.HTML(), w.HTML(), PlotlyPane()
        self._loading = False
        self.link.observe(lambda _: self.load_link(), "value")
        for control in (self.alpha_us, self.bandwidth):
            control.observe(lambda _: self.name_link(), "value")
        for control in (self.num_ranks, self.message, self.chunk):
            control.observe(lambda _: self.refresh(), "value")
        super().__init__([self.link, *map(with_readout, (self.num_ranks, self.alpha_us, self.bandwidth, self.message)),
                          self.chunk, self.note, self.verdict, self.pane, self.model])
        self.refresh()

    @one_at_a_time  # a redraw from another thread waits until every slider is set
    def load_link(self) -> None:
        """A preset chosen: its α, bandwidth and N, in one redraw. ``CUSTOM`` chosen, or named by
        ``name_link``: the sliders stay as they are."""
        if self._loading or self.link.value == CUSTOM:
            return self.refresh()
        link = LINKS[self.link.value]
        self._loading = True  # one redraw for all three sliders, not one per slider
        try:
            self.alpha_us.value, self.bandwidth.value = _alpha_us(link), _gb_per_s(link)
            self.num_ranks.value = PRESET_RANKS[link.scope]
        finally:
            self._loading = False
        self.refresh()

    @one_at_a_time
    def name_link(self) -> None:
        """α or bandwidth moved: the menu names the preset they now match, or ``CUSTOM``."""
        if not self._loading:
            name = preset_of(self.alpha_us.value, self.bandwidth.value)
            if name != self.link.value:
                self._loading = True  # naming the link does not load its N
                try:
                    self.link.value = name
                finally:
                    self._loading = False
        self.refresh()

    @one_at_a_time
    def refresh(self) -> None:
        if not self._loading:
            self.pane.show(self.draw())

    def draw(self):
        """Update the verdict, the scope note and the model note from the sliders; return the figure."""
        n, alpha, beta = self.num_ranks.value, self.alpha_us.value * 1e-6, 1 / (self.bandwidth.value * 1e9)
        chunk = self.chunk.value or None
        times = {cost.name: cost.time(n, self.message.value, alpha, beta, chunk) for cost in ALGORITHMS.values()}
        best = min(times, key=times.get)
        listing = ", ".join(f"{name} {format_duration(t)}" for name, t in times.items())
        self.verdict.value = (f"<b>{format_bytes(self.message.value, whole=True)} on {n} ranks:</b> {listing}. "
                              f"Fastest: <b>{best}</b>.")
        self.note.value = scope_note(self.link.value, n)
        pipelining = ("each tree moves its half (all, for one tree) in chunks of "
                      f"{format_bytes(chunk, whole=True)}, and every chunk after the first is one more α on the "
                      "tree's pipeline (a simple model of what pipelining costs a tree)" if chunk else
                      "trees pipeline for free, so the double binary tree matches the ring's bandwidth "
                      "and wins at every size on many ranks, unlike NCCL")
        self.model.value = (
            f"<small>Model: α-β per hop, as in the lesson's table; {pipelining}. Left out: congestion, the "
            "NVLink-inside / network-between hierarchy, NCCL's protocols and its measured tuning, so read "
            "the crossovers as orders of magnitude.</small>")
        return crossover_figure(n, alpha, beta, self.message.value, chunk,
                                None if self.link.value == CUSTOM else self.link.value)
