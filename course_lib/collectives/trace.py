"""What a hand-written collective did: every send a rank made, and optionally its buffer after each step."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Transfer:
    """One send: ``num_bytes`` of chunk ``chunk`` (-1: the rank's whole share) from ``src`` to ``dst``."""

    phase: str
    step: int
    src: int
    dst: int
    chunk: int
    num_bytes: int


@dataclass
class CommTrace:
    """One rank's record of an algorithm run. ``buffers[i]`` is the rank's data after step i
    (as ``(phase, step, values)``), kept only when the run was asked to record values."""

    rank: int
    world_size: int
    record_values: bool = False
    transfers: list[Transfer] = field(default_factory=list)
    buffers: list[tuple[str, int, list[float]]] = field(default_factory=list)

    @property
    def bytes_sent(self) -> int:
        return sum(t.num_bytes for t in self.transfers)

    def sent(self, phase: str, step: int, dst: int, chunk: int, tensor: torch.Tensor) -> None:
        self.transfers.append(Transfer(phase, step, self.rank, dst, chunk, tensor.numel() * tensor.element_size()))

    def snapshot(self, phase: str, step: int, buffer: torch.Tensor) -> None:
        if self.record_values:
            self.buffers.append((phase, step, buffer.flatten().tolist()))
