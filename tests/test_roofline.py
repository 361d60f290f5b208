import pytest

from course_lib.perf.hardware import get_gpu
from course_lib.perf.models import get_model
from course_lib.perf.roofline import Efficiency, step_cost

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
