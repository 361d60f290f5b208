"""KV tiers: reload a prefix's KV from a tier or recompute it, and where the two cross."""

import dataclasses
import math

import pytest

from course_lib.perf.hardware import get_gpu
from course_lib.perf.kv_tiers import (
    COPY_KERNEL_BIDIRECTIONAL_BANDWIDTH,
    CPU_DRAM,
    CPU_DRAM_BUSY,
    DMA_BIDIRECTIONAL_BANDWIDTH,
    GPU_HBM,
    LOCAL_NVME,
    PCIE_GEN5_ONE_WAY,
    POOL_RDMA,
    POOL_TCP,
    TIERS,
    KVTier,
    crossover_tokens,
    get_tier,
    recompute_flops,
    recompute_time,
    reload_bytes,
    reload_time,
    reload_vs_recompute_table,
    tier_on_gpu,
    weight_read_bound_below,
)
from course_lib.perf.models import get_model
from course_lib.perf.roofline import step_cost

H100, LLAMA_8B, LLAMA_70B = get_gpu("H100-80GB"), get_model("Llama-3.1-8B"), get_model("Llama-3.1-70B")
CPU = get_tier(CPU_DRAM)


@pytest.mark.parametrize("tokens", [10_000, 10_100])
def test_worked_example_reload_from_cpu_memory(tokens):
    """'10K tokens of bf16 KV, about 1.3 GB, about 26 ms from CPU memory.'"""
    assert reload_bytes(LLAMA_8B, tokens) == tokens * 2 * 32 * 8 * 128 * 2  # 131,072 B a token
    assert reload_bytes(LLAMA_8B, tokens) / 1e9 == pytest.approx(1.3, abs=0.05)
    assert reload_time(LLAMA_8B, tokens, CPU) == pytest.approx(0.026, abs=0.0005)
    # the bandwidth the example implies: 1.3 GB / 26 ms = 50 GB/s
    assert 1.3e9 / 0.026 == pytest.approx(CPU.bandwidth)


def test_worked_example_recompute_and_the_tenfold_gap():
    """'2 x 8B x 10,100 / 500e12 = 0.32 s, about 0.3 s: reload wins ~10x.'"""
    at_500 = recompute_time(LLAMA_8B, 10_100, H100, flops=500e12)
    assert at_500 == pytest.approx(2 * 8.03e9 * 10_100 / 500e12)
    assert at_500 == pytest.approx(0.32, abs=0.005) and at_500 == pytest.approx(0.3, abs=0.05)
    # the default is the bf16 peak x 0.5 = 494.5 TFLOP/s, close to the example's 500
    assert recompute_time(LLAMA_8B, 10_100, H100) == pytest.approx(0.32, abs=0.01)
    ratio = at_500 / reload_time(LLAMA_8B, 10_100, CPU)
    assert 10 <= ratio < 15  # ~12x: an order of magnitude


def test_cpu_tier_keeps_the_measured_bidirectional_figures_and_derives_one_way():
    assert DMA_BIDIRECTIONAL_BANDWIDTH == 83.4e9 and COPY_KERNEL_BIDIRECTIONAL_BANDWIDTH == 68.5e9
    # one way alone: between half the bidirectional DMA figure and the Gen5 x16 ceiling
    assert DMA_BIDIRECTIONAL_BANDWIDTH / 2 < CPU.bandwidth < PCIE_GEN5_ONE_WAY
    assert CPU.bandwidth == pytest.approx(0.8 * PCIE_GEN5_ONE_WAY, rel=0.03)
    assert get_tier(CPU_DRAM_BUSY).bandwidth == pytest.approx(41.7e9)
    assert "bidirectional" in CPU.source


def test_tiers_are_ordered_from_near_to_far():
    hbm, nvme, rdma, tcp = (get_tier(n) for n in (GPU_HBM, LOCAL_NVME, POOL_RDMA, POOL_TCP))
    assert hbm.resident and reload_time(LLAMA_8B, 100_000, hbm) == 0
    assert 1e9 <= nvme.bandwidth <= 15e9 and nvme.latency_s == pytest.approx(100e-6)
    assert rdma.bandwidth == 50e9 and 10e-6 <= rdma.latency_s < 100e-6
    assert tcp.bandwidth < rdma.bandwidth and tcp.latency_s > rdma.latency_s
    times = [reload_time(LLAMA_8B, 10_000, get_tier(n)) for n in (GPU_HBM, CPU_DRAM, POOL_RDMA, POOL_TCP, LOCAL_NVME)]
    assert times == sorted(times)
    assert all(t.source for t in TIERS.values())


def test_reload_is_linear_and_recompute_is_quadratic_with_attention():
    for n in (1_000, 8_000, 32_000):
        assert reload_time(LLAMA_8B, 2 * n, CPU) - CPU.latency_s == pytest.approx(
            2 * (reload_time(LLAMA_8B, n, CPU) - CPU.latency_s))
        assert recompute_time(LLAMA_8B, 2 * n, H100) == pytest.approx(2 * recompute_time(LLAMA_8B, n, H100))
    growth = [recompute_time(LLAMA_8B, 2 * n, H100, include_attention=True)
              / recompute_time(LLAMA_8B, n, H100, include_attention=True) for n in (1_000, 16_000, 64_000)]
    assert all(2 < g < 4 for g in growth) and growth == sorted(growth)  # tends to 4 once attention dominates
    # attention's term: 4 x layers x heads x head_dim x n (n + 1) / 2, ~2 x layers x hidden x n^2
    n = 10_100
    attention = recompute_flops(LLAMA_8B, n, True) - recompute_flops(LLAMA_8B, n)
    assert attention == 4 * 32 * 32 * 128 * n * (n + 1) / 2
    assert attention == pytest.approx(2 * 32 * LLAMA_8B.hidden_size * n**2, rel=1e-3)
    assert recompute_flops(LLAMA_8B, n, True) == step_cost(LLAMA_8B, H100, [(0, n)]).flops


def test_the_gap_widens_with_context():
    rows = reload_vs_recompute_table(LLAMA_8B, CPU, H100, [256, 1024, 4096, 16_384, 65_536])
    speedups = [r.speedup for r in rows]
    assert speedups == sorted(speedups) and speedups[-1] > 2 * speedups[0]
    gaps = [r.recompute_s - r.reload_s for r in rows]
    assert gaps == sorted(gaps)
    no_attention = reload_vs_recompute_table(LLAMA_8B, CPU, H100, [16, 256, 4096], include_attention=False)
    assert [r.speedup for r in no_attention] == sorted(r.speedup for r in no_attention)


def test_short_prefixes_are_dominated_by_fixed_costs():
    # below ~150-300 tokens an H100 prefill is bound by its 16 GB weight read, not its FLOPs
    assert weight_read_bound_below(LLAMA_8B, H100) == pytest.approx(494.5e12 / 3.35e12)
    assert weight_read_bound_below(LLAMA_8B, H100, utilization=1) == pytest.approx(295, abs=1)
    # a tier's own latency matters only for a handful of tokens: it equals the copy time at
    # latency x bandwidth / KV bytes per token, ~4 tokens from CPU memory, ~5 from NVMe
    for name, most in ((CPU_DRAM, 5), (LOCAL_NVME, 6), (POOL_RDMA, 8), (POOL_TCP, 16)):
        tier = get_tier(name)
        assert 1 < tier.latency_s * tier.bandwidth / 131_072 < most
        assert tier.latency_s / reload_time(LLAMA_8B, 1, tier) > 0.5
        assert tier.latency_s / reload_time(LLAMA_8B, 10_000, tier) < 0.01


def test_crossover_exists_only_for_tiers_with_slow_starts():
    found = {name: crossover_tokens(LLAMA_8B, tier, H100) for name, tier in TIERS.items()}
    # resident, CPU and RDMA: reload wins from the first token
    assert found[GPU_HBM] is None and found[CPU_DRAM] is None and found[CPU_DRAM_BUSY] is None
    assert found[POOL_RDMA] is None
    # NVMe and TCP: a ~100 us start buys recompute the first few tokens
    assert 5 < found[LOCAL_NVME] < 10 and 8 < found[POOL_TCP] < 13
    for name in (LOCAL_NVME, POOL_TCP):
        tier, n = TIERS[name], found[name]
        assert recompute_time(LLAMA_8B, math.floor(n), H100) < reload_time(LLAMA_8B, math.floor(n), tier)
        assert recompute_time(LLAMA_8B, math.ceil(n), H100) > reload_time(LLAMA_8B, math.ceil(n), tier)


def _bisect(model, tier, gpu, include_attention, hi):
    def recompute_wins(n):
        return recompute_time(model, n, gpu, include_attention=include_attention) < reload_time(model, n, tier)
    lo = 1
    assert recompute_wins(lo) and not recompute_wins(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if recompute_wins(mid) else (lo, mid)
    return lo


def test_slow_tier_loses_until_attention_makes_recompute_quadratic():
    slow = KVTier("1 GB/s tier", 1e9, 1e-3)  # 131 us a token against recompute's 32.5
    assert crossover_tokens(LLAMA_8B, slow, H100) is None  # recompute wins everywhere
    assert crossover_tokens(LLAMA_8B, slow, H100, include_attention=True) is None  # ~186K > 131,072
    n = crossover_tokens(LLAMA_8B, slow, H100, include_attention=True, max_tokens=1_000_000)
    assert 150_000 < n < 250_000
    assert math.floor(n) == _bisect(LLAMA_8B, slow, H100, True, 1_000_000)
    # a latency-heavy tier: exact root against bisection
    laggy = KVTier("5 ms tier", 50e9, 5e-3)
    exact = crossover_tokens(LLAMA_8B, laggy, H100, include_attention=True)
    assert math.floor(exact) == _bisect(LLAMA_8B, laggy, H100, True, 10_000)


def test_crossover_moves_the_right_way():
    laggy = KVTier("1 ms tier", 50e9, 1e-3)
    by_latency = [crossover_tokens(LLAMA_8B, dataclasses.replace(laggy, latency_s=s), H100) for s in (1e-3, 2e-3, 4e-3)]
    assert by_latency == sorted(by_latency)  # more latency: recompute wins longer
    by_flops = [crossover_tokens(LLAMA_8B, laggy, H100, flops=f) for f in (300e12, 500e12, 900e12)]
    assert by_flops == sorted(by_flops)  # faster compute: recompute wins longer
    by_bandwidth = [crossover_tokens(LLAMA_8B, dataclasses.replace(laggy, bandwidth=b), H100)
                    for b in (10e9, 50e9, 200e9)]
    assert by_bandwidth == sorted(by_bandwidth, reverse=True)  # faster tier: reload wins sooner
    # a bigger model recomputes per token far slower than it reloads: reload wins sooner
    assert crossover_tokens(LLAMA_70B, laggy, H100) < crossover_tokens(LLAMA_8B, laggy, H100)


def test_times_grow_with_tokens_and_fall_with_faster_hardware():
    lengths = [1, 10, 100, 1_000, 10_000, 100_000]
    for tier in TIERS.values():
        times = [reload_time(LLAMA_8B, n, tier) for n in lengths]
        assert times == sorted(times)
    for attention in (False, True):
        times = [recompute_time(LLAMA_8B, n, H100, include_attention=attention) for n in lengths]
        assert times == sorted(times) and len(set(times)) == len(times)
    assert recompute_time(LLAMA_8B, 1_000, get_gpu("B200-180GB")) < recompute_time(LLAMA_8B, 1_000, H100)
    assert reload_time(LLAMA_8B, 1_000, CPU, kv_dtype="fp8") < reload_time(LLAMA_8B, 1_000, CPU)


def test_table_for_a_widget():
    rows = reload_vs_recompute_table(LLAMA_8B, CPU, H100)
    assert [r.tokens for r in rows] == sorted(r.tokens for r in rows) and rows[-1].tokens <= LLAMA_8B.max_context
    assert 10_100 in [r.tokens for r in rows] and all(r.winner == "reload" for r in rows)
    row = next(r for r in rows if r.tokens == 10_100)
    assert row.reload_s == reload_time(LLAMA_8B, 10_100, CPU)
    assert row.recompute_s == recompute_time(LLAMA_8B, 10_100, H100, include_attention=True)
    assert reload_vs_recompute_table(LLAMA_8B, get_tier(GPU_HBM), H100, [100])[0].speedup == math.inf
    slow = reload_vs_recompute_table(LLAMA_8B, KVTier("slow", 1e9, 1e-3), H100, [4, 1000], include_attention=False)
    assert [r.winner for r in slow] == ["recompute", "recompute"]
    assert [r.tokens for r in reload_vs_recompute_table(LLAMA_8B, CPU, H100, [512, 16, 512])] == [16, 512]


@pytest.mark.parametrize("call, match", [
    (lambda: reload_time(LLAMA_8B, 0, CPU), "tokens must be a whole number"),
    (lambda: reload_time(LLAMA_8B, 10.5, CPU), "tokens must be a whole number"),
    (lambda: reload_time(LLAMA_8B, 100, "CPU"), "tier must be a KVTier"),
    (lambda: reload_time(LLAMA_8B, 100, CPU, kv_dtype="bf17"), "Unknown dtype"),
    (lambda: recompute_time(LLAMA_8B, -5, H100), "tokens must be a whole number"),
    (lambda: recompute_time(LLAMA_8B, 100, H100, flops=0), "flops"),
    (lambda: recompute_time(LLAMA_8B, 100, H100, utilization=1.5), "at most 1"),
    (lambda: crossover_tokens(LLAMA_8B, CPU, H100, max_tokens=0), "max_tokens"),
    (lambda: reload_vs_recompute_table(LLAMA_8B, CPU, H100, []), "at least one prompt length"),
    (lambda: reload_vs_recompute_table(LLAMA_8B, CPU, H100, [100, 0]), "each prompt length"),
    (lambda: KVTier("bad", 0, 1e-6), "bandwidth must be a positive number"),
    (lambda: KVTier("bad", 1e9, -1e-6), "latency_s must be a finite number"),
    (lambda: KVTier("bad", 1e9, math.inf), "latency_s must be a finite number"),
])
def test_bad_inputs_say_what_to_change(call, match):
    with pytest.raises((ValueError, TypeError, KeyError), match=match):
        call()


def test_unknown_tier_lists_the_presets():
    with pytest.raises(KeyError, match="choose one of"):
        get_tier("tape")


def test_the_cpu_tiers_scale_with_the_gpus_pcie_link_and_the_rest_stay():
    l4, a100 = get_gpu("L4-24GB"), get_gpu("A100-40GB")
    for gpu in (l4, a100):
        for name in (CPU_DRAM, CPU_DRAM_BUSY):
            tier = tier_on_gpu(get_tier(name), gpu)
            assert "PCIe Gen4" in tier.name and "Gen5" not in tier.name
            assert tier.bandwidth == get_tier(name).bandwidth * gpu.pcie_bandwidth / PCIE_GEN5_ONE_WAY
            assert tier.latency_s == get_tier(name).latency_s and "Scaled by 0.5" in tier.source
        for name in (GPU_HBM, LOCAL_NVME, POOL_RDMA, POOL_TCP):
            assert tier_on_gpu(get_tier(name), gpu) == get_tier(name)
    assert all(tier_on_gpu(tier, H100) is tier for tier in TIERS.values())  # the presets are an H100's
    with pytest.raises(TypeError, match="KVTier"):
        tier_on_gpu(CPU_DRAM, l4)
