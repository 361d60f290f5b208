"""Module 04's simulations with knobs: colocated against disaggregated serving, and the request
rate where speculative decoding stops paying.

Both show simulated mode (the real scheduler on a roofline clock), and only what
``engine.disaggregated`` and ``engine.speculation_sweep`` return. Neither answers a slider within
a second when run live (a comparison takes about a second of CPU, a sweep several), so each
explorer looks its settings up in a grid run ahead: ``engine.disaggregation_grid`` and
``engine.speculation_grid``. Every readout names the settings its numbers are for.
"""

from __future__ import annotations

import ipywidgets as w
import plotly.graph_objects as go

from course_lib.engine import disaggregation_grid
from course_lib.engine.disaggregation_grid import (DOCUMENT_TOKENS, GRID_TAG, POOL_SIZES, DisaggregationSummary,
                                                   LayoutFinish)
from course_lib.engine.simulated_speculation import SimulatedSpeculation
from course_lib.engine.speculation_grid import (ACCEPTANCE_RATES, DRAFT_COUNTS, DRAFTERS, SWEEP_DEFAULTS,
                                                grid_speculation, lookup)
from course_lib.engine.speculation_sweep import SweepPoint, crossover_qps
from course_lib.perf.serving import expected_tokens_per_step
from course_lib.perf.units import format_number, format_speedup, plural
from course_lib.widgets.figure_pane import one_at_a_time
from course_lib.widgets.plotly_marks import mark_x
from course_lib.widgets.plotly_pane import PlotlyPane
from course_lib.widgets.selection_readout import with_readout

_WIDE = dict(continuous_update=False, style={"description_width": "14em"}, layout=w.Layout(width="500px"))

ROWS = (("ttft_p50_ms", "TTFT P50 (ms)"), ("ttft_p99_ms", "TTFT P99 (ms)"), ("itl_p50_ms", "ITL P50 (ms)"),
        ("itl_p99_ms", "ITL P99 (ms)"), ("itl_p99.9_ms", "ITL P99.9 (ms)"), ("itl_max_ms", "worst ITL gap (ms)"),
        ("finish_s", "time to finish the workload (s)"), ("output_tokens_per_s", "output tokens / time to finish"),
        ("gpu_utilization", "GPU busy share (all GPUs)"))
"""The comparison's rows: latency for the requests asked about; the last three rows are the whole
workload's (its output tokens over the time it took: not capacity, see ``finish_text``)."""
WHOLE_WORKLOAD_ROWS = 3
SWEEP_SETTING = (f"{SWEEP_DEFAULTS['model']} on {SWEEP_DEFAULTS['tensor_parallel_size']} x {SWEEP_DEFAULTS['gpu']} "
                 f"(TP={SWEEP_DEFAULTS['tensor_parallel_size']})")
_CELL = "padding:2px 12px;text-align:{}"  # columns apart, numbers right-aligned


def comparison_table(summary: DisaggregationSummary) -> str:
    """The two layouts side by side as HTML, with each row's ratio (disaggregated ÷ colocated),
    under a caption that says which requests the latency rows cover."""
    table = summary.table(summary.tag)
    cells = "".join(f"<tr><td style='{_CELL.format('left')}'>{label}</td>"
                    + "".join(f"<td style='{_CELL.format('right')}'>{value}</td>" for value in (
                        format_number(table[key][0]), format_number(table[key][1]),
                        f"{table[key][1] / table[key][0]:.2f}"))
                    + "</tr>" for key, label in ROWS if table[key][0])
    total = summary.colocated.requests
    who = f"the {summary.tagged_requests:,} {summary.tag} requests (of {total:,} in the workload)"
    headers = ("", summary.colocated.layout, summary.disaggregated.layout, "ratio: disaggregated ÷ colocated")
    return (f"<table style='border-collapse:collapse'><caption>Latency of {who}; the last "
            f"{WHOLE_WORKLOAD_ROWS} rows cover the whole workload</caption><tr>"
            + "".join(f"<th style='{_CELL.format('right')}'>{header}</th>" for header in headers) + f"</tr>{cells}</table>")


def _last_stream(finish: LayoutFinish) -> str:
    mean_gap = (f", then gaps of {format_number(finish.last_mean_gap_ms)} ms on average"
                if finish.last_mean_gap_ms is not None else "")
    return (f"{finish.layout.split(',')[0]}, a {finish.last_tag} request of "
            f"{plural(finish.last_output_tokens, 'output token')}: arrived at {format_number(finish.last_arrival_s)} s, "
            f"first token at {format_number(finish.last_first_token_s)} s{mean_gap}, last at "
            f"{format_number(finish.last_token_s)} s")


def finish_text(summary: DisaggregationSummary) -> str:
    """What the time-to-finish rows measure on this workload, computed (plain text): the ratio of
    the two layouts' output tokens / time to finish, and the request whose last token sets each
    layout's time, with its first token and its mean gap."""
    colocated, split = summary.colocated, summary.disaggregated
    per_s = summary.table(summary.tag)["output_tokens_per_s"]  # the whole workload's, whichever the tag
    ratio = per_s[1] / per_s[0]
    return (f"Output tokens / time to finish, disaggregated ÷ colocated: {ratio:.2f}. That is how soon this "
            f"workload's {colocated.output_tokens:,} output tokens were all delivered, not how many the GPUs could "
            f"serve: each layout's time to finish is set by its last request ({_last_stream(colocated)}; "
            f"{_last_stream(split)}). A stream finishes after its first token plus all its gaps, so the layout "
            f"whose last stream has the shorter gaps finishes first, however busy its GPUs are. Capacity, what "
            f"the same GPUs serve under a load that saturates them, is a different measurement.")


class DisaggregationExplorer(w.VBox):
    """Long prompts among chats on N GPUs (Llama-3.1-8B on H100s), colocated and split into
    prefill and decode pools. Each setting's comparison was run ahead with the real scheduler
    (``engine.disaggregation_grid``, the same ``compare_disaggregation``), so a move answers at once."""

    def __init__(self, document_tokens: int = 16000, num_prefill: int = 2, num_decode: int = 2) -> None:
        disaggregation_grid.lookup(document_tokens, num_prefill, num_decode, True)  # refuses a setting off the grid, naming the grid's
        self.document = w.SelectionSlider(options=[(f"{d:,}", d) for d in DOCUMENT_TOKENS], value=document_tokens,
                                          description="document prompt (tokens)", **_WIDE)
        self.prefill = w.IntSlider(num_prefill, POOL_SIZES[0], POOL_SIZES[-1], 1, description="prefill GPUs", **_WIDE)
        self.decode = w.IntSlider(num_decode, POOL_SIZES[0], POOL_SIZES[-1], 1, description="decode GPUs", **_WIDE)
        self.pipelined = w.Checkbox(True, description="send KV layer by layer", indent=False,
                                    layout=w.Layout(width="auto"))
        self.readout = w.HTML()
        for control in (self.document, self.prefill, self.decode, self.pipelined):
            control.observe(self._update, names="value")
        super().__init__([with_readout(self.document), self.prefill, self.decode, self.pipelined, self.readout])
        self._update()

    def arguments(self) -> dict:
        """The controls as ``compare_disaggregation``'s arguments: rerun the shown setting live with
        ``compare_disaggregation(**explorer.arguments())``."""
        return {"document_tokens": self.document.value, "num_prefill": self.prefill.value,
                "num_decode": self.decode.value, "pipelined": self.pipelined.value}

    def settings(self) -> str:
        """The controls' current values, in words."""
        return (f"{self.document.value:,}-token documents; {plural(self.prefill.value, 'prefill GPU')} + "
                f"{plural(self.decode.value, 'decode GPU')} against {self.prefill.value + self.decode.value} colocated; KV sent "
                f"{'layer by layer' if self.pipelined.value else 'after each prefill'}")

    @one_at_a_time
    def _update(self, change=None) -> None:
        self.summary = disaggregation_grid.lookup(**self.arguments())
        worst_before, worst_after = self.summary.table(GRID_TAG)["itl_max_ms"]
        self.readout.value = (
            f"<b>{self.settings()}</b> (Llama-3.1-8B on H100-80GB; simulated ahead with the real scheduler).<br>"
            f"<b>Chat users' worst gap between tokens: {format_number(worst_before)} ms colocated, "
            f"{format_number(worst_after)} ms disaggregated.</b>" + comparison_table(self.summary)
            + f"<p>{finish_text(self.summary)}</p>")


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
    fig.update_xaxes(type="log", title="request rate (requests per second, Poisson arrivals)", tickmode="array",
                     tickvals=[p.qps for p in points], ticktext=[f"{p.qps:g}" for p in points])  # only the rates swept
    if crossing is not None:
        mark_x(fig, crossing, f"stops paying at about {crossing:.0f} QPS", line_dash="dot", line_color="#d62728")
    fig.update_yaxes(title="TPOT without / with speculation (x)")
    fig.update_layout(title=f"Speculative decoding, {setting}: k = {speculation.num_speculative_tokens}, "
                            f"a = {speculation.acceptance_rate:g}, {drafter}",
                      height=400, margin=dict(t=60), showlegend=False)
    return fig


class SpeculationSweepExplorer(w.VBox):
    """Acceptance rate, k and the drafter; each change shows that setting's QPS sweep, looked up
    in the grid ``engine.speculation_grid`` ran ahead (the same simulation), so it answers at once."""

    DRAFTERS = {"Llama-3.2-1B draft model": DRAFTERS[0], "n-gram lookup (free drafts)": DRAFTERS[1]}

    def __init__(self, acceptance_rate: float = 0.7, num_speculative_tokens: int = 4) -> None:
        lookup(acceptance_rate, num_speculative_tokens, DRAFTERS[0])  # refuses a setting off the grid, naming it
        self.rate = w.FloatSlider(acceptance_rate, min=ACCEPTANCE_RATES[0], max=ACCEPTANCE_RATES[-1], step=0.05,
                                  description="acceptance rate a", readout_format=".2f", **_WIDE)
        self.k = w.IntSlider(num_speculative_tokens, DRAFT_COUNTS[0], DRAFT_COUNTS[-1], 1, description="drafts per step k",
                             **_WIDE)
        self.drafter = w.Dropdown(options=list(self.DRAFTERS), description="drafter", layout=w.Layout(width="500px"),
                                  style={"description_width": "14em"})
        self.readout, self.figure = w.HTML(), PlotlyPane()
        for control in (self.rate, self.k, self.drafter):
            control.observe(self._update, names="value")
        super().__init__([self.rate, self.k, self.drafter, self.readout, self.figure])
        self._update()

    @one_at_a_time
    def _update(self, change=None) -> None:
        rate = min(ACCEPTANCE_RATES, key=lambda grid_rate: abs(grid_rate - self.rate.value))  # a typed 0.33 shows 0.35
        drafter = self.DRAFTERS[self.drafter.value]
        self.speculation = grid_speculation(rate, self.k.value, drafter)
        self.points = lookup(rate, self.k.value, drafter)
        low, high = self.points[0], self.points[-1]
        expected = expected_tokens_per_step(rate, self.k.value)
        self.readout.value = (
            f"<b>Showing a = {rate:.2f}, k = {self.k.value}, {self.drafter.value}</b> (the sweep of this setting, run "
            f"ahead by <code>python -m course_lib.engine.speculation_grid</code>). QPS {low.qps:g}: "
            f"<b>{format_speedup(low.speedup)}</b> per token; QPS {high.qps:g}: <b>{format_speedup(high.speedup)}</b>; "
            f"<b>{sweep_verdict(self.points)}</b>. Measured at QPS {low.qps:g}: {low.tokens_per_step:.2f} tokens per "
            f"verification step; (1 − a<sup>k+1</sup>) / (1 − a) = {expected:.2f}.")
        self.figure.show(sweep_figure(self.points, self.speculation))
