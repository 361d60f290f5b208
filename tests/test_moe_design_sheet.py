"""Module 08's MoE design sheet widget: text from course_lib.perf.moe_serving, redrawn in place."""

from course_lib.perf.hardware import get_gpu
from course_lib.perf.models import DEEPSEEK_V3
from course_lib.perf.moe_serving import (
    DEFAULT_GPU,
    PRESETS,
    RECOMMENDED,
    Cluster,
    Layout,
    kv_summary,
    one_node_verdict,
    plan_moe_serving,
    serving_checklist,
)
from course_lib.widgets.moe_design_sheet import MoEDesignSheet, plan_html


def test_the_sheet_opens_on_the_bug_and_marks_it_wrong():
    sheet = MoEDesignSheet()
    html = sheet.sheet.value
    assert "✘ TP" in html and "TP=16 spans 2 nodes" in html and "3 wrong choices" in html
    assert "routed experts" in html and "GiB" in html and "<table>" in html
    assert "PagedAttention" in sheet.checklist.value


def test_the_sheet_opens_on_the_lessons_premise():
    """Lesson 08: the model does not fit one node of 80 GB GPUs. The sheet opens on two nodes of those,
    says one node would not do, and its recommended layout fixes the bug with no wrong choice."""
    sheet = MoEDesignSheet()
    cluster = sheet.cluster()
    assert cluster.gpu == get_gpu(DEFAULT_GPU) and cluster.gpu.memory_bytes <= 80 * 2**30
    assert (cluster.nodes, cluster.gpus_per_node, sheet.dtype.value) == (2, 8, "fp8")
    assert one_node_verdict() in sheet.premise.value and "no layout fits" in sheet.premise.value
    sheet.apply("DP=16 attention + EP=16 (recommended)")
    assert sheet.parallel_layout() == RECOMMENDED and "no wrong choices" in sheet.sheet.value
    sheet.gpu.value = "H200-141GB"
    assert "fits one node" in sheet.premise.value  # the premise is the GPU's, redrawn with it


def test_the_sheet_keeps_its_widget_layout():
    """The parallel layout has its own method name: shadowing ipywidgets' ``layout`` trait broke the
    widget (no CSS layout to serialise or read)."""
    import ipywidgets as w

    sheet = MoEDesignSheet()
    assert isinstance(sheet.layout, w.Layout) and sheet.parallel_layout() == Layout(tp=16)


def test_every_line_names_the_chosen_gpus_links():
    sheet = MoEDesignSheet(gpu="H200-141GB", layout=Layout(tp=8, dp=2, ep=16))
    text = sheet.premise.value + sheet.sheet.value + sheet.checklist.value
    assert "NVLink (H200-141GB, within a node)" in sheet.sheet.value and "H100" not in text
    assert sheet.checklist.value.count("H200-141GB") == len([why for _, why in serving_checklist(sheet.cluster())
                                                             if "H200-141GB" in why])
    sheet.gpu.value = "A100-80GB"
    assert "NVLink (A100-80GB, within a node) 300 GB/s" in sheet.checklist.value and "H200" not in sheet.checklist.value


def test_preset_buttons_set_the_controls_and_redraw_in_place():
    sheet = MoEDesignSheet()
    pane = sheet.sheet
    recommended = next(b for b in sheet.buttons if "recommended" in b.description)
    recommended.click()
    assert (sheet.tp.value, sheet.dp.value, sheet.ep.value, sheet.pp.value) == (1, 16, 16, 1)
    assert sheet.sheet is pane and "no wrong choices" in pane.value and "dummy forwards" in pane.value
    plan = plan_moe_serving(DEEPSEEK_V3, Cluster(2, 8, get_gpu(DEFAULT_GPU)), Layout(dp=16, ep=16))
    assert pane.value == plan_html(plan) and kv_summary(plan).split(";")[1].strip() in pane.value
    bug = next(b for b in sheet.buttons if "bug" in b.description)
    bug.click()
    assert sheet.tp.value == 16 and "3 wrong choices" in pane.value
    assert [b.description for b in sheet.buttons] == list(PRESETS)


def test_controls_update_the_sheet_and_errors_are_shown():
    sheet = MoEDesignSheet(gpu="H200-141GB", layout=Layout(tp=8, dp=2, ep=16))
    assert "1 wrong choice<" in sheet.sheet.value and "✘ attention TP and KV" in sheet.sheet.value
    sheet.dtype.value = "bf16"
    assert "weights do not fit" not in sheet.sheet.value  # 16 H200 hold bf16 weights with EP=16
    sheet.gpu.value = "H100-80GB"
    assert "weights do not fit" in sheet.sheet.value and "✘ memory" in sheet.sheet.value
    sheet.dtype.value = "fp8"
    assert "weights fit" in sheet.sheet.value
    sheet.nodes.value = 1
    assert "cannot be built" in sheet.sheet.value and "the cluster has 8" in sheet.sheet.value
    sheet.dp.value = 1
    sheet.ep.value = 8
    assert "cannot be built" not in sheet.sheet.value and "weights do not fit" in sheet.sheet.value  # 8 H100: too small


def test_a_preset_also_restores_the_gpu_and_weight_dtype_it_is_laid_out_for():
    sheet = MoEDesignSheet()
    sheet.gpu.value, sheet.dtype.value = "L4-24GB", "bf16"
    sheet.apply("DP=16 attention + EP=16 (recommended)")
    assert (sheet.gpu.value, sheet.dtype.value) == (DEFAULT_GPU, "fp8")
    assert not sheet.plan().wrong
