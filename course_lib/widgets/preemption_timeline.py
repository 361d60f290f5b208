"""Preemption over time: what a thrashing server's metrics look like, from simulated runs.

For each run (a ``SimulationReport`` of ``SimulatedEngine``) two curves against the simulated
clock: the preemptions so far (what vLLM V1 exports as ``vllm:num_preemptions_total``) and the
share of KV blocks in use after each step. A plotly figure, so hovering a curve reads the time,
the count and the usage off it.
"""

from __future__ import annotations

import itertools

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from course_lib.engine.simulated import SimulationReport

COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def cumulative_preemptions(report: SimulationReport) -> list[int]:
    """The number of preemptions up to and including each step of ``report``."""
    return list(itertools.accumulate(step.preempted for step in report.steps))


def kv_usage_percent(report: SimulationReport) -> list[float]:
    """The share of KV blocks in use after each step, in percent."""
    return [100 * step.kv_usage for step in report.steps]


def preemption_timeline_figure(runs: dict[str, SimulationReport], title: str | None = None) -> go.Figure:
    """Two panels side by side, one curve per run in each (same colour, one legend entry):
    preemptions so far (left) and KV blocks in use, % (right), against simulated seconds."""
    figure = make_subplots(rows=1, cols=2, horizontal_spacing=0.09, subplot_titles=(
        "Preemptions so far (vLLM V1: vllm:num_preemptions_total)", "KV cache in use"))
    for (name, report), colour in zip(runs.items(), itertools.cycle(COLOURS)):
        times = [step.time_s for step in report.steps]
        figure.add_trace(go.Scatter(
            x=times, y=cumulative_preemptions(report), mode="lines", name=name, legendgroup=name,
            line={"color": colour, "shape": "hv"},
            hovertemplate=f"{name}<br>t = %{{x:.2f}} s: %{{y:,}} preemptions so far<extra></extra>"), row=1, col=1)
        figure.add_trace(go.Scatter(
            x=times, y=kv_usage_percent(report), mode="lines", name=name, legendgroup=name, showlegend=False,
            line={"color": colour, "width": 1},
            hovertemplate=f"{name}<br>t = %{{x:.2f}} s: %{{y:.1f}}% of KV blocks in use<extra></extra>"), row=1, col=2)
    figure.update_xaxes(title_text="simulated time (s)")
    figure.update_yaxes(title_text="preemptions (count)", rangemode="tozero", row=1, col=1)
    figure.update_yaxes(title_text="KV blocks in use (%)", range=[0, 105], row=1, col=2)
    figure.update_layout(title=title or "Preemptions and KV cache usage over a simulated run", height=440,
                         legend={"orientation": "h", "y": -0.22}, margin={"t": 80, "b": 110})
    return figure
