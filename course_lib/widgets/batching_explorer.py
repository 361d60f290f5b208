"""Static against continuous batching as output lengths spread out, on the engine's own scheduler.

*Spread* is the coefficient of variation (standard deviation / mean) of the output lengths.
The lengths are log-normal with a fixed mean, built from one fixed draw of normal numbers
(``seed``), so changing the spread stretches the same requests rather than drawing new ones:
spread 0 gives every request exactly ``mean_output`` tokens, and every spread keeps the total
number of output tokens (up to rounding). Both policies serve identical requests in simulated
mode, whose scheduler and KV cache manager are the real engine's (its schedule equals the tiny
engine's step for step); only the clock is a roofline model.
"""

from __future__ import annotations

import itertools
import math
import random
import time
from typing import Callable

import ipywidgets as w
import plotly.graph_objects as go

from course_lib.engine.simulated import SimulatedEngine, SimulationReport
from course_lib.perf.hardware import GPU, get_gpu
from course_lib.perf.models import ModelSpec, get_model
from course_lib.perf.workloads import WorkloadRequest
from course_lib.widgets.figure_pane import FigurePane, new_figure, one_at_a_time, tight_layout_afresh
from course_lib.widgets.timeline import plot_slot_timelines

POLICIES = ("static", "continuous")
PROMPT_LEN = 16  # tokens per prompt: short, so decode dominates as in the lesson
BLOCK_SIZE = 16
SPREADS = [0.25 * k for k in range(9)]  # 0 .. 2: the sweep's spreads


def output_lengths(num_requests: int, mean_output: int, spread: float, seed: int = 0) -> list[int]:
    """``num_requests`` output lengths (at least 1 token each) whose mean is ``mean_output`` and whose
    coefficient of variation is ``spread`` before rounding to whole tokens; see the module docstring.
    Spreads reach only up to sqrt(num_requests - 1): one request holding every token."""
    if num_requests < 1 or mean_output < 1 or spread < 0 or (spread and spread >= math.sqrt(num_requests - 1)):
        raise ValueError(f"Need num_requests >= 1, mean_output >= 1 and 0 <= spread < sqrt(num_requests - 1) = "
                         f"{math.sqrt(num_requests - 1):.2f}; got {num_requests}, {mean_output}, {spread}.")
    rng = random.Random(seed)
    z = [rng.gauss(0.0, 1.0) for _ in range(num_requests)]
    sigma = lognormal_sigma(z, spread)
    raw = [math.exp(sigma * v) for v in z]
    return [max(1, round(mean_output * r * num_requests / sum(raw))) for r in raw]


def lognormal_sigma(z: list[float], spread: float) -> float:
    """The sigma at which ``exp(sigma * z)`` has coefficient of variation ``spread`` (bisection:
    the coefficient grows with sigma, from 0 at sigma 0)."""
    if spread == 0:
        return 0.0
    def cv(sigma: float) -> float:
        return coefficient_of_variation([math.exp(sigma * v) for v in z])
    low, high = 0.0, 1.0
    while cv(high) < spread:
        high *= 2
    for _ in range(50):
        low, high = ((low + high) / 2, high) if cv((low + high) / 2) < spread else (low, (low + high) / 2)
    return high


def coefficient_of_variation(values: list[float]) -> float:
    """Standard deviation / mean of ``values`` (population form), what the readout calls spread."""
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)) / mean


def spread_note(lengths: list[int], spread: float) -> str:
    """The spread the rounded lengths really have, and why when it is not the one asked for."""
    measured = f"{coefficient_of_variation(lengths):.2f}"
    if measured == f"{spread:.2f}":
        return f"measured spread {measured}"
    return (f"measured spread {measured}: rounding the lengths to whole tokens, at least 1 each, "
            f"moves it from {spread:.2f}")


def spread_workload(lengths: list[int], seed: int = 0) -> list[WorkloadRequest]:
    """One request per output length, all arriving at once, with distinct byte-range prompts
    (no shared prefix, so the prefix cache plays no part; the tiny model accepts them too)."""
    rng = random.Random(seed)
    return [WorkloadRequest(0.0, tuple(rng.randrange(32, 127) for _ in range(PROMPT_LEN)), n) for n in lengths]


def serve_both(lengths: list[int], num_slots: int, model: ModelSpec, gpu: GPU,
               seed: int = 0) -> dict[str, SimulationReport]:
    """The same requests under each policy, ``num_slots`` = ``max_num_seqs``. The KV cache holds
    every slot at full length (as the tiny engine's CPU default does), so nothing is preempted."""
    workload, max_model_len = spread_workload(lengths, seed), PROMPT_LEN + max(lengths)
    blocks = num_slots * -(-max_model_len // BLOCK_SIZE)
    return {policy: SimulatedEngine(model, gpu, max_num_seqs=num_slots, max_model_len=max_model_len,
                                    block_size=BLOCK_SIZE, num_gpu_blocks=blocks,
                                    scheduling_policy=policy).run(workload)
            for policy in POLICIES}


def throughput_ratio(reports: dict[str, SimulationReport]) -> float:
    """Continuous over static output tokens per simulated second."""
    return reports["continuous"].tokens_per_s / reports["static"].tokens_per_s


def sweep_spread(spreads: list[float] = SPREADS, slot_counts: tuple[int, ...] = (4, 8, 16), num_requests: int = 128,
                 mean_output: int = 64, draws: int = 4, model: ModelSpec | None = None, gpu: GPU | None = None,
                 on_step: Callable[[int], None] | None = None) -> dict[int, dict[float, float]]:
    """``ratios[num_slots][spread]``: continuous/static throughput, averaged over ``draws`` random
    draws of the requests (one draw's ratio depends on which groups its longest requests land in).
    ``on_step(i)`` is called after each (slot count, spread) pair, e.g. to move a progress bar."""
    model, gpu = model or get_model("Llama-3.1-8B"), gpu or get_gpu("H100-80GB")
    ratios: dict[int, dict[float, float]] = {}
    for done, (slots, spread) in enumerate(itertools.product(slot_counts, spreads)):
        runs = [serve_both(output_lengths(num_requests, mean_output, spread, seed), slots, model, gpu, seed)
                for seed in range(draws)]
        ratios.setdefault(slots, {})[spread] = sum(map(throughput_ratio, runs)) / draws
        if on_step:
            on_step(done)
    return ratios


def plot_spread_sweep(ratios: dict[int, dict[float, float]], num_requests: int, mean_output: int) -> go.Figure:
    """The throughput ratio against the spread, one line per slot count (hover to read values)."""
    fig = go.Figure()
    for slots, by_spread in ratios.items():
        fig.add_scatter(x=list(by_spread), y=list(by_spread.values()), mode="lines+markers",
                        name=f"{slots} slots",
                        hovertemplate=f"{slots} slots, spread %{{x:.2f}} (std / mean): continuous / static "
                                      "throughput %{y:.2f}x<extra></extra>")
    fig.add_hline(y=1, line_dash="dot", line_color="grey", annotation_text="1x: no gain")
    fig.update_layout(title=f"Continuous over static batching: {num_requests} requests, mean output {mean_output} "
                            "tokens", xaxis_title="spread of output lengths (standard deviation / mean)",
                      yaxis_title="throughput ratio (continuous / static, x)", height=380, margin=dict(t=50))
    return fig


class BatchingExplorer(w.VBox):
    """Sliders for slots, requests, mean output and spread; both slot timelines and a readout
    (steps, idle share, simulated throughput, the ratio) update when a slider is released.
    Each setting is served once and remembered, so returning to it is instant. One figure is
    kept and redrawn (under the drawing lock): its axes and ticks are made once, and far fewer
    objects are left for the garbage collector on each change."""

    def __init__(self, num_slots: int = 8, num_requests: int = 64, mean_output: int = 64, spread: float = 1.0,
                 model: ModelSpec | None = None, gpu: GPU | None = None) -> None:
        self.model, self.gpu = model or get_model("Llama-3.1-8B"), gpu or get_gpu("H100-80GB")
        self.runs: dict[tuple, dict[str, SimulationReport]] = {}
        options = dict(continuous_update=False, style={"description_width": "13em"}, layout=w.Layout(width="480px"))
        self.num_slots = w.IntSlider(num_slots, 1, 32, description="slots (max_num_seqs)", **options)
        self.num_requests = w.IntSlider(num_requests, 16, 128, 8, description="requests", **options)
        self.mean_output = w.IntSlider(mean_output, 8, 128, 8, description="mean output (tokens)", **options)
        self.spread = w.FloatSlider(spread, min=0, max=SPREADS[-1], step=0.25, description="spread (std / mean)",
                                    **options)
        self.readout, self.figure = w.HTML(), FigurePane()
        self.plot = new_figure(10, 5)
        self.plot.subplots(2, 1, sharex=True)
        for control in (self.num_slots, self.num_requests, self.mean_output, self.spread):
            control.observe(lambda _: self.refresh(), "value")
        super().__init__([self.num_slots, self.num_requests, self.mean_output, self.spread, self.readout, self.figure])
        self.refresh()

    def draw(self):
        """Both slot timelines on one step scale (the longer run sets it); sets ``self.idle``
        (policy -> share of slot-steps idle)."""
        slots, lengths, fig, axes = self.num_slots.value, self.lengths, self.plot, self.plot.axes
        for ax in axes:
            for artist in [*ax.images, *ax.patches, *ax.texts]:  # last drawing's timelines and end shading
                artist.remove()
        self.idle = plot_slot_timelines(axes, {policy: [s.scheduled for s in report.steps]
                                               for policy, report in self.reports.items()}, slots)
        fig.suptitle(f"{len(lengths)} requests on {slots} slot{'s' if slots > 1 else ''}, "
                     f"output lengths {min(lengths)}-{max(lengths)} tokens")
        tight_layout_afresh(fig)
        return fig

    @one_at_a_time
    def refresh(self) -> float:
        """Serve (or recall), redraw and rewrite the readout for the current sliders; returns the seconds it took."""
        started = time.perf_counter()
        key = (self.num_slots.value, self.num_requests.value, self.mean_output.value, self.spread.value)
        self.lengths = output_lengths(*key[1:])
        if key not in self.runs:
            self.runs[key] = serve_both(self.lengths, key[0], self.model, self.gpu)
        self.reports = self.runs[key]
        self.figure.redraw(self.draw)
        cell = "style='text-align:right; padding: 0 1em'"
        rows = "".join(f"<tr><td style='padding-right: 1em'>{policy}</td><td {cell}>{len(r.steps):,}</td>"
                       f"<td {cell}>{self.idle[policy]:.0%}</td><td {cell}>{r.tokens_per_s:,.0f}</td></tr>"
                       for policy, r in self.reports.items())
        header = "".join(f"<th {cell}>{name}</th>" for name in ("steps", "idle slot-steps", "output tokens/s"))
        elapsed = time.perf_counter() - started
        self.readout.value = (
            f"<table><tr><th style='text-align:left; padding-right: 1em'>policy</th>{header}</tr>{rows}"
            f"</table><b>continuous / static throughput: {throughput_ratio(self.reports):.2f}x</b><br>"
            f"<small>{spread_note(self.lengths, self.spread.value)}; the longest request needs "
            f"{max(self.lengths)} steps even alone, a floor for both policies; {self.model.name} on {self.gpu.name}, "
            f"simulated; updated in {elapsed:.2f} s</small>")
        return elapsed
