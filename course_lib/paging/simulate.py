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


class TraceReplay:
    """One allocator serving requests step by step. Invariant: every running request is live
    in the allocator and has not reached its final length; waiting ones hold nothing."""

    def __init__(self, allocator: KVAllocator) -> None:
        self.allocator = allocator
        self.waiting: deque[TraceRequest] = deque()
        self.running: list[TraceRequest] = []
        self.final_lengths: dict[str, int] = {}
        self.finished = 0
        self.preemptions = 0

    def submit(self, request: TraceRequest) -> None:
        """Queue a request at the back of the waiting line."""
        self.final_lengths[request.req_id] = request.final_len
        self.waiting.append(request)

    def admit(self) -> list[TraceRequest]:
        """Admit waiting requests in order, stopping at the first that does not fit."""
        admitted = []
        while self.waiting:
            head = self.waiting[0]
            if not self.allocator.can_admit(head.prompt_len, head.max_tokens):
                break
            self.allocator.admit(head.req_id, head.prompt_len, head.max_tokens)
            self.running.append(self.waiting.popleft())
            admitted.append(head)
        return admitted

    def decode_step(self) -> None:
        """Every running request stores one token; finished ones are freed, and on a full
        paged pool the newest running request is preempted until the token fits."""
        for request in list(self.running):
            if request not in self.running:
                continue  # preempted earlier in this step
            if not self._append_or_preempt(request):
                continue
            if self.allocator.lengths[request.req_id] == request.final_len:
                self.allocator.free(request.req_id)
                self.running.remove(request)
                self.finished += 1

    def _append_or_preempt(self, request: TraceRequest) -> bool:
        while True:
            try:
                self.allocator.append_token(request.req_id)
                return True
            except PoolExhausted:
                victim = self.running.pop()
                self.allocator.free(victim.req_id)
                self.waiting.appendleft(victim)
                self.preemptions += 1
                if victim is request:
                    return False

    def report(self) -> MemoryReport:
        return measure(self.allocator, self.final_lengths)


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


def simulate(
    allocator: KVAllocator,
    trace: list[TraceRequest],
    num_steps: int,
    on_step: Callable[[int], None] | None = None,
) -> SimulationResult:
    """Run ``num_steps`` decode steps of ``trace`` through ``allocator`` (all requests arrive at step 0)."""
    replay = TraceReplay(allocator)
    for request in trace:
        replay.submit(request)
    snapshots, saturated = [], []
    for step in range(num_steps):
        replay.admit()
        replay.decode_step()
        snapshots.append(replay.report())
        if replay.waiting:
            saturated.append(step)
        if on_step is not None:
            on_step(step)
    return SimulationResult(snapshots, saturated, replay.finished, replay.preemptions)
