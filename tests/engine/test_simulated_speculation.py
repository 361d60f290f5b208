"""Speculative decoding in simulated mode: the real scheduler charges and rolls back the drafts,
acceptance follows the given rate, and the roofline clock shows where speculation stops paying."""

import random

import pytest

from course_lib.engine.simulated import SimulatedEngine
from course_lib.engine.simulated_speculation import SimulatedSpeculation
from course_lib.engine.speculation_sweep import speculation_qps_sweep, tensor_parallel_overhead_s
from course_lib.perf.hardware import get_gpu, tensor_parallel_group
from course_lib.perf.models import get_model
from course_lib.perf.roofline import Efficiency, step_cost
from course_lib.perf.serving import expected_tokens_per_step
from course_lib.perf.workloads import poisson

MODEL, GPU = get_model("Llama-3.1-8B"), get_gpu("H100-80GB")
DRAFT = get_model("Llama-3.2-1B")


def run(speculation, workload, **settings):
    engine = SimulatedEngine(MODEL, GPU, max_model_len=4096, speculation=speculation, **settings)
    return engine, engine.run(workload)


def test_every_request_gets_all_its_tokens_and_no_block_leaks():
    workload = poisson(60, 20, mean_prompt=200, mean_output=80, seed=1)
    engine, report = run(SimulatedSpeculation(4, 0.7, DRAFT), workload, num_gpu_blocks=120)
    assert report.output_tokens == sum(item.output_len for item in workload)
    assert engine.kv.block_pool.num_free_blocks == len(engine.kv.block_pool.blocks)
    assert report.preemptions > 0  # 120 blocks of 16 tokens: the rollback had to coexist with preemption


def test_measured_tokens_per_step_follows_the_formula():
    workload = poisson(80, 4, mean_prompt=100, mean_output=300, seed=2)
    for k, a in ((2, 0.5), (4, 0.8)):
        _, report = run(SimulatedSpeculation(k, a, None, seed=k), workload)
        stats = report.spec_decode_stats
        assert stats.num_drafts > 5000
        assert stats.mean_tokens_per_step == pytest.approx(expected_tokens_per_step(a, k), rel=0.03)
        assert stats.conditional_acceptance_rate == pytest.approx(a, abs=0.02)


def test_a_drafter_that_is_never_right_only_costs():
    workload = poisson(30, 2, mean_prompt=100, mean_output=60, seed=3)
    _, off = run(None, workload)
    _, useless = run(SimulatedSpeculation(3, 0.0, DRAFT), workload)
    assert useless.spec_decode_stats.mean_tokens_per_step == 1.0
    assert useless.duration_s > off.duration_s
    assert useless.tokens_computed > off.tokens_computed  # every draft was charged, then rolled back


def test_a_draft_model_pays_its_own_per_pass_overhead_in_the_sweep():
    """The draft's passes cost the all-reduces of its 16 layers, not the 80-layer target's."""
    draft_only = SimulatedSpeculation(1, 0.5, DRAFT, draft_efficiency=Efficiency(overhead_s=0.002))
    zero = Efficiency(overhead_s=0.0)
    pure = step_cost(DRAFT, GPU, [(100, 1)], "bf16", zero).time_s
    assert draft_only.draft_time_s(GPU, [(100, 1)], "bf16", zero) == pytest.approx(pure + 0.002)
    assert tensor_parallel_overhead_s(DRAFT, 4) < tensor_parallel_overhead_s(get_model("Llama-3.1-70B"), 4) / 2


def test_median_tpot_and_time_averages():
    from course_lib.engine.simulated import SimulatedStep, SimulationReport
    from course_lib.engine.speculation_sweep import median_tpot_ms, time_average

    report = SimulationReport([SimulatedStep(1.0, 1.0, {}, 2, 0, 0.0, 0, "memory"),
                               SimulatedStep(4.0, 3.0, {}, 6, 0, 0.0, 0, "compute", draft_s=1.0),
                               SimulatedStep(9.0, 5.0, {}, 1, 0, 0.0, 0, "memory")],
                              itl_per_request=[[0.01, 0.03], [0.05], []])
    assert median_tpot_ms(report) == pytest.approx(35.0)  # per-request means 20 ms and 50 ms
    assert time_average(report, lambda step: step.num_running, until_s=4.0) == pytest.approx((2 * 1 + 6 * 3) / 4)
    compute = time_average(report, lambda step: (step.bound == "compute") * (1 - step.draft_s / step.duration_s), 4.0)
    assert compute == pytest.approx(2 / 4)  # 2 of the 4 busy seconds in the compute-bound target step


def test_draft_passes_run_one_after_another_for_the_requests_still_drafting():
    speculation = SimulatedSpeculation(3, 0.5, DRAFT)
    efficiency = Efficiency()
    expected = sum(step_cost(DRAFT, GPU, batch, "bf16", efficiency).time_s
                   for batch in ([(100, 1), (50, 1)], [(101, 1), (51, 1)], [(102, 1)]))
    assert speculation.draft_time_s(GPU, [(100, 3), (50, 2)], "bf16", efficiency) == pytest.approx(expected)
    assert SimulatedSpeculation(3, 0.5).draft_time_s(GPU, [(100, 3)], "bf16", efficiency) == 0.0


def test_acceptance_stops_at_the_first_rejection():
    rng = random.Random(0)
    always, never = SimulatedSpeculation(4, 1.0), SimulatedSpeculation(4, 0.0)
    assert always.num_accepted(rng, 3) == 3 and never.num_accepted(rng, 3) == 0
    scripted = iter([0.1, 0.9, 0.1, 0.1])  # accept, reject, then two draws that would have accepted
    rng = type("Scripted", (), {"random": lambda self: next(scripted)})()
    assert SimulatedSpeculation(4, 0.8).num_accepted(rng, 4) == 1


@pytest.mark.parametrize("bad", [dict(num_speculative_tokens=0, acceptance_rate=0.5),
                                 dict(num_speculative_tokens=2, acceptance_rate=1.5)])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        SimulatedSpeculation(**bad)


def test_a_tensor_parallel_group_splits_a_steps_time():
    model = get_model("Llama-3.1-70B")
    group = tensor_parallel_group(GPU, 4)
    assert group.memory_bytes == 4 * GPU.memory_bytes and group.name == "4x H100-80GB (TP=4)"
    decode = [(1000, 1)] * 8
    single, split = (step_cost(model, g, decode, "bf16", Efficiency(overhead_s=0)) for g in (GPU, group))
    assert split.time_s == pytest.approx(single.time_s / 4)
    assert tensor_parallel_group(GPU, 1) is GPU
    # 2 all-reduces per layer x 80 layers x 6 ring hops x 1 us, on top of the base overhead
    assert tensor_parallel_overhead_s(model, 4) == pytest.approx(Efficiency().overhead_s + 160 * 6e-6)


def test_speculation_pays_at_low_load_and_backfires_at_high_load():
    points = speculation_qps_sweep([1, 64])
    low, high = points
    assert (low.num_requests, high.num_requests) == (200, 1280)  # 20 s of arrivals at 64 QPS
    assert low.speedup > 1.4 and high.speedup < 0.85
    assert high.batch_off > 200 > 10 > low.batch_off  # busy: near the 256-sequence cap
    assert high.compute_bound_on > 0.5 > low.compute_bound_on  # verification turned compute-bound
    assert low.tokens_per_step == pytest.approx(expected_tokens_per_step(0.7, 4), rel=0.03)


def test_the_crossover_is_interpolated_in_log_qps():
    from course_lib.engine.speculation_sweep import SweepPoint, crossover_qps

    def point(qps, speedup):
        return SweepPoint(qps, speedup * 10.0, 10.0, 2.0, 200, 1.0, 0.0)

    assert crossover_qps([point(1, 1.5), point(4, 1.5), point(16, 0.5)]) == pytest.approx(8.0)
    assert crossover_qps([point(1, 1.5), point(4, 1.2)]) is None
    assert crossover_qps([point(1, 0.9), point(4, 0.8)]) is None
