"""Drive an allocator with a request trace, one decode step at a time.

Each step: admit waiting requests in arrival order until the first that does not fit,
then every running request stores one generated token; a request that reaches its
final length is freed. If a paged allocator runs out of blocks mid-generation, the
most recently admitted request is preempted (freed and put back at the front of the
queue, to be recomputed), as vLLM does.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from statistics import mean
from typing import Callable

from course_lib.paging.allocator import KVAllocator, PoolExhausted
from course_lib.paging.report import MemoryReport, measure
from course_lib.paging.trace import TraceRequest


@dataclass(frozen=True)
class SimulationResult:
    """Per-step snapshots of one allocator under one trace."""

    snapshots: list[MemoryReport]
    saturated_steps: list[int]
    finished: int
    preemptions: int

    def _under_pressure(self) -> list[MemoryReport]:
        chosen = [self.snapshots[i] for i in self.saturated_steps]
        return chosen or self.snapshots

    @property
    def mean_waste_fraction(self) -> float:
        """Average waste over the steps where requests were left waiting (the pool was the limit)."""
        return mean(s.waste_fraction for s in self._under_pressure())

    @property
    def mean_concurrency(self) -> float:
        """Average number of requests held at once while requests were left waiting."""
        return mean(s.num_requests for s in self._under_pressure())

    @property
    def peak_concurrency(self) -> int:
        """Most requests held at once."""
        return max(s.num_requests for s in self.snapshots)


def simulate(
    allocator: KVAllocator,
    trace: list[TraceRequest],
    num_steps: int,
    on_step: Callable[[int], None] | None = None,
) -> SimulationResult:
    """Run ``num_steps`` decode steps of ``trace`` through ``allocator`` (all requests arrive at step 0)."""
    waiting: deque[TraceRequest] = deque(trace)
    running: list[TraceRequest] = []
    finals = {r.req_id: r.final_len for r in trace}
    snapshots, saturated = [], []
    finished = preemptions = 0
    for step in range(num_steps):
        while waiting and allocator.can_admit(waiting[0].prompt_len, _limit(allocator, waiting[0])):
            request = waiting.popleft()
            allocator.admit(request.req_id, request.prompt_len, request.max_tokens)
            running.append(request)
        for request in list(running):
            if request not in running:
                continue  # preempted earlier in this step
            while True:
                try:
                    allocator.append_token(request.req_id)
                    break
                except PoolExhausted:
                    victim = running.pop()
                    allocator.free(victim.req_id)
                    waiting.appendleft(victim)
                    preemptions += 1
                    if victim is request:
                        break
            if request in running and allocator.lengths[request.req_id] == request.final_len:
                allocator.free(request.req_id)
                running.remove(request)
                finished += 1
        snapshots.append(measure(allocator, finals))
        if waiting:
            saturated.append(step)
        if on_step is not None:
            on_step(step)
    return SimulationResult(snapshots, saturated, finished, preemptions)


def _limit(allocator: KVAllocator, request: TraceRequest) -> int:
    return min(allocator.max_model_len, request.prompt_len + request.max_tokens)
