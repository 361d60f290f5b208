"""Measuring this machine's roofs: plausible figures, quickly, usable by the roofline model."""

import time

import pytest

from course_lib.perf.machine import measure_machine, measure_matmul_flops, measure_memory_bandwidth
from course_lib.perf.models import get_model
from course_lib.perf.roofline import ridge_point, step_cost


@pytest.fixture(scope="module")
def quick_measurement():
    started = time.perf_counter()
    machine = measure_machine(quick=True)
    return machine, time.perf_counter() - started


def test_quick_measurement_is_plausible_and_fast(quick_measurement):
    machine, seconds = quick_measurement
    assert 0.1e9 < machine.memory_bandwidth < 10e12  # bytes/s: a laptop to an HBM GPU and beyond
    assert 1e8 < machine.flops < 1e15  # FLOP/s: an old CPU core to a big accelerator
    assert machine.ridge_point == pytest.approx(machine.flops / machine.memory_bandwidth) and machine.ridge_point > 0
    assert machine.matmul_size >= 256 and machine.threads >= 1
    assert seconds < 10 and machine.seconds <= seconds


def test_the_machine_drops_into_the_roofline_model(quick_measurement):
    machine, _ = quick_measurement
    cpu = machine.as_gpu()
    assert ridge_point(cpu) == pytest.approx(machine.ridge_point)
    model = get_model("Llama-3.1-8B")
    decode, prefill = step_cost(model, cpu, [(1000, 1)]), step_cost(model, cpu, [(0, 4096)])
    assert decode.bound == "memory" and prefill.bound == "compute"
    assert decode.arithmetic_intensity < ridge_point(cpu) < prefill.arithmetic_intensity


def test_ridge_point_of_the_h100_preset():
    from course_lib.perf.hardware import get_gpu

    h100 = get_gpu("H100-80GB")
    assert ridge_point(h100) == pytest.approx(989e12 / 3.35e12)  # about 295 FLOPs per byte
    assert ridge_point(h100, "fp8") == pytest.approx(2 * ridge_point(h100), rel=0.01)


def test_measurements_reject_settings_that_cannot_measure():
    with pytest.raises(ValueError, match="at least 1 MiB"):
        measure_memory_bandwidth(copy_bytes=1000)
    with pytest.raises(ValueError, match="min_matmul_s must be positive"):
        measure_matmul_flops(min_matmul_s=0)
