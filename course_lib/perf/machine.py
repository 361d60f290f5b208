"""Measure this computer's two roofs in a few seconds, so a learner can put their own CPU on
the same roofline plot as the GPU presets.

  memory bandwidth = bytes read + bytes written by one large tensor copy / its time
  matmul FLOP/s    = 2 n^3 / the time of one float32 n x n matmul

Each figure is the best of a few repeats (a shared machine is noisy; the fastest run is the
least disturbed). The matmul size grows until one product takes ``min_matmul_s``, so a fast
machine is not timed on a product too small to measure. The copy's buffers should dwarf the
CPU caches, or the copy measures cache bandwidth instead of memory bandwidth.

torch is imported only when a measurement runs, so the other cost models stay torch-free.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from course_lib.perf.hardware import GPU
from course_lib.perf.units import MiB


@dataclass(frozen=True)
class MachineRoofline:
    """This machine's measured roofs, in the units of the GPU presets."""

    name: str
    flops: float  # float32 matmul FLOP/s, best repeat
    memory_bandwidth: float  # bytes per second (read + write), best repeat
    matmul_size: int  # n of the n x n matmul that was timed
    copy_bytes: int  # bytes of one copy's source buffer
    threads: int  # torch's intra-op threads during the measurement
    seconds: float  # how long the whole measurement took

    @property
    def ridge_point(self) -> float:
        """FLOPs per byte where the roofs meet: below it a kernel is memory-bound."""
        return self.flops / self.memory_bandwidth

    def as_gpu(self) -> GPU:
        """This machine as a ``GPU`` for ``roofline.step_cost``: the measured matmul rate stands
        for the bf16 peak (a CPU runs the course's matmuls in float32), no fp8, no NVLink;
        memory is the machine's RAM; the host has no PCIe hop or NIC in the way, so both links
        are set to the memory bandwidth; one 'SM' per CPU core."""
        return GPU(self.name, _ram_bytes(), self.memory_bandwidth, self.flops, 0, 0, self.memory_bandwidth,
                   self.memory_bandwidth, os.cpu_count() or 1)


def _ram_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX system: a stand-in that passes the checks
        return 8 * 1024 * MiB


def _best_seconds(run, repeats: int) -> float:
    run()  # warm up: first-touch page faults, thread-pool start-up
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return max(best, 1e-9)


def measure_memory_bandwidth(copy_bytes: int = 256 * MiB, repeats: int = 5) -> float:
    """Bytes per second one tensor copy moves: 2 x ``copy_bytes`` (read the source, write the
    destination) over the fastest of ``repeats`` copies."""
    import torch

    if copy_bytes < MiB or repeats < 1:
        raise ValueError(f"copy_bytes must be at least 1 MiB and repeats at least 1, got {copy_bytes!r}, "
                         f"{repeats!r}; use buffers far larger than the CPU caches.")
    source = torch.ones(copy_bytes // 4, dtype=torch.float32)
    destination = torch.empty_like(source)
    seconds = _best_seconds(lambda: destination.copy_(source), repeats)
    return 2 * source.numel() * 4 / seconds


def measure_matmul_flops(min_matmul_s: float = 0.1, repeats: int = 3, max_size: int = 8192) -> tuple[float, int]:
    """Float32 matmul FLOP/s (2 n^3 per product, fastest of ``repeats``) and the n used: n doubles
    from 256 until one product takes at least ``min_matmul_s`` or n reaches ``max_size``."""
    import torch

    if min_matmul_s <= 0 or repeats < 1:
        raise ValueError(f"min_matmul_s must be positive and repeats at least 1, got {min_matmul_s!r}, {repeats!r}.")
    size = 256
    while True:
        a, b = torch.randn(size, size), torch.randn(size, size)
        seconds = _best_seconds(lambda: a @ b, 1)
        if seconds >= min_matmul_s or size * 2 > max_size:
            break
        size *= 2
    seconds = min(seconds, _best_seconds(lambda: a @ b, repeats))
    return 2 * size**3 / seconds, size


def measure_machine(quick: bool = False) -> MachineRoofline:
    """Both roofs of this machine: a few seconds, or well under one with ``quick=True``
    (smaller buffers and products, so noisier figures)."""
    import platform

    import torch

    started = time.perf_counter()
    copy_bytes = 32 * MiB if quick else 256 * MiB
    bandwidth = measure_memory_bandwidth(copy_bytes, repeats=3 if quick else 5)
    flops, size = measure_matmul_flops(min_matmul_s=0.02 if quick else 0.1, repeats=2 if quick else 3,
                                       max_size=1024 if quick else 8192)
    name = f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores)"
    return MachineRoofline(name, flops, bandwidth, size, copy_bytes, torch.get_num_threads(),
                           time.perf_counter() - started)
