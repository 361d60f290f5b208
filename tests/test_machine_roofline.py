"""Measuring this machine's roofs: plausible figures, quickly, usable by the roofline model."""

import time

import pytest

from course_lib.perf.machine import RoofProbes, measure_machine
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
    assert machine.matmul_size >= 256 and machine.threads == 1  # one core's roofs
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
        RoofProbes(copy_bytes=1000)
    with pytest.raises(ValueError, match="min_matmul_s must be positive"):
        RoofProbes(min_matmul_s=0)
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        measure_machine(quick=True, repeats=0)


def test_the_roofs_are_one_cores_cpu_time_and_torch_keeps_its_threads():
    """Timed as the CPU time of one thread, the roofs leave out the time other programs had the
    core: a copy that the clock says took a second, while the thread ran for a tenth of one,
    counts as a tenth. PyTorch's thread count is what it was before."""
    import torch

    from course_lib.perf import one_core

    threads = torch.get_num_threads()
    with one_core.one_thread():
        assert torch.get_num_threads() == 1
        probes = RoofProbes.sized(quick=True)
    assert torch.get_num_threads() == threads
    clock = iter([10.0, 10.1])
    original = one_core.time.thread_time
    try:
        one_core.time.thread_time = lambda: next(clock)
        assert probes.copy_rate() == pytest.approx(2 * probes.copy_bytes / 0.1)
    finally:
        one_core.time.thread_time = original
    machine = probes.roofline([3.0, 1.0, 2.0], [5.0, 40.0, 6.0], 1.0)  # medians: one disturbed repeat moves nothing
    assert (machine.memory_bandwidth, machine.flops, machine.threads) == (2.0, 6.0, 1)
