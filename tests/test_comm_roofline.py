"""The communication roofline: DDP gradient all-reduce vs backward, TP all-reduces per layer,
and the TP=16-across-two-nodes spot-the-bug, against hand-computed numbers."""

import math

import pytest

from course_lib.perf.comm_roofline import (
    DDP_BUCKET_BYTES,
    ddp_step,
    ddp_sweep,
    parallel_layout,
    tp_layer,
    two_node_layouts,
)
from course_lib.perf.interconnect import INFINIBAND_NDR, NVLINK_4
from course_lib.perf.units import MiB

H100_BF16, H100_HBM = 989e12, 3.35e12
NV, IB = 450e9, 50e9
KV_70B = 2 * 80 * 8 * 128 * 2  # bytes per token: K and V, 80 layers, 8 KV heads of 128, bf16


def test_ddp_step_on_two_nodes_by_hand():
    step = ddp_step(16)  # Llama-3.2-1B, 4096 tokens per GPU, half of the H100's bf16 peak
    compute = 6 * 1.24e9 * 4096 / (H100_BF16 * 0.5)
    grads = 2 * 1.24e9
    buckets = math.ceil(grads / (25 * MiB))
    assert step.num_buckets == buckets == 95 and step.link == INFINIBAND_NDR
    assert step.compute_s == pytest.approx(compute)
    assert step.latency_s == pytest.approx(buckets * 30 * 5e-6)  # 2(N-1) InfiniBand hops per bucket
    assert step.comm_s == pytest.approx(buckets * 30 * 5e-6 + 2 * 15 / 16 * grads / IB)
    assert step.backward_s == pytest.approx(compute * 2 / 3) and not step.hidden
    assert step.step_s == pytest.approx(compute / 3 + step.comm_s)
    assert step.tokens_per_s_per_gpu == pytest.approx(4096 / step.step_s)


def test_one_node_hides_its_all_reduce_behind_backward():
    step = ddp_step(8)
    assert step.link == NVLINK_4 and step.hidden
    assert step.step_s == step.compute_s and step.scaling_efficiency == 1


def test_throughput_per_gpu_collapses_from_8_to_512():
    sweep = ddp_sweep()
    assert [s.num_gpus for s in sweep] == [8, 16, 32, 64, 128, 256, 512]
    per_gpu = [s.tokens_per_s_per_gpu for s in sweep]
    assert per_gpu == sorted(per_gpu, reverse=True)
    assert 0.4 < sweep[1].scaling_efficiency < 0.6  # the jump from NVLink to InfiniBand
    assert sweep[-1].scaling_efficiency < 0.15
    latency_share = [s.latency_s / s.comm_s for s in sweep[1:]]
    assert latency_share == sorted(latency_share) and latency_share[-1] > 0.5  # 2(N-1) alpha grows with N


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
    spanning = tp_layer(16, 64)
    assert spanning.link == INFINIBAND_NDR
    assert spanning.all_reduce_s == pytest.approx(2 * (30 * 5e-6 + 2 * 15 / 16 * activations / IB))
    assert spanning.comm_share > 0.8 > inside.comm_share


def test_tp_layer_compute_is_the_bandwidth_roof_for_decode():
    # weights + KV of 64 sequences (1024 cached + 1 new each, read once, plus the new tokens written)
    moved = 70.6e9 * 2 + KV_70B * (64 * 1025 + 64)
    assert tp_layer(8, 64).compute_s == pytest.approx(moved / (8 * H100_HBM * 0.8) / 80)
    # at TP=16 the 8 KV heads are replicated: the KV bytes per GPU stop shrinking
    replicated = 70.6e9 * 2 + 2 * KV_70B * (64 * 1025 + 64)
    assert tp_layer(16, 64).compute_s == pytest.approx(replicated / (16 * H100_HBM * 0.8) / 80)


def test_tp16_across_nodes_loses_to_tp8_times_pp2():
    layouts = {(l.phase, l.name): l for l in two_node_layouts()}
    assert set(name for _, name in layouts) == {"TP=16", "TP=8 x PP=2", "TP=8 x DP=2"}
    for phase in ("decode", "prefill"):
        wide, fixed = layouts[phase, "TP=16"], layouts[phase, "TP=8 x PP=2"]
        assert wide.tp_link == INFINIBAND_NDR and fixed.tp_link == NVLINK_4 and fixed.pp_link == INFINIBAND_NDR
        assert wide.tp_comm_s > wide.compute_s  # every layer waits on InfiniBand
        assert wide.latency_s > 2.5 * fixed.latency_s and fixed.tokens_per_s > 3 * wide.tokens_per_s
        assert fixed.compute_s == pytest.approx(layouts[phase, "TP=8 x DP=2"].compute_s)  # two halves, in turn


def test_pipeline_costs_by_hand():
    fixed = parallel_layout(8, pp=2, num_tokens=64)
    assert fixed.pp_comm_s == pytest.approx(5e-6 + 64 * 8192 * 2 / IB)  # one boundary, over InfiniBand
    assert fixed.tp_comm_s == pytest.approx(80 * tp_layer(8, 64).all_reduce_s)
    assert fixed.batches_in_flight == 2 and fixed.busy_share_one_batch == 0.5
    assert fixed.tokens_per_s == pytest.approx(2 * 64 / fixed.latency_s)
    assert parallel_layout(4, pp=2).pp_link == NVLINK_4  # both stages in one node


def test_a_hierarchical_all_reduce_narrows_the_gap():
    flat = parallel_layout(16, num_tokens=64)
    hierarchical = parallel_layout(16, num_tokens=64, all_reduce="hierarchical")
    assert hierarchical.tp_comm_s < flat.tp_comm_s / 5 and hierarchical.compute_s == flat.compute_s
    one_node = [parallel_layout(8, num_tokens=64, all_reduce=a).tp_comm_s for a in ("flat ring", "hierarchical")]
    assert one_node[0] == pytest.approx(one_node[1])


@pytest.mark.parametrize("call, message", [
    (lambda: ddp_step(12), "multiple of 8"),
    (lambda: ddp_step(8, compute_efficiency=1.5), "at most 1"),
    (lambda: ddp_step(8, tokens_per_gpu=0), "tokens_per_gpu"),
    (lambda: parallel_layout(8, pp=3), "divide .* 80 layers"),
    (lambda: parallel_layout(3), "divide .* 64 attention heads"),
    (lambda: parallel_layout(1), "do not fit"),
    (lambda: parallel_layout(8, phase="train"), "'decode' or 'prefill'"),
    (lambda: parallel_layout(8, all_reduce="tree"), "all_reduce must be one of"),
    (lambda: tp_layer(8, 64, context_tokens=-1), "context_tokens"),
])
def test_bad_arguments_say_what_to_change(call, message):
    with pytest.raises(ValueError, match=message):
        call()
