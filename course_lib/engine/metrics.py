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
    schedule_time_s: float

    @property
    def num_tokens(self) -> int:
        return sum(self.scheduled.values())
