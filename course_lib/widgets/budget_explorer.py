"""The token budget as a latency dial: ``max_num_batched_tokens`` and
``long_prefill_token_threshold`` on a workload in simulated mode.

Each setting is simulated once and remembered, so returning to a slider position is instant.
"""

from __future__ import annotations

import time

import ipywidgets as w
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from course_lib.engine.simulated import SimulationReport, simulate_budget
from course_lib.perf.hardware import GPU
from course_lib.perf.models import ModelSpec
from course_lib.perf.workloads import WorkloadRequest
from course_lib.widgets.figure_pane import FigurePane, new_figure, one_at_a_time
from course_lib.widgets.selection_readout import with_readout

BUDGETS = [2**k for k in range(8, 15)]  # 256 .. 16384
THRESHOLDS = [("off", 0)] + [(str(2**k), 2**k) for k in range(8, 14)]  # 256 .. 8192


WORST_GAP = "chat worst gap during document prefill"
"""The key of the figure that must meet the ITL target: see ``worst_gap_during_prefill``."""


def document_prefill(report: SimulationReport) -> tuple[str, float, float]:
    """The document's request id and its prefill window: from its arrival to its first token (s).
    A step that ends inside the window and schedules the document computes a chunk of its prompt."""
    (request_id, times), = ((i, t) for i, t in report.requests.items() if t.tag == "document")
    return request_id, times.arrival_s, times.token_times_s[0]


def worst_gap_during_prefill(report: SimulationReport, tag: str = "chat") -> float:
    """The longest wait (s) between two tokens of a ``tag`` request that ends while the document's
    prompt is being read: the stall its chunks cause. Gaps at other times (the chat users' own
    prompts at start-up, say) are not counted; 0 when no gap ends in the window."""
    _, start, end = document_prefill(report)
    return max((later - earlier for times in report.requests.values() if times.tag == tag
                for earlier, later in zip(times.token_times_s, times.token_times_s[1:]) if start < later <= end),
               default=0.0)


def latency_summary(report: SimulationReport) -> dict[str, float]:
    """The figures the lesson compares, in milliseconds: chat users' inter-token gaps (over the
    whole run, and the worst while the document is prefilled), the document's time to first token,
    and follow-up turns' time to first token."""
    chat, follow_up = report.latency("chat"), report.latency("follow-up")
    return {"chat ITL P50": chat["itl_p50_ms"], "chat ITL P99": chat["itl_p99_ms"],
            WORST_GAP: 1000 * worst_gap_during_prefill(report),
            "document TTFT": 1000 * report.ttft["document"][0],
            "follow-up TTFT P50": follow_up["ttft_p50_ms"], "follow-up TTFT P99": follow_up["ttft_p99_ms"]}


def plot_step_times(ax, report: SimulationReport, title: str) -> None:
    """Each step's duration against the simulated clock: red for steps that read a chunk of the
    document's prompt, orange for its decode steps, blue for steps without it."""
    document_id, _, first_token = document_prefill(report)
    kinds = {"a chunk of the document's prompt": ("#d62728", lambda s: document_id in s.scheduled and
                                                 s.time_s <= first_token),
             "the document decoding": ("#ff7f0e", lambda s: document_id in s.scheduled and s.time_s > first_token),
             "no document": ("#1f77b4", lambda s: document_id not in s.scheduled)}
    for label, (colour, holds) in kinds.items():
        steps = [s for s in report.steps if holds(s)]
        ax.scatter([s.time_s for s in steps], [1000 * s.duration_s for s in steps], s=6, c=colour,
                   label=f"steps with {label}")
    ax.set(xlabel="simulated time (s)", ylabel="step duration (ms)", yscale="log", title=title)
    ax.legend(loc="upper right", fontsize=8, markerscale=2)


def plot_budget_sweep(summaries: dict[int, dict[str, float]], slo_ms: float) -> go.Figure:
    """Chat gaps (ms, left) and the document's TTFT (s, right) against the budget, with the ITL
    target drawn; hovering a point reads its value. Both x axes are log, ticked at each budget."""
    budgets = sorted(summaries)
    figure = make_subplots(rows=1, cols=2, horizontal_spacing=0.1, subplot_titles=(
        "Chat users while a 16k-token document arrives", "What the document pays for smaller steps"))
    for key, colour, dash, symbol in (("chat ITL P99", "#1f77b4", "solid", "circle"),
                                      (WORST_GAP, "#ff7f0e", "dash", "square")):
        figure.add_trace(go.Scatter(
            x=budgets, y=[summaries[b][key] for b in budgets], mode="lines+markers", name=key,
            line={"color": colour, "dash": dash}, marker={"symbol": symbol},
            hovertemplate=f"budget %{{x}} tokens: {key} %{{y:,.1f}} ms<extra></extra>"), row=1, col=1)
    figure.add_trace(go.Scatter(
        x=[budgets[0], budgets[-1]], y=[slo_ms, slo_ms], mode="lines", name=f"target {slo_ms:g} ms",
        line={"color": "#2ca02c", "width": 1}, hovertemplate=f"ITL target: {slo_ms:g} ms<extra></extra>"),
        row=1, col=1)
    figure.add_trace(go.Scatter(
        x=budgets, y=[summaries[b]["document TTFT"] / 1000 for b in budgets], mode="lines+markers",
        name="document TTFT", line={"color": "#d62728"},
        hovertemplate="budget %{x} tokens: document TTFT %{y:.3f} s<extra></extra>"), row=1, col=2)
    figure.update_xaxes(type="log", title_text="max_num_batched_tokens (tokens, log scale)", tickvals=budgets,
                        ticktext=[str(b) for b in budgets], tickangle=-45)
    figure.update_yaxes(type="log", title_text="inter-token latency (ms, log scale)", row=1, col=1,
                        tickvals=[m * 10**k for k in range(-1, 5) for m in (1, 2, 5)])  # 1-2-5 steps
    figure.update_yaxes(title_text="document TTFT (s)", rangemode="tozero", row=1, col=2)
    figure.update_layout(title="The token budget: chat users' gaps against the document's time to first token",
                         height=440, legend={"orientation": "h", "y": -0.3}, margin={"t": 80, "b": 130})
    return figure


class TokenBudgetExplorer(w.VBox):
    """Sliders for the budget and the long-prefill cap; the latency table and step times update."""

    def __init__(self, model: ModelSpec, gpu: GPU, workload: list[WorkloadRequest], budget: int = 8192) -> None:
        self.model, self.gpu, self.workload = model, gpu, workload
        self.reports: dict[tuple[int, int], SimulationReport] = {}
        self.budget = w.SelectionSlider(description="max_num_batched_tokens", options=BUDGETS, value=budget,
                                        continuous_update=False, style={"description_width": "initial"},
                                        layout=w.Layout(width="460px"))
        self.threshold = w.SelectionSlider(description="long_prefill_token_threshold", options=THRESHOLDS, value=0,
                                           continuous_update=False, style={"description_width": "initial"},
                                           layout=w.Layout(width="460px"))
        self.table, self.figure = w.HTML(), FigurePane()
        for control in (self.budget, self.threshold):
            control.observe(lambda _: self.refresh(), "value")
        super().__init__([with_readout(self.budget), with_readout(self.threshold), self.table, self.figure])
        self.refresh()

    def report(self) -> SimulationReport:
        key = (self.budget.value, self.threshold.value)
        if key not in self.reports:
            self.reports[key] = simulate_budget(self.model, self.gpu, self.workload, *key)
        return self.reports[key]

    @one_at_a_time
    def refresh(self) -> float:
        """Redraw for the current sliders; returns how long the update took (s)."""
        started = time.perf_counter()
        report = self.report()
        rows = "".join(f"<tr><td>{name}</td><td style='text-align:right'>{value:,.1f} ms</td></tr>"
                       for name, value in latency_summary(report).items())
        cap = self.threshold.value or "off"

        def draw():
            fig = new_figure(9, 2.8)
            plot_step_times(fig.subplots(), report, f"{self.model.name} on {self.gpu.name}: "
                            f"budget {self.budget.value}, long-prefill cap {cap}")
            fig.tight_layout()
            return fig

        self.figure.redraw(draw)
        elapsed = time.perf_counter() - started
        self.table.value = (f"<table>{rows}</table><small>{report.preemptions} preemptions, "
                            f"{report.tokens_per_s:,.0f} output tokens/s; updated in {1000 * elapsed:.0f} ms</small>")
        return elapsed
