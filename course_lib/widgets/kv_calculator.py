"""KV-cache calculator: sliders for the formula's terms, the result and the MHA/GQA/MQA effect."""

from __future__ import annotations

import ipywidgets as w

from course_lib.perf.kv import DTYPE_BYTES, kv_bytes_per_token
from course_lib.perf.models import MODELS, ModelSpec, attention_variants, kv_head_choices
from course_lib.perf.units import GiB, KiB, format_bytes, plural
from course_lib.widgets.figure_pane import FigurePane, new_figure, one_at_a_time, tight_layout_afresh
from course_lib.widgets.selection_readout import with_readout

CONTEXTS = [2**k for k in range(9, 18)]  # 512 .. 131072 tokens
H100_GIB = 80  # a line for scale: one H100's memory


def attention_kinds(spec: ModelSpec) -> list[tuple[str, int]]:
    """(label, KV heads) for the MHA, GQA and MQA variants of this model (``attention_variants``)."""
    return [(f"{v.attention_kind}, {plural(v.num_kv_heads, 'KV head')}", v.num_kv_heads) for v in attention_variants(spec)]


class KVCalculator(w.VBox):
    """bytes/token = 2 x layers x KV heads x head dim x dtype bytes, times context and batch.

    Invariant: the KV-heads slider only offers counts that divide the preset's query heads
    (at most one KV head per query head); the curves compare MHA, GQA and MQA on the preset's
    query heads with the current layers, head dim and dtype. One figure is kept and redrawn
    (under the drawing lock), so its log axes' ticks and text sizes are made once; the context
    slider only changes the readout, so it does not redraw the curves.
    """

    def __init__(self, preset: str = "Llama-3-8B") -> None:
        self.preset = w.Dropdown(options=list(MODELS), value=preset, description="preset")
        self.layers = w.IntSlider(description="layers", min=1, max=128)
        self.kv_heads = w.SelectionSlider(description="KV heads", options=[1])
        self.head_dim = w.Dropdown(description="head dim", options=[64, 80, 96, 128, 256])
        self.dtype = w.Dropdown(description="dtype", options=list(DTYPE_BYTES), value="fp16")
        self.context = w.SelectionSlider(description="context", options=CONTEXTS, value=8192)
        self.batch = w.IntSlider(description="batch", min=1, max=256, value=16)
        self.readout = w.HTML()
        self.figure = FigurePane()
        self.plot = new_figure(7.5, 3.6)
        self.plot.subplots().set(xscale="log", yscale="log", xlabel="context length (tokens)",
                                 ylabel="KV cache for the batch (GiB)")
        self.plotted: tuple | None = None  # the settings the curves show
        self._loading = False
        self.load_preset()
        self.preset.observe(lambda _: self.load_preset(), "value")
        for control in (self.layers, self.kv_heads, self.head_dim, self.dtype, self.context, self.batch):
            control.observe(lambda _: self.refresh(), "value")
        controls = w.VBox([self.preset, self.layers, with_readout(self.kv_heads), self.head_dim, self.dtype,
                           with_readout(self.context), self.batch])
        super().__init__([w.HBox([controls, self.readout]), self.figure])

    @property
    def spec(self) -> ModelSpec:
        return MODELS[self.preset.value]

    @one_at_a_time  # a redraw from another thread waits until every slider is set
    def load_preset(self) -> None:
        """Set every slider from the preset, then redraw once."""
        spec = self.spec
        self._loading = True
        try:
            # New options and the preset's choice travel to the browser in one message: sent apart,
            # the slider would first hold its old position among the new options, clamped to the last
            # one (71 KV heads for Falcon-7B), and send that back as the learner's choice.
            with self.kv_heads.hold_sync():
                self.kv_heads.options = kv_head_choices(spec.num_heads)
                self.kv_heads.value = spec.num_kv_heads
            self.layers.value, self.head_dim.value = spec.num_layers, spec.head_dim
        finally:
            self._loading = False
        self.refresh()

    def per_token(self, kv_heads: int | None = None) -> float:
        heads = self.kv_heads.value if kv_heads is None else kv_heads
        return kv_bytes_per_token(self.layers.value, heads, self.head_dim.value, DTYPE_BYTES[self.dtype.value])

    def curve_settings(self) -> tuple:
        """What the curves depend on (the context slider is not part of it)."""
        return (self.preset.value, self.layers.value, self.kv_heads.value, self.head_dim.value, self.dtype.value,
                self.batch.value)

    @one_at_a_time
    def refresh(self) -> None:
        if self._loading:
            return
        token = self.per_token()
        seq, batch = token * self.context.value, token * self.context.value * self.batch.value
        in_units = f" = {format_bytes(token)}" if token >= KiB else ""  # not "512 B = 512 B"
        self.readout.value = (
            f"<div style='padding-left:2em;font-size:110%'>2 x {plural(self.layers.value, 'layer')} x "
            f"{plural(self.kv_heads.value, 'KV head')} x {self.head_dim.value} x {DTYPE_BYTES[self.dtype.value]} B"
            f"<br>= <b>{token:,.0f} B{in_units} per token</b><br>x {self.context.value:,} tokens = "
            f"<b>{format_bytes(seq)} per sequence</b><br>x {plural(self.batch.value, 'sequence')} = "
            f"<b>{format_bytes(batch)} per batch</b></div>"
        )
        if self.curve_settings() != self.plotted:
            self.figure.redraw(self.draw)

    def draw(self):
        """KV per batch against context for MHA, GQA, MQA and the chosen KV heads, drawn on the kept figure."""
        self.plotted = self.curve_settings()
        ax = self.plot.axes[0]
        for artist in [*ax.lines, *ax.texts]:
            artist.remove()
        ax.relim()  # limits and colours as on new axes: from the curves drawn next, colours from the first
        ax.set_prop_cycle(None)
        token = self.per_token()
        for label, heads in attention_kinds(self.spec):
            ax.plot(CONTEXTS, [self.per_token(heads) * c * self.batch.value / GiB for c in CONTEXTS], label=label,
                    lw=1.2)
        ax.plot(CONTEXTS, [token * c * self.batch.value / GiB for c in CONTEXTS], "k--", lw=2,
                label=f"chosen: {plural(self.kv_heads.value, 'KV head')}")
        # named in the legend, which finds room clear of the curves, not by a label on the plot that
        # the frame or a curve can run through
        ax.axhline(H100_GIB, color="grey", lw=0.8, label=f"{H100_GIB} GiB: one H100's memory")
        ax.set_title(f"KV cache of {plural(self.batch.value, 'sequence')} vs context length "
                     f"({self.spec.num_heads} query heads)")
        ax.legend(fontsize=8)
        tight_layout_afresh(self.plot)
        return self.plot
