"""KV-cache calculator: sliders for the formula's terms, the result and the MHA/GQA/MQA effect."""

from __future__ import annotations

import ipywidgets as w
import matplotlib.pyplot as plt

from course_lib.perf.kv import DTYPE_BYTES, kv_bytes_per_token
from course_lib.perf.models import MODELS
from course_lib.perf.units import GiB, format_bytes
from course_lib.widgets.figure_pane import FigurePane

CONTEXTS = [2**k for k in range(9, 18)]  # 512 .. 131072 tokens


class KVCalculator(w.VBox):
    """bytes/token = 2 x layers x KV heads x head dim x dtype bytes, times context and batch."""

    def __init__(self, preset: str = "Llama-3-8B") -> None:
        self.preset = w.Dropdown(options=list(MODELS), value=preset, description="preset")
        self.layers = w.IntSlider(description="layers", min=1, max=128)
        self.kv_heads = w.IntSlider(description="KV heads", min=1, max=128)
        self.head_dim = w.Dropdown(description="head dim", options=[64, 80, 96, 128, 256])
        self.dtype = w.Dropdown(description="dtype", options=list(DTYPE_BYTES), value="fp16")
        self.context = w.SelectionSlider(description="context", options=CONTEXTS, value=8192)
        self.batch = w.IntSlider(description="batch", min=1, max=256, value=16)
        self.readout = w.HTML()
        self.figure = FigurePane()
        self.preset.observe(lambda _: self.load_preset(), "value")
        self.load_preset()
        for control in (self.layers, self.kv_heads, self.head_dim, self.dtype, self.context, self.batch):
            control.observe(lambda _: self.refresh(), "value")
        self.refresh()
        controls = w.VBox([self.preset, self.layers, self.kv_heads, self.head_dim, self.dtype, self.context, self.batch])
        super().__init__([w.HBox([controls, self.readout]), self.figure])

    def load_preset(self) -> None:
        spec = MODELS[self.preset.value]
        with self.hold_trait_notifications():
            self.layers.value, self.kv_heads.value = spec.num_layers, spec.num_kv_heads
            self.head_dim.value = spec.head_dim
        self.refresh()

    def per_token(self, kv_heads: int | None = None) -> float:
        heads = self.kv_heads.value if kv_heads is None else kv_heads
        return kv_bytes_per_token(self.layers.value, heads, self.head_dim.value, DTYPE_BYTES[self.dtype.value])

    def refresh(self) -> None:
        if not hasattr(self, "figure"):
            return  # still building
        token = self.per_token()
        seq, batch = token * self.context.value, token * self.context.value * self.batch.value
        self.readout.value = (
            f"<div style='padding-left:2em;font-size:110%'>2 x {self.layers.value} layers x {self.kv_heads.value} KV heads"
            f" x {self.head_dim.value} x {DTYPE_BYTES[self.dtype.value]} B<br>= <b>{token:,.0f} B = "
            f"{format_bytes(token)} per token</b><br>x {self.context.value:,} tokens = <b>{format_bytes(seq)}"
            f" per sequence</b><br>x {self.batch.value} sequences = <b>{format_bytes(batch)} per batch</b></div>"
        )
        self.figure.show(self.draw())

    def draw(self):
        """KV per batch against context for this model's shape with 1, 8, 32 and the chosen KV heads."""
        fig, ax = plt.subplots(figsize=(7.5, 3.6))
        batch = self.batch.value
        for heads, label in ((32, "MHA, 32 KV heads"), (8, "GQA, 8 KV heads"), (1, "MQA, 1 KV head")):
            ax.plot(CONTEXTS, [self.per_token(heads) * c * batch / GiB for c in CONTEXTS], label=label, lw=1.2)
        ax.plot(CONTEXTS, [self.per_token() * c * batch / GiB for c in CONTEXTS], "k--", lw=2,
                label=f"chosen: {self.kv_heads.value} KV heads")
        ax.axhline(80, color="grey", lw=0.8)
        ax.text(CONTEXTS[0], 85, "80 GiB: one H100", fontsize=8, color="grey")
        ax.set(xscale="log", yscale="log", xlabel="context length (tokens)", ylabel="KV cache for the batch (GiB)",
               title=f"KV cache of {batch} sequences vs context length")
        ax.legend(fontsize=8)
        fig.tight_layout()
        return fig
