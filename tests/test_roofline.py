import random

import pytest

from course_lib.perf.hardware import GPUS, get_gpu
from course_lib.perf.models import MODELS, get_model
from course_lib.perf.roofline import AT_THE_ROOFS, Efficiency, reachable_ridge_point, ridge_point, step_cost

H100, LLAMA = get_gpu("H100-80GB"), get_model("Llama-3-8B")
EXACT = Efficiency(compute=1.0, memory=1.0, overhead_s=0.0)


def test_single_decode_is_memory_bound_and_matches_a_hand_count():
    cost = step_cost(LLAMA, H100, [(1000, 1)], efficiency=EXACT)
    pairs = 1001
    assert cost.flops == pytest.approx(2 * 8.03e9 + 4 * 32 * 32 * 128 * pairs)
    assert cost.bytes == pytest.approx(8.03e9 * 2 + 131072 * 1002)  # weights + context read + one token written
    assert cost.memory_s == pytest.approx(cost.bytes / 3.35e12)  # about 4.8 ms
    assert cost.bound == "memory" and cost.arithmetic_intensity < 2


def test_long_prefill_is_compute_bound():
    cost = step_cost(LLAMA, H100, [(0, 4096)], efficiency=EXACT)
    assert cost.flops == pytest.approx(2 * 8.03e9 * 4096 + 4 * 32 * 32 * 128 * (4096 * 4097 // 2))
    assert cost.compute_s == pytest.approx(cost.flops / 989e12)
    assert cost.bound == "compute" and cost.arithmetic_intensity > 1000


def test_batching_decodes_amortises_the_weight_reads():
    one = step_cost(LLAMA, H100, [(1000, 1)])
    many = step_cost(LLAMA, H100, [(1000, 1)] * 64)
    assert many.time_s < 3 * one.time_s  # 64x the tokens for well under 3x the time
    assert many.time_s / 64 < one.time_s / 20


def test_efficiency_overhead_and_fp8_roofs():
    base = step_cost(LLAMA, H100, [(0, 4096)], efficiency=EXACT)
    half = step_cost(LLAMA, H100, [(0, 4096)], efficiency=Efficiency(compute=0.5, memory=1.0, overhead_s=0.001))
    assert half.time_s == pytest.approx(2 * base.time_s + 0.001)
    fp8 = step_cost(LLAMA, H100, [(0, 4096)], dtype="fp8", efficiency=EXACT)
    assert fp8.compute_s == pytest.approx(fp8.flops / 1979e12) and fp8.bytes < base.bytes
    a100_fp8 = step_cost(LLAMA, get_gpu("A100-80GB"), [(0, 4096)], dtype="fp8", efficiency=EXACT)
    assert a100_fp8.compute_s == pytest.approx(a100_fp8.flops / 312e12)  # no fp8 cores: the bf16 roof
    with pytest.raises(ValueError):
        Efficiency(compute=0)


def test_moe_multiplies_only_active_parameters_but_reads_all_weights():
    mixtral = get_model("Mixtral-8x7B")
    cost = step_cost(mixtral, H100, [(0, 1)], efficiency=EXACT)
    assert cost.flops == pytest.approx(2 * 12.9e9 + 4 * 32 * 32 * 128 * 1)
    assert cost.bytes == pytest.approx(46.7e9 * 2 + 131072 * 2)


def test_the_reachable_ridge_is_the_peaks_ridge_times_the_efficiencies():
    assert ridge_point(H100) == pytest.approx(989e12 / 3.35e12)  # 295 FLOP/byte
    assert reachable_ridge_point(H100) == pytest.approx(989e12 * 0.5 / (3.35e12 * 0.8))  # 184.5 FLOP/byte
    assert reachable_ridge_point(H100, efficiency=AT_THE_ROOFS) == ridge_point(H100)
    assert reachable_ridge_point(H100, "fp8") == pytest.approx(1979e12 * 0.5 / (3.35e12 * 0.8))


@pytest.mark.parametrize("efficiency", [Efficiency(), AT_THE_ROOFS, Efficiency(compute=0.9, memory=0.6)],
                         ids=["default", "at the roofs", "compute 90%, memory 60%"])
def test_bound_is_the_intensity_against_the_ridge_of_the_roofs_the_step_runs_against(efficiency):
    """One definition of compute-bound: intensity at or above the ridge. The label the cost model
    derives from its times agrees with it, for every GPU, model and dtype, on steps from a batch-1
    decode to long prefills."""
    rng, checked = random.Random(4), 0
    for _ in range(400):
        gpu, model, dtype = get_gpu(rng.choice(list(GPUS))), get_model(rng.choice(list(MODELS))), rng.choice(["bf16", "fp8"])
        requests = [(rng.choice([0, rng.randint(1, 8000)]), rng.choice([1, rng.randint(1, 4096)]))
                    for _ in range(rng.randint(1, 300))]
        cost, ridge = step_cost(model, gpu, requests, dtype, efficiency), reachable_ridge_point(gpu, dtype, efficiency)
        if abs(cost.arithmetic_intensity / ridge - 1) < 1e-9:
            continue  # exactly at the ridge rounding decides; never the case for these steps
        assert cost.bound == ("compute" if cost.arithmetic_intensity >= ridge else "memory")
        checked += 1
    assert checked == 400


def test_a_step_between_the_ridges_is_compute_bound_at_the_reachable_roofs_and_memory_bound_at_the_peaks():
    """A 190-token prefill of Llama-3.1-8B on an H100: 190 FLOP/byte, between 184.5 and 295."""
    model = get_model("Llama-3.1-8B")
    reachable, peaks = (step_cost(model, H100, [(0, 190)], efficiency=e) for e in (Efficiency(), AT_THE_ROOFS))
    assert reachable_ridge_point(H100) < reachable.arithmetic_intensity < ridge_point(H100)
    assert reachable.bound == "compute" and peaks.bound == "memory"
