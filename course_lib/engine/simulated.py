"""Simulated mode: the real scheduler and KV cache manager on a big model and GPU, with a
model runner that advances a clock by the roofline cost of each step instead of computing.
A step that swaps KV blocks to or from CPU memory also waits for those copies over PCIe
(blocking, as vLLM's swap was); recompute needs no extra term: its cost is the re-prefill.

    engine = SimulatedEngine(get_model("Llama-3.1-8B"), get_gpu("H100-80GB"), max_num_batched_tokens=2048)
    report = engine.run(document_among_chats())

With ``speculation`` (``simulated_speculation.SimulatedSpeculation``) decoding requests carry
drafts that the scheduler charges and rolls back exactly as in the real engine; acceptance is
drawn at the given rate, and the draft model's passes are added to the clock.

Output tokens are the workload's ``output_token_ids`` where it gives them (so later turns that
quote an answer hit the prefix cache) and placeholders otherwise; generation length comes from
the workload. Everything the scheduler decides (budgets, chunking, preemption, prefix hits) is
exactly what the real engine would decide on the same tokens.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from course_lib.cycle_collector import cycle_collector_paused
from course_lib.engine.config import SchedulerConfig
from course_lib.engine.kv_cache_manager import KVCacheManager
from course_lib.engine.metrics import SpecDecodeStats
from course_lib.engine.request import Request
from course_lib.engine.sampling_params import SamplingParams
from course_lib.engine.scheduler import Scheduler
from course_lib.engine.simulated_speculation import SimulatedSpeculation
from course_lib.perf.hardware import GPU
from course_lib.perf.kv import model_kv_bytes_per_token, plan_kv_cache
from course_lib.perf.models import ModelSpec
from course_lib.perf.roofline import Efficiency, step_cost
from course_lib.perf.workloads import WorkloadRequest

PLACEHOLDER_TOKEN = 0


@dataclass(frozen=True)
class SimulatedStep:
    time_s: float  # clock at the end of the step
    duration_s: float
    scheduled: dict[str, int]
    num_running: int
    num_waiting: int
    kv_usage: float
    preempted: int
    bound: str
    swap_s: float = 0.0  # part of duration_s spent copying swapped blocks over PCIe
    draft_s: float = 0.0  # part of duration_s the draft model spent proposing for the next step


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class RequestTimes:
    """When one finished request arrived and when each of its output tokens came out (simulated clock, s)."""

    tag: str
    arrival_s: float
    token_times_s: tuple[float, ...]


@dataclass
class SimulationReport:
    """Per-request timings (by tag) and per-step records of one simulated run.

    ``tokens_needed`` is what the run would compute with no preemption and no prefix-cache hit:
    every prompt token and every output token but the last (it is sampled, never fed back).
    ``tokens_computed`` exceeds it by the work recompute threw away, and falls below it by the
    prefix-cache hits.
    """

    steps: list[SimulatedStep]
    ttft: dict[str, list[float]] = field(default_factory=dict)  # tag -> TTFT of each request (s)
    itl: dict[str, list[float]] = field(default_factory=dict)  # tag -> every inter-token gap (s)
    itl_per_request: list[list[float]] = field(default_factory=list)  # each finished request's gaps (s)
    requests: dict[str, RequestTimes] = field(default_factory=dict)  # request id -> its times, when finished
    output_tokens: int = 0
    preemptions: int = 0
    max_preemptions_per_request: int = 0  # the most times one request was preempted
    tokens_needed: int = 0
    prefix_hit_rate: float = 0.0
    spec_decode_stats: SpecDecodeStats | None = None  # summed over finished requests, with speculation

    @property
    def duration_s(self) -> float:
        return self.steps[-1].time_s if self.steps else 0.0

    @property
    def tokens_computed(self) -> int:
        """Tokens the GPU ran through the model, over all steps."""
        return sum(sum(step.scheduled.values()) for step in self.steps)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.duration_s if self.duration_s else 0.0

    def latency(self, tag: str | None = None) -> dict[str, float]:
        """P50/P90/P99 of TTFT and ITL in milliseconds, for one tag or all requests."""
        tags = [tag] if tag else list(self.ttft)
        ttft = [t for k in tags for t in self.ttft.get(k, [])]
        itl = [t for k in tags for t in self.itl.get(k, [])]
        return {f"{name}_p{q}_ms": 1000 * percentile(values, q)
                for name, values in (("ttft", ttft), ("itl", itl)) for q in (50, 90, 99)}


class SimulatedEngine:
    def __init__(self, model: ModelSpec, gpu: GPU, *, max_num_seqs: int = 256, max_num_batched_tokens: int = 8192,
                 max_model_len: int | None = None, block_size: int = 16, gpu_memory_utilization: float = 0.9,
                 num_gpu_blocks: int | None = None, enable_prefix_caching: bool = True,
                 long_prefill_token_threshold: int = 0, preemption_mode: str = "recompute",
                 scheduling_policy: str = "continuous", dtype: str = "bf16",
                 efficiency: Efficiency = Efficiency(), speculation: SimulatedSpeculation | None = None) -> None:
        max_model_len = max_model_len or model.max_context
        if num_gpu_blocks is None:
            num_gpu_blocks = plan_kv_cache(model, gpu, gpu_memory_utilization=gpu_memory_utilization,
                                           max_model_len=max_model_len, block_size=block_size, dtype=dtype).num_blocks
        self.model, self.gpu, self.dtype, self.efficiency = model, gpu, dtype, efficiency
        self.config = SchedulerConfig(max_num_seqs, max_num_batched_tokens, max_model_len,
                                      long_prefill_token_threshold, preemption_mode, scheduling_policy)
        self.block_size = block_size
        self.speculation = speculation
        self.acceptance = random.Random(speculation.seed if speculation else 0)
        self.scripted_outputs: dict[str, tuple[int, ...]] = {}  # request id -> the tokens it will "generate"
        self.swap_s_per_block = block_size * model_kv_bytes_per_token(model, dtype) / gpu.pcie_bandwidth
        self.kv = KVCacheManager(num_gpu_blocks, block_size, enable_prefix_caching)
        self.scheduler = Scheduler(self.config, self.kv, num_gpu_blocks if preemption_mode == "swap" else 0)

    def run(self, workload: list[WorkloadRequest], max_steps: int = 1_000_000) -> SimulationReport:
        """Serve ``workload`` (sorted by arrival) to completion on the simulated clock."""
        with cycle_collector_paused():
            return self._run(workload, max_steps)

    def _run(self, workload: list[WorkloadRequest], max_steps: int) -> SimulationReport:
        pending = sorted(enumerate(workload), key=lambda item: item[1].arrival_time)
        tags, clock, cursor, steps, finished = {}, 0.0, 0, [], []
        while cursor < len(pending) or self.scheduler.has_unfinished_requests():
            if not self.scheduler.has_unfinished_requests():
                clock = max(clock, pending[cursor][1].arrival_time)
            while cursor < len(pending) and pending[cursor][1].arrival_time <= clock:
                index, item = pending[cursor]
                self._add(str(index), item)
                tags[str(index)] = item.tag
                cursor += 1
            plan = self.scheduler.schedule()
            requests = self.scheduler.requests
            cost = step_cost(self.model, self.gpu, [(requests[r].num_computed_tokens, n)
                                                     for r, n in plan.num_scheduled_tokens.items()],
                             self.dtype, self.efficiency)
            swap_s = (len(plan.swap_out) + len(plan.swap_in)) * self.swap_s_per_block
            clock += cost.time_s + swap_s
            sampled = {r: self._next_tokens(requests[r], len(plan.spec_token_ids.get(r, ())))
                       for r, n in plan.num_scheduled_tokens.items()
                       if requests[r].num_computed_tokens + n >= requests[r].num_tokens}
            finished += self.scheduler.update_from_output(plan, sampled, clock)
            draft_s = self._propose(sampled)
            clock += draft_s
            steps.append(SimulatedStep(clock, cost.time_s + swap_s + draft_s, plan.num_scheduled_tokens,
                                       len(self.scheduler.running), len(self.scheduler.waiting),
                                       self.kv.block_pool.usage(), len(plan.preempted), cost.bound, swap_s, draft_s))
            if len(steps) >= max_steps:
                raise RuntimeError(f"Simulation did not finish in {max_steps} steps; shorten the workload.")
        return self._report(steps, finished, tags)

    def _add(self, request_id: str, item: WorkloadRequest) -> None:
        prompt = list(item.prompt_token_ids)
        if len(prompt) > self.config.max_model_len:
            raise ValueError(f"Request {request_id} has {len(prompt)} prompt tokens, more than max_model_len="
                             f"{self.config.max_model_len}; raise max_model_len or shorten the workload's prompts.")
        if item.output_token_ids is not None:
            self.scripted_outputs[request_id] = item.output_token_ids
        params = SamplingParams(temperature=0, max_tokens=item.output_len, ignore_eos=True)
        stats = SpecDecodeStats(self.speculation.num_speculative_tokens) if self.speculation else None
        self.scheduler.add_request(Request(request_id, prompt, params, None, item.arrival_time, self.block_size,
                                           self.config.max_model_len, priority=item.priority, spec_stats=stats))

    def _next_tokens(self, request: Request, num_drafts: int) -> list[int]:
        """What the step emits for ``request``: after ``num_drafts`` drafts, the accepted ones plus
        one; the workload's next output tokens, or placeholders."""
        count = 1 + (self.speculation.num_accepted(self.acceptance, num_drafts) if num_drafts else 0)
        script = self.scripted_outputs.get(request.request_id)
        done = len(request.output_token_ids)
        return list(script[done:done + count]) if script else [PLACEHOLDER_TOKEN] * count

    def _propose(self, sampled: dict) -> float:
        """Give every decoding request that just got tokens its drafts (placeholders, since nothing
        checks their ids); return the draft model's time."""
        if self.speculation is None:
            return 0.0
        drafts = []
        for request, room in self.scheduler.draft_candidates(sampled):
            room = min(self.speculation.num_speculative_tokens, room)
            request.spec_token_ids = [PLACEHOLDER_TOKEN] * room
            request.spec_stats.num_proposed_tokens += room
            drafts.append((request.num_tokens, room))
        return self.speculation.draft_time_s(self.gpu, drafts, self.dtype, self.efficiency)

    def _report(self, steps, finished: list[Request], tags: dict[str, str]) -> SimulationReport:
        report = SimulationReport(steps, output_tokens=sum(len(r.output_token_ids) for r in finished),
                                  preemptions=self.scheduler.total_preemptions,
                                  max_preemptions_per_request=max((r.num_preemptions for r in finished), default=0),
                                  tokens_needed=sum(r.num_tokens - 1 for r in finished),
                                  prefix_hit_rate=self.kv.prefix_cache_stats.hit_rate)
        if self.speculation:
            report.spec_decode_stats = SpecDecodeStats(self.speculation.num_speculative_tokens)
        for request in finished:
            tag = tags[request.request_id]
            report.ttft.setdefault(tag, []).append(request.token_times[0] - request.arrival_time)
            gaps = [b - a for a, b in zip(request.token_times, request.token_times[1:])]
            report.itl.setdefault(tag, []).extend(gaps)
            report.itl_per_request.append(gaps)
            report.requests[request.request_id] = RequestTimes(tag, request.arrival_time, tuple(request.token_times))
            if report.spec_decode_stats is not None:
                report.spec_decode_stats.merge(request.spec_stats)
        return report


def simulate_budget(model: ModelSpec, gpu: GPU, workload: list[WorkloadRequest], budget: int,
                    threshold: int = 0, policy: str = "fcfs") -> SimulationReport:
    """One simulated run with this token budget, long-prefill cap (chunked prefill on) and
    scheduling policy ("priority" orders by each request's ``priority``)."""
    longest = max(len(r.prompt_token_ids) + r.output_len for r in workload)
    engine = SimulatedEngine(model, gpu, max_model_len=longest, max_num_batched_tokens=budget,
                             long_prefill_token_threshold=threshold, scheduling_policy=policy)
    return engine.run(workload)
