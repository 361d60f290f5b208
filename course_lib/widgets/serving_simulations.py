"""Module 04's simulations with knobs: colocated against disaggregated serving, and the request
rate where speculative decoding stops paying.

Both run simulated mode (the real scheduler on a roofline clock) on every change; the figures
and tables show only what ``engine.disaggregated`` and ``engine.speculation_sweep`` return.
"""

from __future__ import annotations

import ipywidgets as w
import plotly.graph_objects as go

from course_lib.engine.disaggregated import DisaggregationComparison, compare_disaggregation
from course_lib.engine.simulated_speculation import SimulatedSpeculation
from course_lib.engine.speculation_sweep import SweepPoint, crossover_qps, speculation_qps_sweep
from course_lib.perf.models import get_model
from course_lib.widgets.figure_pane import one_at_a_time
from course_lib.widgets.plotly_marks import mark_x
from course_lib.widgets.plotly_pane import PlotlyPane

_WIDE = dict(continuous_update=False, style={"description_width": "14em"}, layout=w.Layout(width="500px"))

ROWS = (("ttft_p50_ms", "TTFT P50 (ms)"), ("ttft_p99_ms", "TTFT P99 (ms)"), ("itl_p50_ms", "ITL P50 (ms)"),
        ("itl_p99_ms", "ITL P99 (ms)"), ("itl_p99.9_ms", "ITL P99.9 (ms)"), ("itl_max_ms", "worst ITL gap (ms)"),
        ("output_tokens_per_s", "tokens/s to finish"), ("gpu_utilization", "GPU busy share"))
"""The comparison's rows; "tokens/s to finish" is output tokens over the time this workload took, not capacity."""
QPS_VALUES = (1, 2, 4, 8, 16, 32, 64)
SWEEP_SETTING = "Llama-3.1-70B on 4 x H100 (TP=4)"  # speculation_qps_sweep's defaults


def comparison_table(comparison: DisaggregationComparison, tag: str | None = None) -> str:
    """The two layouts side by side as HTML, with each row's ratio (disaggregated / colocated)."""
    table = comparison.table(tag)
    cells = "".join(f"<tr><td>{label}</td><td>{table[key][0]:,.1f}</td><td>{table[key][1]:,.1f}</td>"
                    f"<td>{table[key][1] / table[key][0]:.2f}x</td></tr>" for key, label in ROWS if table[key][0])
    return (f"<table><tr><th></th><th>{comparison.colocated.layout}</th><th>{comparison.disaggregated.layout}</th>"
            f"<th>ratio</th></tr>{cells}</table>")


class DisaggregationExplorer(w.VBox):
    """Long prompts among chats on N GPUs, colocated and split into prefill and decode pools."""

    def __init__(self, document_tokens: int = 16000, num_prefill: int = 2, num_decode: int = 2,
                 model: str = "Llama-3.1-8B", gpu: str = "H100-80GB") -> None:
        self.model, self.gpu = model, gpu
        self.document = w.IntSlider(document_tokens, 1000, 32000, 1000, description="document prompt (tokens)", **_WIDE)
        self.prefill = w.IntSlider(num_prefill, 1, 4, 1, description="prefill GPUs", **_WIDE)
        self.decode = w.IntSlider(num_decode, 1, 4, 1, description="decode GPUs", **_WIDE)
        self.pipelined = w.Checkbox(True, description="send KV layer by layer")
        self.readout = w.HTML()
        for control in (self.document, self.prefill, self.decode, self.pipelined):
            control.observe(self._update, names="value")
        super().__init__([self.document, self.prefill, self.decode, self.pipelined, self.readout])
        self._update()

    @one_at_a_time
    def _update(self, change=None) -> None:
        self.comparison = compare_disaggregation(self.model, self.gpu, document_tokens=self.document.value,
                                                 num_prefill=self.prefill.value, num_decode=self.decode.value,
                                                 pipelined=self.pipelined.value)
        chat = self.comparison.table("chat")
        worst_before, worst_after = chat["itl_max_ms"]
        self.readout.value = (
            f"<b>Chat users' worst gap between tokens: {worst_before:.0f} ms colocated, {worst_after:.0f} ms "
            f"disaggregated.</b> ({self.model} on {self.gpu}; {self.comparison.wall_s:.1f} s to simulate.)"
            + comparison_table(self.comparison))


def sweep_verdict(points: list[SweepPoint]) -> str:
    """Where speculation stops paying in this sweep, in words."""
    crossing = crossover_qps(points)
    if crossing is not None:
        return f"it stops paying at about {crossing:.0f} QPS"
    if all(p.speedup > 1 for p in points):
        return f"it pays at every rate up to {points[-1].qps:g} QPS"
    return "it never pays here" if all(p.speedup <= 1 for p in points) else "it crosses 1 more than once"


def sweep_figure(points: list[SweepPoint], speculation: SimulatedSpeculation,
                 setting: str = SWEEP_SETTING) -> go.Figure:
    """Speed-up of TPOT against request rate (log x), a line at 1 and the crossover marked;
    ``setting`` names the model and GPUs in the title."""
    drafter = speculation.draft_model.name if speculation.draft_model else "free drafts (n-gram)"
    fig = go.Figure()
    fig.add_scatter(x=[p.qps for p in points], y=[p.speedup for p in points], mode="lines+markers", name="speed-up",
                    text=[f"TPOT {p.tpot_off_ms:.1f} ms without, {p.tpot_on_ms:.1f} ms with speculation; "
                          f"{p.batch_off:.0f} requests running without it; {p.compute_bound_on:.0%} of the "
                          f"speculating server's time in compute-bound steps" for p in points],
                    hovertemplate="QPS %{x}: %{y:.2f}x<br>%{text}<extra></extra>")
    fig.add_hline(y=1, line_dash="dash", line_color="grey", annotation_text="no gain")
    crossing = crossover_qps(points)
    fig.update_xaxes(type="log", title="request rate (requests per second, Poisson arrivals)")
    if crossing is not None:
        mark_x(fig, crossing, f"stops paying at about {crossing:.0f} QPS", line_dash="dot", line_color="#d62728")
    fig.update_yaxes(title="TPOT without / with speculation (x)")
    fig.update_layout(title=f"Speculative decoding, {setting}: k = {speculation.num_speculative_tokens}, "
                            f"a = {speculation.acceptance_rate:g}, {drafter}",
                      height=400, margin=dict(t=60), showlegend=False)
    return fig


class SpeculationSweepExplorer(w.VBox):
    """Acceptance rate, k and the drafter; the QPS sweep reruns and redraws on every change."""

    DRAFTERS = {"Llama-3.2-1B draft model": "Llama-3.2-1B", "n-gram lookup (free drafts)": None}

    def __init__(self, acceptance_rate: float = 0.7, num_speculative_tokens: int = 4, min_requests: int = 200) -> None:
        self.min_requests = min_requests
        self.rate = w.FloatSlider(acceptance_rate, min=0.3, max=0.95, step=0.05, description="acceptance rate a",
                                  **_WIDE)
        self.k = w.IntSlider(num_speculative_tokens, 1, 8, 1, description="drafts per step k", **_WIDE)
        self.drafter = w.Dropdown(options=list(self.DRAFTERS), description="drafter", layout=w.Layout(width="500px"),
                                  style={"description_width": "14em"})
        self.readout, self.figure = w.HTML(), PlotlyPane()
        for control in (self.rate, self.k, self.drafter):
            control.observe(self._update, names="value")
        super().__init__([self.rate, self.k, self.drafter, self.readout, self.figure])
        self._update()

    @one_at_a_time
    def _update(self, change=None) -> None:
        draft = self.DRAFTERS[self.drafter.value]
        self.speculation = SimulatedSpeculation(self.k.value, self.rate.value, draft and get_model(draft))
        self.points = speculation_qps_sweep(list(QPS_VALUES), self.speculation, min_requests=self.min_requests)
        low, high = self.points[0], self.points[-1]
        self.readout.value = (f"QPS {low.qps:g}: <b>{low.speedup:.2f}x</b> faster per token; QPS {high.qps:g}: "
                              f"<b>{high.speedup:.2f}x</b>; <b>{sweep_verdict(self.points)}</b>. Measured "
                              f"{low.tokens_per_step:.2f} tokens per verification step.")
        self.figure.show(sweep_figure(self.points, self.speculation))
