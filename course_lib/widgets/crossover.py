"""Ring against trees in the alpha-beta model: time against message size, with sliders."""

from __future__ import annotations

import ipywidgets as w
import matplotlib.pyplot as plt
import numpy as np

from course_lib.perf.comm import ALGORITHMS, BINARY_TREE, LINKS, RING, crossover_bytes
from course_lib.perf.units import format_bytes
from course_lib.widgets.figure_pane import FigurePane

SIZES = np.logspace(10, 32, 200, base=2)  # 1 KiB .. 4 GiB


def plot_crossover(ax, num_ranks: int, alpha_s: float, beta: float, message_bytes: float | None = None) -> None:
    """All-reduce time against message size for each algorithm; the ring/tree crossover dashed."""
    for cost in ALGORITHMS.values():
        ax.plot(SIZES, [cost.time(num_ranks, size, alpha_s, beta) * 1e6 for size in SIZES], label=cost.name)
    crossing = crossover_bytes(BINARY_TREE, RING, num_ranks, alpha_s, beta)
    if crossing and SIZES[0] <= crossing <= SIZES[-1]:
        ax.axvline(crossing, color="grey", ls="--", lw=1, label=f"ring = binary tree at {format_bytes(crossing)}")
    if message_bytes:
        ax.axvline(message_bytes, color="#d62728", lw=1.5, label=f"your message: {format_bytes(message_bytes)}")
    ax.set(xscale="log", yscale="log", xlabel="message size (bytes)", ylabel="all-reduce time (µs)",
           title=f"All-reduce on {num_ranks} ranks: α = {alpha_s * 1e6:g} µs, {1 / beta / 1e9:g} GB/s per link")
    ax.legend(fontsize=8)


class CrossoverExplorer(w.VBox):
    """Sliders for N, alpha, bandwidth and the message size; a link preset fills alpha and bandwidth."""

    def __init__(self, num_ranks: int = 512, message_bytes: int = 4096,
                 link: str = "InfiniBand NDR 400 Gb/s (across nodes)") -> None:
        style, layout = {"description_width": "10em"}, w.Layout(width="520px")
        self.link = w.Dropdown(options=list(LINKS), value=link, description="link preset", style=style, layout=layout)
        self.num_ranks = w.SelectionSlider(options=[2**k for k in range(1, 13)], value=num_ranks, description="ranks N",
                                           style=style, layout=layout)
        self.alpha_us = w.FloatLogSlider(value=LINKS[link].alpha_s * 1e6, base=10, min=-1, max=2, step=0.05,
                                         description="α per hop (µs)", style=style, layout=layout)
        self.bandwidth = w.FloatLogSlider(value=LINKS[link].bandwidth / 1e9, base=10, min=0, max=3, step=0.05,
                                          description="bandwidth (GB/s)", style=style, layout=layout)
        self.message = w.SelectionSlider(options=[(format_bytes(2**k), 2**k) for k in range(10, 33)],
                                         value=message_bytes, description="message", style=style, layout=layout)
        self.verdict, self.figure = w.HTML(), FigurePane()
        self._loading = False
        self.link.observe(lambda _: self.load_link(), "value")
        for control in (self.num_ranks, self.alpha_us, self.bandwidth, self.message):
            control.observe(lambda _: self.refresh(), "value")
        super().__init__([self.link, self.num_ranks, self.alpha_us, self.bandwidth, self.message, self.verdict,
                          self.figure])
        self.refresh()

    def load_link(self) -> None:
        link = LINKS[self.link.value]
        self._loading = True  # one redraw for both sliders, not one per slider
        try:
            self.alpha_us.value, self.bandwidth.value = link.alpha_s * 1e6, link.bandwidth / 1e9
        finally:
            self._loading = False
        self.refresh()

    def refresh(self) -> None:
        if self._loading:
            return
        n, alpha, beta = self.num_ranks.value, self.alpha_us.value * 1e-6, 1 / (self.bandwidth.value * 1e9)
        times = {cost.name: cost.time(n, self.message.value, alpha, beta) for cost in ALGORITHMS.values()}
        best = min(times, key=times.get)
        listing = ", ".join(f"{name} {t * 1e6:,.1f} µs" for name, t in times.items())
        self.verdict.value = f"<b>{format_bytes(self.message.value)} on {n} ranks:</b> {listing}. Fastest: <b>{best}</b>."
        fig, ax = plt.subplots(figsize=(8, 3.8))
        plot_crossover(ax, n, alpha, beta, self.message.value)
        fig.tight_layout()
        self.figure.show(fig)
