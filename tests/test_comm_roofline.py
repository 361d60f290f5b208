"""The communication roofline: DDP gradient all-reduce vs backward, TP all-reduces per layer,
and the TP=16-across-two-nodes spot-the-bug at equal concurrency, against hand-computed numbers."""

import math

import pytest

from course_lib.perf.comm_roofline import (
    DDP_BUCKET_BYTES,
    ddp_step,
    ddp_sweep,
    parallel_layout,
    stage_handoff_s,
    tp_layer,
    two_node_layouts,
)
from course_lib.perf.interconnect import INFINIBAND_NDR, NVLINK_4
from course_lib.perf.topology import ALL_REDUCES
from course_lib.perf.units import MiB

H100_BF16, H100_HBM = 989e12, 3.35e12
NV, IB = 450e9, 50e9
KV_70B = 2 * 80 * 8 * 128 * 2  # bytes per token: K and V, 80 layers, 8 KV heads of 128, bf16
RINGS_2X8 = 28 * 1e-6 + 2 * 5e-6  # NCCL's rings on 2 x 8: 2(N-M) NVLink hops, 2(M-1) InfiniBand ones


def test_ddp_step_on_two_nodes_by_hand():
    step = ddp_step(16)  # Llama-3.2-1B, 4096 tokens per GPU, half of the H100's bf16 peak, bf16 gradients
    compute = 6 * 1.24e9 * 4096 / (H100_BF16 * 0.5)
    grads = 2 * 1.24e9
    buckets = math.ceil(grads / (25 * MiB))
    assert step.num_buckets == buckets == 95 and step.link == INFINIBAND_NDR
    assert step.all_reduce == "nccl rings" and step.grad_bytes == grads
    assert step.compute_s == pytest.approx(compute)
    assert step.latency_s == pytest.approx(buckets * RINGS_2X8)  # 28 NVLink and 2 InfiniBand hops per bucket
    # 8 rings, one per NIC: 8 x 50 = 400 GB/s, a little below NVLink's 450
    assert step.comm_s == pytest.approx(buckets * RINGS_2X8 + 2 * 15 / 16 * grads / (8 * IB))
    assert step.backward_s == pytest.approx(compute * 2 / 3) and step.hidden and step.step_s == compute
    one_nic = ddp_step(16, nics_per_node=1)
    assert one_nic.comm_s == pytest.approx(buckets * RINGS_2X8 + 2 * 15 / 16 * grads / IB) and not one_nic.hidden
    assert one_nic.step_s == pytest.approx(compute / 3 + one_nic.comm_s)
    assert one_nic.tokens_per_s_per_gpu == pytest.approx(4096 / one_nic.step_s)


def test_fp32_gradients_double_the_bytes():
    bf16, fp32 = ddp_step(64), ddp_step(64, grad_bytes_per_param=4)  # plain DDP under autocast: fp32 grads
    assert fp32.grad_bytes == 2 * bf16.grad_bytes and fp32.num_buckets == 2 * bf16.num_buckets
    assert fp32.comm_s - fp32.latency_s == pytest.approx(2 * (bf16.comm_s - bf16.latency_s))


def test_one_node_hides_its_all_reduce_behind_backward():
    step = ddp_step(8)
    assert step.link == NVLINK_4 and step.hidden
    assert step.step_s == step.compute_s and step.scaling_efficiency == 1


def test_with_a_nic_per_gpu_the_collapse_is_the_rings_latency():
    sweep = ddp_sweep()
    assert [s.num_gpus for s in sweep] == [8, 16, 32, 64, 128, 256, 512]
    per_gpu = [s.tokens_per_s_per_gpu for s in sweep]
    assert per_gpu == sorted(per_gpu, reverse=True)
    bandwidth = [s.comm_s - s.latency_s for s in sweep]
    assert bandwidth[1] < 1.25 * bandwidth[0] and bandwidth[-1] < 1.1 * bandwidth[1]  # hardly drops
    assert sweep[3].scaling_efficiency == 1 and 0.3 < sweep[-1].scaling_efficiency < 0.4  # 64 fine, 512 at 35%
    latency_share = [s.latency_s / s.comm_s for s in sweep]
    assert latency_share == sorted(latency_share) and latency_share[-1] > 0.9  # 2(N-M) + 2(M-1) alphas grow
    assert sweep[-1].latency_s == pytest.approx(95 * (896 * 1e-6 + 126 * 5e-6))  # 64 nodes


def test_with_one_nic_per_node_the_bandwidth_collapses_at_the_boundary():
    sweep = ddp_sweep(nics_per_node=1)
    bandwidth = [s.comm_s - s.latency_s for s in sweep]
    assert bandwidth[1] > 9 * bandwidth[0]  # 50 GB/s against NVLink's 450
    assert 0.4 < sweep[1].scaling_efficiency < 0.6 and sweep[-1].scaling_efficiency < 0.25
    single = ddp_sweep(all_reduce="flat ring")  # one ring's NIC: the same bandwidth, lock-step latency
    assert [s.comm_s - s.latency_s for s in sweep] == pytest.approx([s.comm_s - s.latency_s for s in single])
    assert all(r.latency_s <= s.latency_s for r, s in zip(sweep, single))


def test_trees_keep_the_latency_down_at_scale():
    grads, buckets = 2 * 1.24e9, 95
    step = ddp_step(512, all_reduce="tree")  # 64 nodes: a chain of 8 and 6 levels of tree, each way
    assert step.latency_s == pytest.approx(buckets * (14 * 1e-6 + 12 * 5e-6))
    assert step.comm_s == pytest.approx(step.latency_s + 2 * grads / (8 * IB))
    assert all(s.hidden for s in ddp_sweep(all_reduce="tree"))
    assert not ddp_sweep(all_reduce="tree", nics_per_node=1)[1].hidden  # trees do not add bandwidth


def test_smaller_buckets_pay_more_latency():
    big, small = ddp_step(64, bucket_bytes=4 * DDP_BUCKET_BYTES), ddp_step(64, bucket_bytes=DDP_BUCKET_BYTES / 4)
    assert small.num_buckets > big.num_buckets and small.latency_s > big.latency_s
    assert small.comm_s - small.latency_s == pytest.approx(big.comm_s - big.latency_s)  # same bytes


def test_more_tokens_per_gpu_hide_more_communication():
    ratios = [ddp_step(32, tokens_per_gpu=t).comm_s / ddp_step(32, tokens_per_gpu=t).backward_s
              for t in (1024, 4096, 65536)]
    assert ratios == sorted(ratios, reverse=True)


def test_tp_layer_all_reduces_by_hand():
    activations = 64 * 8192 * 2  # 64 decode tokens x hidden x bf16 = 1 MiB
    inside = tp_layer(8, 64)
    assert inside.all_reduce_s == pytest.approx(2 * (14 * 1e-6 + 2 * 7 / 8 * activations / NV))
    spanning = tp_layer(16, 64)  # NCCL's rings: 8 NICs per node, 28 NVLink and 2 InfiniBand hops
    assert spanning.link == INFINIBAND_NDR
    assert spanning.all_reduce_s == pytest.approx(2 * (RINGS_2X8 + 2 * 15 / 16 * activations / (8 * IB)))
    assert spanning.comm_share > 0.6 > 0.3 > inside.comm_share
    single = tp_layer(16, 64, all_reduce="flat ring")
    assert single.all_reduce_s == pytest.approx(2 * (30 * 5e-6 + 2 * 15 / 16 * activations / IB))


def test_tp_layer_compute_is_the_bandwidth_roof_for_decode():
    # weights + KV of 64 sequences (1024 cached + 1 new each, read once, plus the new tokens written)
    moved = 70.6e9 * 2 + KV_70B * (64 * 1025 + 64)
    assert tp_layer(8, 64).compute_s == pytest.approx(moved / (8 * H100_HBM * 0.8) / 80)
    # at TP=16 the 8 KV heads are replicated: the KV bytes per GPU stop shrinking
    replicated = 70.6e9 * 2 + 2 * KV_70B * (64 * 1025 + 64)
    assert tp_layer(16, 64).compute_s == pytest.approx(replicated / (16 * H100_HBM * 0.8) / 80)


def test_every_layout_serves_the_same_sequences():
    layouts = {(l.phase, l.name): l for l in two_node_layouts()}
    assert set(name for _, name in layouts) == {"TP=16", "TP=8 x PP=2", "TP=8 x DP=2"}
    for phase, total in (("decode", 128), ("prefill", 4096)):
        wide, fixed, replicas = (layouts[phase, name] for name in ("TP=16", "TP=8 x PP=2", "TP=8 x DP=2"))
        assert wide.total_tokens == fixed.total_tokens == replicas.total_tokens == total
        assert (wide.num_tokens, fixed.num_tokens, replicas.num_tokens) == (total, total // 2, total // 2)
        assert wide.tp_link == INFINIBAND_NDR and fixed.tp_link == NVLINK_4 and fixed.pp_link == INFINIBAND_NDR
        assert fixed.compute_s == pytest.approx(replicas.compute_s)  # two half-models in turn, or one whole
        for layout in (wide, fixed, replicas):
            assert layout.tokens_per_s == pytest.approx(total / layout.latency_s)


def test_prefill_splits_into_prompts():
    wide = parallel_layout(16, phase="prefill", num_tokens=4096, context_tokens=0)  # 2 prompts, one batch
    pairs = 2 * 2048 * 2049 // 2
    flops = 2 * 70.6e9 * 4096 + 4 * 80 * 64 * 128 * pairs
    assert wide.compute_s == pytest.approx(flops / (16 * H100_BF16 * 0.5))
    fixed = parallel_layout(8, pp=2, phase="prefill", num_tokens=4096, context_tokens=0)  # a prompt per micro-batch
    assert fixed.compute_s == pytest.approx(flops / 2 / (8 * H100_BF16 * 0.5))  # one prompt, 8 GPUs at a time


def test_tp16_across_nodes_loses_to_its_all_reduces():
    def ratios(all_reduce):
        layouts = {(l.phase, l.name): l for l in two_node_layouts(all_reduce=all_reduce)}
        return {phase: layouts[phase, "TP=8 x PP=2"].tokens_per_s / layouts[phase, "TP=16"].tokens_per_s
                for phase in ("decode", "prefill")}
    wide = next(l for l in two_node_layouts() if l.name == "TP=16" and l.phase == "decode")
    assert wide.tp_comm_s > 1.4 * wide.compute_s  # 160 all-reduces, each 38 us of latency and more
    rings = ratios("nccl rings")
    assert 1.2 < rings["decode"] < 1.25 and 1.3 < rings["prefill"] < 1.4
    tree = ratios("tree")  # 24 us per all-reduce: decode nearly even, prefill's bytes still cost
    assert 1 < tree["decode"] < 1.02 and 1.25 < tree["prefill"] < 1.3
    hierarchical = ratios("hierarchical")
    assert 1 < hierarchical["decode"] < 1.1 and hierarchical["prefill"] > 1.45


def test_pipeline_costs_by_hand():
    fixed = parallel_layout(8, pp=2)  # 128 sequences: two micro-batches of 64
    activations = 64 * 8192 * 2
    gather = 7 * 1e-6 + 7 / 8 * activations / NV  # the receiving node's all-gather over NVLink
    # one boundary: each rank sends its 1/8 through its own NIC, then the all-gather
    assert fixed.pp_comm_s == pytest.approx(5e-6 + activations / 8 / IB + gather)
    assert fixed.tp_comm_s == pytest.approx(80 * tp_layer(8, 64).all_reduce_s)
    assert fixed.batches_in_flight == 2 and fixed.busy_share_one_batch == 0.5
    assert fixed.tokens_per_s == pytest.approx(2 * 64 / fixed.latency_s)
    one_nic = parallel_layout(8, pp=2, nics_per_node=1)  # the 8 ranks' eighths go through it in turn
    assert one_nic.pp_comm_s == pytest.approx(5e-6 + activations / IB + gather)
    two_nics = parallel_layout(8, pp=2, nics_per_node=2)
    assert two_nics.pp_comm_s == pytest.approx(5e-6 + 4 * activations / 8 / IB + gather)
    in_node = parallel_layout(4, pp=2)  # both stages in one node: NVLink sends of 1/4, an all-gather of 4
    assert in_node.pp_link == NVLINK_4
    assert in_node.pp_comm_s == pytest.approx(1e-6 + activations / 4 / NV + 3 * 1e-6 + 3 / 4 * activations / NV)
    assert parallel_layout(8).pp_link == ""


def test_stage_handoffs_by_hand():
    assert stage_handoff_s(MiB, 1, across_nodes=True) == pytest.approx(5e-6 + MiB / IB)  # no all-gather
    assert stage_handoff_s(MiB, 1, across_nodes=False) == pytest.approx(1e-6 + MiB / NV)
    # a stage of 16 over two nodes: 8 ranks per node send on their own NICs; NCCL's rings all-gather
    wide = 5e-6 + MiB / 16 / IB + 14 * 1e-6 + 5e-6 + 15 / 16 * MiB / (8 * IB)
    assert stage_handoff_s(MiB, 16, across_nodes=True) == pytest.approx(wide)


def test_a_hierarchical_all_reduce_narrows_the_gap():
    rings = parallel_layout(16, num_tokens=64)
    hierarchical = parallel_layout(16, num_tokens=64, all_reduce="hierarchical")
    assert hierarchical.tp_comm_s < rings.tp_comm_s / 1.3 and hierarchical.compute_s == rings.compute_s
    one_node = [parallel_layout(8, num_tokens=64, all_reduce=a).tp_comm_s for a in ALL_REDUCES]
    assert one_node == pytest.approx([one_node[0]] * len(ALL_REDUCES))


@pytest.mark.parametrize("call, message", [
    (lambda: ddp_step(12), "multiple of 8"),
    (lambda: ddp_step(8, compute_efficiency=1.5), "at most 1"),
    (lambda: ddp_step(8, tokens_per_gpu=0), "tokens_per_gpu"),
    (lambda: parallel_layout(8, pp=3), "divide .* 80 layers"),
    (lambda: parallel_layout(3), "divide .* 64 attention heads"),
    (lambda: parallel_layout(1), "do not fit"),
    (lambda: parallel_layout(8, phase="train"), "'decode' or 'prefill'"),
    (lambda: parallel_layout(8, all_reduce="ring"), "all_reduce must be one of"),
    (lambda: ddp_step(16, all_reduce="ring"), "all_reduce must be one of"),
    (lambda: ddp_step(16, nics_per_node=3), "must divide gpus_per_node"),
    (lambda: ddp_step(8, grad_bytes_per_param=0), "grad_bytes_per_param"),
    (lambda: parallel_layout(8, pp=2, num_tokens=3), "2 equal batches"),
    (lambda: parallel_layout(8, phase="prefill", num_tokens=3000), "prompts of 2048"),
    (lambda: tp_layer(8, 64, context_tokens=-1), "context_tokens"),
])
def test_bad_arguments_say_what_to_change(call, message):
    with pytest.raises(ValueError, match=message):
        call()
