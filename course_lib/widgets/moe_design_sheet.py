"""Module 08's MoE serving design sheet: pick a cluster and a layout for DeepSeek-V3, see what one
GPU holds and whether each parallelism dimension lands on the right interconnect.

Every number and sentence comes from ``course_lib.perf.moe_serving``; the sheet only lays them out
and redraws its HTML in place on every change.
"""

from __future__ import annotations

import html

import ipywidgets as w

from course_lib.perf.hardware import GPUS, get_gpu
from course_lib.perf.models import DEEPSEEK_V3, ModelSpec
from course_lib.perf.moe_serving import (
    DEFAULT_GPU,
    DEFAULT_WEIGHT_DTYPE,
    PRESETS,
    WEIGHT_DTYPES,
    Cluster,
    Layout,
    LayoutError,
    MoEServingPlan,
    kv_summary,
    memory_rows,
    one_node_verdict,
    plan_moe_serving,
    serving_checklist,
)

SIZES = (1, 2, 4, 8, 16, 32)
STYLE = {"description_width": "9em"}
COLORS = {"right": "#1a7f37", "watch": "#9a6700", "wrong": "#cf222e"}


def plan_html(plan: MoEServingPlan) -> str:
    """The memory table (GiB per GPU by component), the KV line and the findings, marked."""
    rows = "".join(
        f"<tr><td style='padding-right:2em'>{'<b>' if name == 'weights total' else ''}{html.escape(name)}</td>"
        f"<td style='text-align:right'>{value}</td></tr>" for name, value in memory_rows(plan))
    table = (f"<table><tr><th style='text-align:left'>per GPU ({html.escape(plan.cluster.name)}, "
             f"{html.escape(plan.layout.name)}, {plan.weight_dtype} weights)</th><th>GiB</th></tr>{rows}</table>")
    return f"{table}<p>{html.escape(kv_summary(plan))}</p>{findings_html(plan)}"


def findings_html(plan: MoEServingPlan) -> str:
    items = "".join(
        f"<li style='color:{COLORS[f.verdict]}'><b>{f.mark} {html.escape(f.dimension)}</b> "
        f"<i>[{html.escape(f.link)}]</i>: {html.escape(f.text)}.<br><span style='color:#444'>Why: "
        f"{html.escape(f.why)}</span></li>" for f in plan.findings)
    wrong = len(plan.wrong)
    summary = "no wrong choices" if not wrong else f"{wrong} wrong choice{'s' if wrong > 1 else ''}"
    return f"<p><b>Findings: {summary}</b></p><ul style='list-style:none;padding-left:0'>{items}</ul>"


def error_html(error: LayoutError) -> str:
    return f"<p style='color:{COLORS['wrong']}'><b>✘ This layout cannot be built.</b> {html.escape(str(error))}</p>"


def checklist_html(cluster: Cluster) -> str:
    items = "".join(f"<li><b>{html.escape(name)}</b>: {html.escape(why)}</li>"
                    for name, why in serving_checklist(cluster))
    return f"<p><b>Whatever the layout, the server also needs:</b></p><ul>{items}</ul>"


class MoEDesignSheet(w.VBox):
    """Controls for the cluster (nodes, GPUs per node, GPU type), the weight dtype and the layout
    (TP, DP, EP, PP); preset buttons for ``moe_serving.PRESETS``; whether one node of the chosen GPUs
    could hold the model, the plan and the checklist, all redrawn in place. It opens on the TP=16 bug,
    on two nodes of ``DEFAULT_GPU``."""

    def __init__(self, model: ModelSpec = DEEPSEEK_V3, nodes: int = 2, gpus_per_node: int = 8,
                 gpu: str = DEFAULT_GPU, weight_dtype: str = DEFAULT_WEIGHT_DTYPE, layout: Layout | None = None) -> None:
        self.model = model
        layout = Layout(tp=16) if layout is None else layout  # the sheet opens on the bug to fix
        drop = {"style": STYLE}
        self.nodes = w.Dropdown(options=(1, 2, 3, 4), value=nodes, description="nodes", **drop)
        self.gpus_per_node = w.Dropdown(options=(1, 2, 4, 8), value=gpus_per_node, description="GPUs per node", **drop)
        self.gpu = w.Dropdown(options=list(GPUS), value=get_gpu(gpu).name, description="GPU", **drop)
        self.dtype = w.ToggleButtons(options=WEIGHT_DTYPES, value=weight_dtype, description="weights", style=STYLE)
        self.tp = w.Dropdown(options=SIZES, value=layout.tp, description="TP (attention)", **drop)
        self.dp = w.Dropdown(options=SIZES, value=layout.dp, description="DP (attention)", **drop)
        self.ep = w.Dropdown(options=SIZES, value=layout.ep, description="EP (experts)", **drop)
        self.pp = w.Dropdown(options=(1, 2, 4), value=layout.pp, description="PP", **drop)
        self.buttons = [w.Button(description=name, layout=w.Layout(width="auto")) for name in PRESETS]
        for button in self.buttons:
            button.on_click(self._preset)
        self.sheet, self.premise, self.checklist = w.HTML(), w.HTML(), w.HTML()
        self._loading = False
        self.controls = (self.nodes, self.gpus_per_node, self.gpu, self.dtype, self.tp, self.dp, self.ep, self.pp)
        for control in self.controls:
            control.observe(self._redraw, "value")
        self._redraw()
        super().__init__([
            w.HTML(f"<b>Serve {html.escape(model.name)} across nodes: which layout?</b>"),
            w.HBox([w.VBox([self.nodes, self.gpus_per_node, self.gpu, self.dtype]),
                    w.VBox([self.tp, self.dp, self.ep, self.pp])]),
            w.HBox(self.buttons), self.premise, self.sheet, self.checklist])

    def cluster(self) -> Cluster:
        return Cluster(self.nodes.value, self.gpus_per_node.value, GPUS[self.gpu.value])

    def parallel_layout(self) -> Layout:
        """The TP, DP, EP and PP the controls hold (not ``self.layout``, the widget's CSS layout)."""
        return Layout(tp=self.tp.value, dp=self.dp.value, ep=self.ep.value, pp=self.pp.value)

    def plan(self) -> MoEServingPlan:
        """The plan for the current settings; raises LayoutError if they cannot be built."""
        return plan_moe_serving(self.model, self.cluster(), self.parallel_layout(), weight_dtype=self.dtype.value)

    def apply(self, name: str) -> None:
        """Set every control to the preset ``name`` (a key of ``PRESETS``), then redraw once."""
        nodes, gpus_per_node, layout = PRESETS[name]
        self._loading = True
        try:  # the presets are laid out for the default cluster: DEFAULT_GPU with fp8 weights
            self.gpu.value, self.dtype.value = get_gpu(DEFAULT_GPU).name, DEFAULT_WEIGHT_DTYPE
            self.nodes.value, self.gpus_per_node.value = nodes, gpus_per_node
            self.tp.value, self.dp.value, self.ep.value, self.pp.value = layout.tp, layout.dp, layout.ep, layout.pp
        finally:
            self._loading = False
        self._redraw()

    def _preset(self, button: w.Button) -> None:
        self.apply(button.description)

    def _redraw(self, *_) -> None:
        if self._loading:
            return
        cluster = self.cluster()
        verdict = one_node_verdict(self.model, cluster.gpu, cluster.gpus_per_node, weight_dtype=self.dtype.value)
        self.premise.value = f"<p><i>{html.escape(verdict)}</i></p>"
        self.checklist.value = checklist_html(cluster)
        try:
            self.sheet.value = plan_html(self.plan())
        except LayoutError as error:
            self.sheet.value = error_html(error)
