"""The step trace: what the scheduler did in each step, for lessons to draw."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepRecord:
    """One engine step. ``scheduled`` maps request id to tokens computed in this step."""

    step: int
    scheduled: dict[str, int]
    waiting: list[str]
    running: list[str]
    blocks_used: int
    blocks_free: int
    prefix_hit_tokens: int
    preempted: list[str]
    wall_time_s: float
    model_time_s: float  # forward pass and sampling; the rest of the wall time is bookkeeping

    @property
    def overhead_time_s(self) -> float:
        """Scheduling, KV-cache management and input preparation."""
        return self.wall_time_s - self.model_time_s

    @property
    def num_tokens(self) -> int:
        return sum(self.scheduled.values())
