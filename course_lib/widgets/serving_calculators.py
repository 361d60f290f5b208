"""Module 04's calculators: the P:D ratio, the KV transfer, and speculation's tokens per step.

Every number they show comes from ``perf/serving.py``; the widgets only choose the inputs and
write out the working, so a learner can check each step of the arithmetic.
"""

from __future__ import annotations

import ipywidgets as w
import plotly.graph_objects as go

from course_lib.perf.comm import LINKS
from course_lib.perf.models import MODELS, get_model
from course_lib.perf.serving import expected_tokens_per_step, kv_transfer, pd_ratio
from course_lib.perf.units import KiB, format_number, format_si, plural
from course_lib.widgets.figure_pane import one_at_a_time

_WIDE = dict(continuous_update=False, style={"description_width": "16em"}, layout=w.Layout(width="520px"))


class PDRatioCalculator(w.VBox):
    """Decode capacity (sequences / TPOT / output length) against one prefill instance's rate."""

    def __init__(self, num_seqs: int = 256, tpot_ms: float = 40, output_len: int = 500,
                 prefill_requests_per_s: float = 10) -> None:
        self.num_seqs = w.IntSlider(num_seqs, 8, 1024, 8, description="sequences per decode instance", **_WIDE)
        self.tpot_ms = w.FloatSlider(tpot_ms, min=5, max=200, step=0.1, description="TPOT (ms)", readout_format=".1f",
                                     **_WIDE)
        self.output_len = w.IntSlider(output_len, 50, 4000, 50, description="output tokens per request",
                                      readout_format=",d", **_WIDE)
        self.prefill = w.FloatSlider(prefill_requests_per_s, min=1, max=100, step=0.1, readout_format=".1f",
                                     description="prefill instance (requests/s)", **_WIDE)
        self.readout = w.HTML()
        for control in (self.num_seqs, self.tpot_ms, self.output_len, self.prefill):
            control.observe(self._update, names="value")
        super().__init__([self.num_seqs, self.tpot_ms, self.output_len, self.prefill, self.readout])
        self._update()

    @one_at_a_time
    def _update(self, change=None) -> None:
        r = pd_ratio(self.num_seqs.value, self.tpot_ms.value / 1e3, self.output_len.value, self.prefill.value)
        self.ratio = r
        self.readout.value = (
            f"{r.num_seqs:,} sequences / {format_number(r.tpot_s * 1e3)} ms = <b>{r.decode_tokens_per_s:,.0f} tokens/s"
            f"</b> per decode instance; / {r.output_len:,} tokens = <b>{plural(r.decode_requests_per_s, 'request/s')}"
            f"</b>. One prefill instance serves {plural(r.prefill_requests_per_s, 'request/s')}, so each decode instance "
            f"needs <b>{plural(r.prefill_per_decode, 'prefill instance')}</b> (for 10 decode instances: "
            f"{plural(r.prefill_instances_for(10), 'prefill instance')}).")


class KVTransferCalculator(w.VBox):
    """How long moving a prompt's KV cache from the prefill GPU to the decode GPU takes."""

    def __init__(self, model: str = "Llama-3.1-70B", num_tokens: int = 10_000,
                 link: str = "InfiniBand NDR 400 Gb/s (across nodes)") -> None:
        self.model = w.Dropdown(options=list(MODELS), value=get_model(model).name, description="model")
        self.tokens = w.IntSlider(num_tokens, 16, get_model(model).max_context, 16, description="prompt tokens",
                                  readout_format=",d", **_WIDE)
        self.link = w.Dropdown(options=list(LINKS), value=link, description="link", layout=w.Layout(width="520px"))
        self.pipelined = w.Checkbox(False, description="send layer by layer while the prefill runs", indent=False,
                                    layout=w.Layout(width="auto"))
        self.readout = w.HTML()
        for control in (self.model, self.tokens, self.link, self.pipelined):
            control.observe(self._update, names="value")
        super().__init__([self.model, self.tokens, self.link, self.pipelined, self.readout])
        self._update()

    @one_at_a_time
    def _update(self, change=None) -> None:
        model, link = get_model(self.model.value), LINKS[self.link.value]
        self.tokens.max = model.max_context  # a longer prompt than the model reads: the slider stops there
        t = kv_transfer(model, self.tokens.value, link.bandwidth, pipelined=self.pipelined.value)
        self.transfer = t
        exposed = (f"layer by layer, only the last of {t.num_layers} layers waits: <b>{format_number(t.exposed_s * 1e3)} "
                   "ms</b> exposed (if the link keeps up with the prefill)" if t.pipelined
                   else f"sent after the prefill, all of it is exposed: <b>{format_number(t.exposed_s * 1e3)} ms</b>")
        self.readout.value = (
            f"{plural(t.num_tokens, 'token')} of {model.name} KV × {format_number(t.bytes / t.num_tokens / KiB)} KiB per "
            f"token = <b>{format_si(t.bytes, 'B')}</b>; at {format_number(link.bandwidth / 1e9)} GB/s that takes "
            f"{format_number(t.time_s * 1e3)} ms; {exposed}. (The prompt slider stops at {model.name}'s longest "
            f"context, {plural(model.max_context, 'token')}.)")


def expected_tokens_figure(max_drafts: int = 8, rates=(0.5, 0.6, 0.7, 0.8, 0.9)) -> go.Figure:
    """Tokens per target step, (1 - a^(k+1)) / (1 - a), against k, one line per acceptance rate a."""
    fig = go.Figure()
    ks = list(range(max_drafts + 1))
    for rate in rates:
        fig.add_scatter(x=ks, y=[expected_tokens_per_step(rate, k) for k in ks], mode="lines+markers",
                        name=f"a = {rate:g}", hovertemplate=f"a = {rate:g}, k = %{{x}}: %{{y:.3f}} tokens<extra></extra>")
    fig.update_layout(title="Speculative decoding: tokens per target step (a geometric series; it flattens as k grows)",
                      xaxis_title="drafts per step k", yaxis_title="expected tokens per target step",
                      height=380, margin=dict(t=50))
    return fig
