"""Start-up memory plan: how a GPU's memory splits into weights, activations and KV blocks,
and the error a server gives when the split leaves too little for the cache."""

from __future__ import annotations

import html

import ipywidgets as w

from course_lib.perf.hardware import GPUS
from course_lib.perf.kv import KVCacheMemoryError, MaxModelLenError, plan_kv_cache, split_memory
from course_lib.perf.models import MODELS
from course_lib.perf.units import GiB, format_bytes
from course_lib.widgets.figure_pane import FigurePane, new_figure, one_at_a_time
from course_lib.widgets.selection_readout import with_readout

MODEL_LENGTHS = [2**k for k in range(11, 18)]  # 2048 .. 131072


class MemoryPlanExplorer(w.VBox):
    """Pick GPU, model and settings; see the memory split and whether the server would start."""

    def __init__(self, gpu: str = "H100-80GB", model: str = "Llama-3.1-8B",
                 gpu_memory_utilization: float = 0.9, max_model_len: int = 131072) -> None:
        self.gpu = w.Dropdown(description="GPU", options=list(GPUS), value=gpu)
        self.model = w.Dropdown(description="model", options=list(MODELS), value=model)
        self.utilization = w.FloatSlider(description="gpu_mem_util", min=0.05, max=0.98, step=0.01,
                                         value=gpu_memory_utilization, style={"description_width": "initial"})
        self.max_model_len = w.SelectionSlider(description="max_model_len", options=MODEL_LENGTHS,
                                               value=max_model_len, style={"description_width": "initial"})
        self.tensor_parallel = w.Dropdown(description="TP size", options=[1, 2, 4, 8], value=1)
        self.verdict = w.HTML()
        self.figure = FigurePane()
        controls = [self.gpu, self.model, self.utilization, self.max_model_len, self.tensor_parallel]
        for control in controls:
            control.observe(lambda _: self.refresh(), "value")
        shown = [with_readout(control) for control in controls]
        super().__init__([w.HBox([w.VBox(shown[:3]), w.VBox(shown[3:])]), self.verdict, self.figure])
        self.refresh()

    def settings(self) -> dict:
        return dict(gpu_memory_utilization=round(self.utilization.value, 2),  # the browser slider sends 0.30000000000000004
                    max_model_len=self.max_model_len.value,
                    tensor_parallel_size=self.tensor_parallel.value)

    @one_at_a_time
    def refresh(self) -> None:
        gpu, model = GPUS[self.gpu.value], MODELS[self.model.value]
        try:
            plan = plan_kv_cache(model, gpu, **self.settings())
        except (KVCacheMemoryError, MaxModelLenError) as error:
            self.verdict.value = f"<p style='color:#cf222e'><b>Server refuses to start.</b> {html.escape(str(error))}</p>"
        else:
            self.verdict.value = (
                f"<p style='color:#1a7f37'><b>Server starts:</b> {plan.num_blocks:,} blocks = {plan.max_tokens:,} tokens"
                f" of KV cache per GPU; maximum concurrency for {plan.max_model_len:,}-token requests: "
                f"{plan.max_concurrency:.2f}x.</p>"
            )
        self.figure.redraw(self.draw)

    def draw(self):
        """A stacked bar of one GPU: weights, activation peak, KV cache, memory left outside the budget."""
        gpu, model = GPUS[self.gpu.value], MODELS[self.model.value]
        plan = split_memory(model, gpu, **self.settings())
        weights = min(plan.weight_bytes, plan.budget_bytes)
        parts = [("weights (bf16)", weights, "#8c564b"),
                 ("activation peak", min(plan.activation_reserve_bytes, plan.budget_bytes - weights), "#ff7f0e"),
                 ("KV cache", max(0.0, plan.kv_cache_bytes), "#2ca02c"),
                 ("outside gpu_memory_utilization", plan.gpu_memory_bytes - plan.budget_bytes, "#dddddd")]
        fig = new_figure(9.5, 2.2)
        ax = fig.subplots()
        left = 0.0
        for label, size, color in parts:
            ax.barh([0], [size / GiB], left=left / GiB, color=color, label=label)
            left += size
        if plan.weight_bytes > plan.budget_bytes:
            ax.axvline(plan.weight_bytes / GiB, color="#cf222e", ls="--", lw=1.5, label="end of the weights")
        if plan.max_model_len > model.max_context:
            title = f"{model.name} on {gpu.name}: max_model_len is above the model's {model.max_context:,} tokens"
        else:
            needed = format_bytes(plan.max_model_len * plan.bytes_per_token, whole=True)
            title = f"{model.name} on {gpu.name}: one {plan.max_model_len:,}-token request needs {needed} of KV"
        ax.set(xlabel="GPU memory per GPU (GiB)", yticks=[],
               xlim=(0, max(plan.gpu_memory_bytes, plan.weight_bytes) / GiB * 1.02), title=title)
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
        fig.tight_layout()
        return fig
