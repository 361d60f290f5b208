"""Where speculative decoding stops paying: the same Poisson traffic served with and without
speculation at several request rates, in simulated mode, on a tensor-parallel group.

    points = speculation_qps_sweep([1, 4, 16, 64])   # Llama-3.1-70B on 4 x H100, Llama-3.2-1B drafts
    [(p.qps, p.speedup) for p in points]

At low load a decode step is memory-bound: verifying 1 + k tokens per request costs about what
one token costs, so every accepted draft saves a step. As the rate grows the batch grows, the
step turns compute-bound, and verification costs up to k + 1 times a decode while yielding
(1 - a^(k+1)) / (1 - a) tokens; the draft model's passes come on top.
Left out (beyond ``simulated_speculation``'s list): the bandwidth term of the tensor-parallel
all-reduces, which grows with the tokens a step verifies, so it would make speculation look
worse still at high load.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace

from course_lib.engine.simulated import SimulatedEngine, SimulationReport
from course_lib.engine.simulated_speculation import SimulatedSpeculation
from course_lib.perf.comm import LINKS, RING
from course_lib.perf.hardware import GPU, get_gpu, tensor_parallel_group
from course_lib.perf.models import ModelSpec, get_model
from course_lib.perf.roofline import Efficiency
from course_lib.perf.workloads import poisson

NVLINK = LINKS["NVLink 4 (H100, within a node)"]


def tensor_parallel_overhead_s(model: ModelSpec, size: int, link=NVLINK, base_s: float = Efficiency().overhead_s) -> float:
    """Fixed cost of one step on a tensor-parallel group: the base step overhead plus the latency
    of two ring all-reduces per layer (2 (N - 1) hops each); their bytes are left out."""
    return base_s + 2 * model.num_layers * RING.time(size, 0, link.alpha_s, link.beta)


@dataclass(frozen=True)
class SweepPoint:
    """One request rate, served with and without speculation."""

    qps: float
    tpot_off_ms: float  # median over requests of (last token - first token) / (tokens - 1)
    tpot_on_ms: float
    tokens_per_step: float  # mean tokens per verification step, measured
    num_requests: int  # served at this rate
    batch_off: float  # running requests without speculation, averaged over time while requests arrive
    compute_bound_on: float  # share of that time the speculating run spent in compute-bound target steps

    @property
    def speedup(self) -> float:
        """TPOT without speculation / with it: above 1, speculation pays."""
        return self.tpot_off_ms / self.tpot_on_ms


def median_tpot_ms(report: SimulationReport) -> float:
    """Median over requests of the time per output token after the first, in ms."""
    per_request = [sum(gaps) / len(gaps) for gaps in report.itl_per_request if gaps]
    return 1000 * statistics.median(per_request) if per_request else 0.0


def speculation_qps_sweep(qps_values: list[float], speculation: SimulatedSpeculation | None = None, *,
                          model: ModelSpec | str = "Llama-3.1-70B", gpu: GPU | str = "H100-80GB",
                          tensor_parallel_size: int = 4, min_requests: int = 200, arrivals_s: float = 20.0,
                          mean_prompt: int = 256, mean_output: int = 256, seed: int = 0, on_point=None,
                          baselines: dict | None = None, **engine_settings) -> list[SweepPoint]:
    """TPOT with and without ``speculation`` (default: a Llama-3.2-1B draft, k = 4, a = 0.7) for
    Poisson traffic at each rate, on ``tensor_parallel_size`` GPUs; a draft model without its own
    ``draft_efficiency`` pays the all-reduce latency of its own layers. Each rate serves
    ``max(min_requests, qps x arrivals_s)`` requests, so busy rates reach a steady batch before
    the arrivals stop. Prompt and output lengths are exponential with the given means.
    ``on_point(i)`` reports progress. ``baselines`` (a dict, filled as the sweep goes) keeps the
    runs without speculation by rate: sweeps of several speculation settings that pass the same
    dict, and the same everything else, run each baseline once."""
    model = get_model(model) if isinstance(model, str) else model
    group = tensor_parallel_group(get_gpu(gpu) if isinstance(gpu, str) else gpu, tensor_parallel_size)
    speculation = speculation or SimulatedSpeculation(4, 0.7, get_model("Llama-3.2-1B"))
    if speculation.draft_model is not None and speculation.draft_efficiency is None:
        speculation = replace(speculation, draft_efficiency=Efficiency(
            overhead_s=tensor_parallel_overhead_s(speculation.draft_model, tensor_parallel_size)))
    efficiency = Efficiency(overhead_s=tensor_parallel_overhead_s(model, tensor_parallel_size))
    settings = dict(max_model_len=8192, efficiency=efficiency) | engine_settings
    points = []
    for i, qps in enumerate(qps_values):
        workload = poisson(max(min_requests, round(qps * arrivals_s)), qps, mean_prompt, mean_output, seed=seed)
        off = baselines.get(qps) if baselines is not None else None
        if off is None:
            off = SimulatedEngine(model, group, **settings).run(workload)
            if baselines is not None:
                baselines[qps] = off
        on = SimulatedEngine(model, group, speculation=speculation, **settings).run(workload)
        stats = on.spec_decode_stats
        until = workload[-1].arrival_time
        points.append(SweepPoint(qps, median_tpot_ms(off), median_tpot_ms(on),
                                 stats.mean_tokens_per_step if stats else 1.0, len(workload),
                                 time_average(off, lambda step: step.num_running, until),
                                 time_average(on, lambda step: (step.bound == "compute") * (1 - step.draft_s / step.duration_s),
                                              until)))
        if on_point is not None:
            on_point(i)
    return points


def time_average(report: SimulationReport, value, until_s: float) -> float:
    """``value(step)`` averaged over the busy time of the steps that end by ``until_s`` (the last
    arrival: under load, before the queue drains), each step weighted by its duration."""
    steps = [step for step in report.steps if step.time_s <= until_s] or report.steps[:1]
    busy = sum(step.duration_s for step in steps)
    return sum(value(step) * step.duration_s for step in steps) / busy if busy else 0.0


def crossover_qps(points: list[SweepPoint]) -> float | None:
    """The request rate where speculation stops paying (speed-up 1), interpolated in log QPS
    between the last point above 1 and the first at or below it; None if it never crosses."""
    for before, after in zip(points, points[1:]):
        if before.speedup > 1 >= after.speedup:
            share = (before.speedup - 1) / (before.speedup - after.speedup)
            return math.exp(math.log(before.qps) + share * (math.log(after.qps) - math.log(before.qps)))
    return None
