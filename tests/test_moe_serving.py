"""Module 08's MoE serving sheet: DeepSeek-V3's memory per GPU and the layout rubric."""

import dataclasses
import re

import pytest

from course_lib.perf.hardware import get_gpu
from course_lib.perf.interconnect import INFINIBAND_NDR
from course_lib.perf.kv import dtype_bytes
from course_lib.perf.models import DEEPSEEK_V3, get_model
from course_lib.perf.moe_serving import (
    COMPONENTS,
    DEFAULT_GPU,
    LAYOUT_SIZES,
    PRESETS,
    RECOMMENDED,
    WATCH,
    Cluster,
    Layout,
    LayoutError,
    check_layout,
    kv_summary,
    lightest_plan,
    memory_per_gpu,
    memory_rows,
    model_summary,
    one_node_verdict,
    parameter_breakdown,
    plan_moe_serving,
    serving_checklist,
    weight_bytes_per_param,
)
from course_lib.perf import vllm_all_reduce
from course_lib.perf.units import GiB
from course_lib.perf.vllm_all_reduce import PCIE_GROUP_MAX
from course_lib.quiz.bank import load_bank

TWO_H200 = Cluster(2, 8, get_gpu("H200-141GB"))


def test_parameter_counts_from_the_config_add_up_to_671b_and_37b():
    p = parameter_breakdown(DEEPSEEK_V3)
    expert = 3 * 7168 * 2048  # gated MLP of moe_intermediate_size
    assert p.routed_experts == 58 * 256 * expert  # 58 MoE layers = 61 - first_k_dense_replace 3
    assert p.shared_experts == 58 * 1 * expert
    assert p.dense_mlp == 3 * 3 * 7168 * 18432
    assert p.embeddings == 2 * 129280 * 7168  # untied embedding and LM head
    assert p.router == 58 * 7168 * 256
    assert p.total == pytest.approx(671e9, rel=0.01)
    # DeepSeek's README_WEIGHTS: 36.6B activated (the paper: 37B), the 0.9B output head in, the input lookup out
    assert p.active == pytest.approx(36.6e9, rel=0.005)
    assert p.routed_experts / p.total == pytest.approx(0.974, abs=0.002)  # why EP decides the memory


def test_a_dense_model_has_no_experts_and_only_split_attention():
    p = parameter_breakdown(get_model("Llama-3.1-70B"))
    assert p.routed_experts == p.shared_experts == p.router == p.attention_replicated == 0
    assert p.total == pytest.approx(70.6e9, rel=0.01)


def test_memory_per_gpu_sums_the_components_with_the_right_divisors():
    p = parameter_breakdown(DEEPSEEK_V3)
    fp8, bf16 = weight_bytes_per_param("fp8"), 2
    layout = Layout(tp=8, dp=2, ep=16)
    memory = memory_per_gpu(DEEPSEEK_V3, layout, "fp8")
    assert list(memory) == list(COMPONENTS)
    assert memory["attention"] == pytest.approx((p.attention_replicated + p.attention_split / 8) * fp8)
    assert memory["routed experts"] == pytest.approx(p.routed_experts / 16 * fp8)  # 16 of the 256 experts per GPU
    assert memory["shared expert"] == pytest.approx(p.shared_experts / 8 * fp8)  # split by TP, copied per DP rank
    assert memory["embeddings + LM head"] == pytest.approx(p.embeddings / 8 * bf16)  # bf16 in the fp8 checkpoint
    plan = plan_moe_serving(DEEPSEEK_V3, TWO_H200, layout)
    assert plan.weight_bytes == pytest.approx(sum(memory.values()))
    # the whole model in fp8 once over the 16 GPUs' routed share, the rest per TP group
    total = sum(memory_per_gpu(DEEPSEEK_V3, Layout(tp=1), "fp8").values())
    assert total == pytest.approx((p.total - p.embeddings - p.router) * fp8 + (p.embeddings + p.router) * bf16)
    assert weight_bytes_per_param("fp8") == 1 + 4 / 128**2 and weight_bytes_per_param("bf16") == 2
    with pytest.raises(KeyError, match="choose one of"):
        weight_bytes_per_param("int4")


def test_kv_room_and_tokens_follow_from_the_budget():
    plan = plan_moe_serving(DEEPSEEK_V3, TWO_H200, RECOMMENDED)
    assert plan.budget_bytes == pytest.approx(0.9 * 141 * GiB)
    assert plan.kv_cache_bytes == pytest.approx(plan.budget_bytes - plan.weight_bytes - 1 * GiB)
    assert plan.kv_bytes_per_token == 61 * 576 * dtype_bytes("bf16") == 70272
    assert plan.kv_tokens_per_gpu == int(plan.kv_cache_bytes // (70272 * 64)) * 64  # whole 64-token blocks
    assert plan.kv_tokens_deployment == 16 * plan.kv_tokens_per_gpu and plan.fits
    assert f"{plan.kv_tokens_per_gpu:,} tokens per GPU" in kv_summary(plan)
    rows = dict(memory_rows(plan))
    assert float(rows["weights total"]) == pytest.approx(plan.weight_bytes / GiB, abs=0.01)


def test_tp_on_mla_attention_replicates_the_latent_and_dp_does_not():
    tp8 = plan_moe_serving(DEEPSEEK_V3, TWO_H200, Layout(tp=8, dp=2, ep=16))
    dp16 = plan_moe_serving(DEEPSEEK_V3, TWO_H200, RECOMMENDED)
    assert tp8.kv_bytes_per_token == dp16.kv_bytes_per_token == 70272  # TP does not shrink the latent
    assert tp8.kv_copies == 8 and dp16.kv_copies == 1
    assert tp8.kv_tokens_per_gpu > dp16.kv_tokens_per_gpu  # TP=8 frees weight memory...
    assert dp16.kv_tokens_deployment > 6 * tp8.kv_tokens_deployment  # ...but DP caches far more distinct tokens
    finding = next(f for f in tp8.findings if f.dimension == "attention TP and KV")
    assert finding.verdict == "wrong" and "replicates the 576-element latent on all 8 ranks" in finding.text


def test_fp8_fits_one_h200_node_but_not_one_h100_node_nor_bf16():
    def plan(gpu, dtype):
        return plan_moe_serving(DEEPSEEK_V3, Cluster(1, 8, get_gpu(gpu)), Layout(tp=8), weight_dtype=dtype)

    assert plan("H200-141GB", "fp8").fits
    assert [f.dimension for f in plan("H200-141GB", "fp8").wrong] == ["attention TP and KV"]  # TP on MLA: see below
    for gpu, dtype in (("H100-80GB", "fp8"), ("H200-141GB", "bf16")):
        p = plan(gpu, dtype)
        assert not p.fits and p.kv_tokens_per_gpu == 0
        memory = p.findings[0]
        assert memory.verdict == "wrong" and memory.text.startswith("weights do not fit: ")
        assert f"{p.weight_bytes / GiB:.1f} GiB per GPU > {(p.budget_bytes - GiB) / GiB:.1f} GiB" in memory.text
    assert "use fp8 weights" in plan("H200-141GB", "bf16").findings[0].why
    assert "use fp8 weights" not in plan("H100-80GB", "fp8").findings[0].why
    assert plan_moe_serving(DEEPSEEK_V3, Cluster(2, 8, get_gpu("H100-80GB")), RECOMMENDED).fits  # two H100 nodes do


def test_weights_that_fit_but_leave_less_than_one_request_are_wrong():
    plan = plan_moe_serving(DEEPSEEK_V3, Cluster(2, 8, get_gpu("H100-80GB")), RECOMMENDED, gpu_memory_utilization=0.78)
    assert plan.weight_bytes < plan.budget_bytes and plan.kv_tokens_per_gpu < DEEPSEEK_V3.max_context
    assert not plan.fits and "less than one 163,840-token request" in plan.findings[0].text


def test_tp16_across_two_nodes_is_the_bug():
    plan = plan_moe_serving(DEEPSEEK_V3, TWO_H200, Layout(tp=16))
    tp = next(f for f in plan.findings if f.dimension == "TP")
    assert tp.verdict == "wrong" and tp.link == INFINIBAND_NDR
    assert tp.text.startswith("TP=16 spans 2 nodes: its per-layer all-reduce crosses InfiniBand")
    experts = next(f for f in plan.findings if f.dimension == "expert TP")
    assert experts.verdict == "wrong" and "EP=16" in experts.why
    assert {f.dimension for f in plan.wrong} == {"TP", "expert TP", "attention TP and KV"}
    assert tp.line.startswith("✘ TP [InfiniBand")


def test_tp_inside_a_node_is_right_and_straddling_groups_are_wrong():
    tp8 = plan_moe_serving(DEEPSEEK_V3, TWO_H200, Layout(tp=8, dp=2, ep=16))
    tp = next(f for f in tp8.findings if f.dimension == "TP")
    assert tp.verdict == "right" and tp.link == "NVLink (H200-141GB, within a node)" and "one-shot" in tp.why
    odd = plan_moe_serving(DEEPSEEK_V3, Cluster(2, 4, get_gpu("H200-141GB")), Layout(tp=8, ep=8), weight_dtype="fp8")
    assert next(f for f in odd.findings if f.dimension == "TP").verdict == "wrong"


def test_ep_across_nodes_is_acceptable_but_watch_busbw():
    plan = plan_moe_serving(DEEPSEEK_V3, TWO_H200, RECOMMENDED)
    ep = next(f for f in plan.findings if f.dimension == "EP")
    assert ep.verdict == "watch" and ep.link == INFINIBAND_NDR and "busbw" in ep.why
    assert "16 routed experts per rank" in ep.text and "across 2 nodes" in ep.text
    assert not plan.wrong
    idle = next(f for f in plan.findings if f.dimension == "DP idle ranks")
    assert "dummy forwards" in idle.text
    one_node = plan_moe_serving(DEEPSEEK_V3, Cluster(1, 8, get_gpu("H200-141GB")), Layout(dp=8, ep=8))
    ep = next(f for f in one_node.findings if f.dimension == "EP")
    assert ep.verdict == "right" and ep.link == "NVLink (H200-141GB, within a node)"


def test_pipeline_parallelism_splits_the_layers():
    plan = plan_moe_serving(DEEPSEEK_V3, TWO_H200, Layout(tp=8, ep=8, pp=2))
    assert plan.kv_bytes_per_token == 31 * 576 * 2  # the heavier stage's 31 of 61 layers
    assert next(f for f in plan.findings if f.dimension == "PP").link == INFINIBAND_NDR
    full = memory_per_gpu(DEEPSEEK_V3, Layout(tp=8, ep=8), "fp8")
    assert plan.memory["routed experts"] == pytest.approx(full["routed experts"] * 31 / 61)


@pytest.mark.parametrize("layout, message", [
    (Layout(tp=8), "TP x DP x PP = 8 x 1 x 1 = 8 GPUs, but the cluster has 16 (2 nodes x 8 H200-141GB)"),
    (Layout(tp=4, dp=2, pp=4), "= 32 GPUs, but the cluster has 16"),
    (Layout(tp=8, dp=2, ep=32), "EP=32 must divide the 16 GPUs"),
])
def test_layouts_that_cannot_be_built_say_why(layout, message):
    with pytest.raises(LayoutError) as error:
        plan_moe_serving(DEEPSEEK_V3, TWO_H200, layout)
    assert message in str(error.value)
    with pytest.raises(ValueError, match="whole number"):
        Layout(tp=0)


def test_presets_and_checklist():
    verdicts = {name: plan_moe_serving(DEEPSEEK_V3, Cluster(n, g), layout).wrong
                for name, (n, g, layout) in PRESETS.items()}
    assert [name for name, wrong in verdicts.items() if not wrong] == ["DP=16 attention + EP=16 (recommended)"]
    assert [f.dimension for f in verdicts["TP=8 x DP=2 attention + EP=16"]] == ["attention TP and KV"]
    practices = " ".join(name for name, _ in serving_checklist(Cluster(2, 8)))
    for practice in ("PagedAttention", "Continuous batching", "Chunked prefill", "Prefix caching", "one-shot", "busbw"):
        assert practice.lower() in practices.lower()


def test_tp_inside_a_node_without_nvlink_is_flagged_and_named_pcie():
    plan = plan_moe_serving(cluster=Cluster(1, 8, gpu=get_gpu("L4-24GB")), layout=Layout(tp=8), weight_dtype="fp8")
    tp = next(f for f in plan.findings if f.dimension == "TP")
    assert tp.verdict == WATCH and "no NVLink" in tp.text and "PCIe" in tp.link
    assert all("on NVLink" not in f.text for f in plan.findings)


@pytest.mark.parametrize("gpu", ["H100-80GB", "H200-141GB", "A100-80GB", "B200-180GB"])
def test_every_link_follows_the_chosen_gpu(gpu):
    """The TP, EP and checklist lines name the chosen GPU's NVLink at its own bandwidth, never another's."""
    preset = get_gpu(gpu)
    name = f"NVLink ({gpu}, within a node)"
    tp8 = plan_moe_serving(DEEPSEEK_V3, Cluster(1, 8, preset), Layout(tp=8), weight_dtype="fp8")
    tp = next(f for f in tp8.findings if f.dimension == "TP")
    assert tp.link == name and f"({preset.nvlink_bandwidth / 2e9:.0f} GB/s per GPU each way)" in tp.text
    dp8 = plan_moe_serving(DEEPSEEK_V3, Cluster(1, 8, preset), Layout(dp=8, ep=8))
    ep = next(f for f in dp8.findings if f.dimension == "EP")
    assert ep.verdict == "right" and ep.link == name and f"inside one node on {name}" in ep.text
    checklist = " ".join(why for _, why in serving_checklist(Cluster(2, 8, preset)))
    assert f"{name} {preset.nvlink_bandwidth / 2e9:.0f} GB/s" in checklist
    others = {"H100", "H200", "A100", "B200"} - {gpu.split("-")[0]}
    for text in [f.line for f in tp8.findings + dp8.findings] + [checklist]:
        assert not any(other in text for other in others), text


def test_the_default_cluster_is_the_lessons_premise():
    """80 GB GPUs: one node of 8 cannot hold the weights in any layout, two nodes can, with no wrong choice."""
    gpu = get_gpu(DEFAULT_GPU)
    assert gpu.memory_bytes <= 80 * GiB
    one = lightest_plan()
    assert one.cluster.nodes == 1 and one.cluster.gpu == gpu and not one.fits
    assert one.weight_bytes > one.budget_bytes - one.activation_reserve_bytes
    assert "no layout fits, DeepSeek-V3 needs more than one node" in one_node_verdict()
    assert f"{one.weight_bytes / GiB:.1f} GiB" in one_node_verdict()
    two = plan_moe_serving()
    assert two.cluster.name == f"2 nodes x 8 {DEFAULT_GPU}" and two.layout == RECOMMENDED
    assert two.fits and not two.wrong
    assert "fits one node" in one_node_verdict(gpu=get_gpu("H200-141GB"))  # why the default is not an H200


def test_the_lightest_plan_is_lighter_than_every_other_layout():
    cluster = Cluster(1, 8)
    lightest = lightest_plan(cluster=cluster)
    for tp in LAYOUT_SIZES:
        for dp in LAYOUT_SIZES:
            layout = Layout(tp=tp, dp=dp)
            try:
                check_layout(DEEPSEEK_V3, cluster, layout)
            except LayoutError:
                continue
            assert sum(memory_per_gpu(DEEPSEEK_V3, layout).values()) >= lightest.weight_bytes
    assert lightest.layout.tp == 8  # the routed experts split over all 8 GPUs, the rest by TP
    with pytest.raises(LayoutError, match="No layout"):
        lightest_plan(cluster=Cluster(1, 3))


def test_the_model_summary_reads_the_config():
    line = model_summary()
    for fact in ("671B parameters", "36.6B active per token", "61 layers, the first 3 dense",
                 "256 routed experts + 1 shared per layer", "8 routed per token", "512 + 64 = 576 values",
                 "97.4% of the weights"):
        assert fact in line, fact


def test_the_quiz_marks_right_exactly_the_recommended_layouts_choices():
    """Quiz 08's deepseek-layout: tensor parallelism is right only if the recommended layout uses it,
    likewise data-parallel attention and expert parallelism."""
    options = load_bank("08_fused_tp").question("deepseek-layout").options
    right = [o.text.lower() for o in options if o.correct]
    wrong = [o.text.lower() for o in options if not o.correct]
    uses = {"tensor parallelism": RECOMMENDED.tp > 1, "data parallelism for attention": RECOMMENDED.dp > 1,
            "experts spread over the gpus": RECOMMENDED.ep > 1}
    for choice, used in uses.items():
        assert any(choice in text for text in (right if used else wrong)), choice
        assert not any(choice in text for text in (wrong if used else right)), choice


@pytest.mark.parametrize("gpu", ["L4-24GB", "A100-80GB", "H100-80GB", "B200-180GB"])
def test_the_link_between_nodes_is_each_gpus_nic_behind_its_pcie(gpu):
    """A node's NICs hang off PCIe: the network a GPU reaches is its NIC, never faster than its PCIe
    link, and slower than what the GPUs of one node share (the L4 once showed 50 GB/s across nodes
    against 32 inside)."""
    preset = get_gpu(gpu)
    cluster = Cluster(2, 8, preset)
    net, inside = cluster.scale_out, cluster.in_node
    assert net.bandwidth == min(preset.network_bandwidth, preset.pcie_bandwidth)
    assert net.bandwidth < inside.bandwidth and net.alpha_s > inside.alpha_s
    tp = next(f for f in plan_moe_serving(DEEPSEEK_V3, cluster, Layout(tp=16)).findings if f.dimension == "TP")
    assert tp.verdict == "wrong" and tp.link == net.name
    across, within = (float(x) for x in re.findall(r"(\d+) GB/s", tp.text)[:2])
    assert (across, within) == (round(net.bandwidth / 1e9), round(inside.bandwidth / 1e9)) and across < within


def test_a_nic_faster_than_its_pcie_slot_is_capped_by_the_slot():
    fast_nic = dataclasses.replace(get_gpu("L4-24GB"), network_bandwidth=50e9)  # NDR behind PCIe Gen4
    link = Cluster(2, 8, fast_nic).scale_out
    assert link.bandwidth == 32e9 and "behind PCIe at 32 GB/s" in link.name and "NDR" in link.name


def test_pcie_gpus_are_not_told_to_run_one_or_two_shot():
    """vLLM's custom all-reduce serves PCIe groups of 2 only; the sheet says so instead of recommending
    one- or two-shot kernels for a PCIe TP group."""
    l4 = Cluster(2, 8, get_gpu("L4-24GB"))
    checklist = dict(serving_checklist(l4))
    assert not any("one-shot or two-shot" in name.lower() for name in checklist)
    kernels = next(why for name, why in checklist.items() if name.startswith("TP of"))
    assert f"groups of {PCIE_GROUP_MAX} GPUs only" in kernels and "NCCL" in kernels
    tp8 = next(f for f in plan_moe_serving(DEEPSEEK_V3, Cluster(1, 8, get_gpu("L4-24GB")), Layout(tp=8)).findings
               if f.dimension == "TP")
    assert "TP=8 runs NCCL" in tp8.why and f"groups of {PCIE_GROUP_MAX} only" in tp8.why
    assert vllm_all_reduce.custom_limit(PCIE_GROUP_MAX, nvswitch=False) is not None
    assert vllm_all_reduce.custom_limit(4, nvswitch=False) is None
    assert any("one-shot or two-shot" in name.lower() for name, _ in serving_checklist(Cluster(2, 8)))


def test_one_room_figure_in_the_premise_and_the_memory_check():
    """The premise's room (the budget less the activation peak) is the figure the memory check quotes,
    not the bare budget ("71.0 GiB of room" beside "40.2 GiB of 72.0 GiB")."""
    plan = plan_moe_serving(DEEPSEEK_V3, Cluster(2, 8), Layout(tp=16))
    room = f"{plan.room_bytes / GiB:.1f} GiB of room"
    memory = plan.findings[0]
    assert memory.verdict == "right" and room in memory.text and f"{plan.budget_bytes / GiB:.1f} GiB" not in memory.text
    assert room in one_node_verdict()
    assert f"the other {plan.kv_cache_bytes / GiB:.1f} GiB holds {plan.kv_tokens_per_gpu:,} tokens" in memory.text
    rows = dict(memory_rows(plan))
    assert float(rows["KV cache room"]) == pytest.approx(plan.kv_cache_bytes / GiB, abs=0.01)


def test_no_check_passes_with_no_kv_and_counts_are_in_words():
    """With weights that do not fit, DP attention is not a ✔ line of "0 distinct tokens"; one GPU and
    one DP rank are singular."""
    l4 = plan_moe_serving(DEEPSEEK_V3, Cluster(2, 8, get_gpu("L4-24GB")), RECOMMENDED)
    assert l4.kv_tokens_per_gpu == 0
    dp = next(f for f in l4.findings if f.dimension == "DP attention")
    assert dp.verdict == WATCH and "no KV fits" in dp.text
    assert all(not (f.verdict == "right" and re.search(r"\b0 (distinct )?tokens", f.text)) for f in l4.findings)
    with pytest.raises(LayoutError, match=r"= 1 GPU, but"):
        check_layout(DEEPSEEK_V3, Cluster(2, 8), Layout())
    assert "across the 1 DP rank." in kv_summary(plan_moe_serving(DEEPSEEK_V3, Cluster(2, 8), Layout(tp=16)))


def test_fp8_weights_on_a_gpu_without_fp8_tensor_cores_are_flagged():
    """Lesson 09: an A100 has no FP8 tensor cores, so fp8 weights there are weight-only FP8."""
    a100 = plan_moe_serving(DEEPSEEK_V3, Cluster(2, 8, get_gpu("A100-80GB")), RECOMMENDED)
    note = next(f for f in a100.findings if f.dimension == "fp8 weights")
    assert note.verdict == WATCH and "no FP8 tensor cores" in note.text and "W8A16" in note.why
    for gpu, dtype in (("H100-80GB", "fp8"), ("L4-24GB", "fp8"), ("A100-80GB", "bf16")):
        plan = plan_moe_serving(DEEPSEEK_V3, Cluster(2, 8, get_gpu(gpu)), RECOMMENDED, weight_dtype=dtype)
        assert not any(f.dimension == "fp8 weights" for f in plan.findings), (gpu, dtype)


def test_the_quiz_and_the_sheet_give_tp_on_mla_attention_one_verdict():
    """Quiz 08 marks tensor parallelism for attention inside a node wrong; the sheet's TP=8 x DP=2
    preset must count it as a wrong choice too, not only a warning."""
    option = next(o for o in load_bank("08_fused_tp").question("deepseek-layout").options
                  if o.text.lower().startswith("tensor parallelism for attention inside each node"))
    nodes, gpus, layout = PRESETS["TP=8 x DP=2 attention + EP=16"]
    plan = plan_moe_serving(DEEPSEEK_V3, Cluster(nodes, gpus), layout)
    assert not option.correct and layout.tp > 1 and plan.cluster.group_in_node(layout.tp)
    assert [f.dimension for f in plan.wrong] == ["attention TP and KV"]
