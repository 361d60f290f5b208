"""Measure one core of this computer's two roofs in a few seconds, so a learner can put their own
CPU on the same roofline plot as the GPU presets.

  memory bandwidth = bytes read + bytes written by one large tensor copy / its time
  matmul FLOP/s    = 2 n^3 / the time of one float32 n x n matmul

Every timing is one core's CPU time (``one_core``): PyTorch on one thread, the calling thread's
CPU seconds, so other programs sharing the machine do not count and a loaded machine measures
about what an idle one does. Each figure is the median of a few repeats. ``RoofProbes`` times one
copy or one product at a time, so that a caller can interleave the roofs with its own timings
(``engine.measured_roofline`` does, with the engine's steps) and load hits them alike. The matmul
size grows until one product takes ``min_matmul_s``, so a fast machine is not timed on a product
too small to measure. The copy's buffers should dwarf the CPU caches, or the copy measures cache
bandwidth instead of memory bandwidth.

torch is imported only when a measurement runs, so the other cost models stay torch-free.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass

from course_lib.perf.hardware import GPU
from course_lib.perf.one_core import cpu_seconds, one_thread
from course_lib.perf.units import MiB


@dataclass(frozen=True)
class MachineRoofline:
    """This machine's measured roofs, in the units of the GPU presets."""

    name: str
    flops: float  # float32 matmul FLOP/s on one core, median repeat
    memory_bandwidth: float  # bytes per second (read + write) from one core, median repeat
    matmul_size: int  # n of the n x n matmul that was timed
    copy_bytes: int  # bytes of one copy's source buffer
    threads: int  # torch's intra-op threads during the measurement (1: one core)
    seconds: float  # how long the whole measurement took (wall clock)

    @property
    def ridge_point(self) -> float:
        """FLOPs per byte where the roofs meet: below it a kernel is memory-bound."""
        return self.flops / self.memory_bandwidth

    def as_gpu(self) -> GPU:
        """This machine as a ``GPU`` for ``roofline.step_cost``: the measured matmul rate stands
        for the bf16 peak (a CPU runs the course's matmuls in float32), no fp8, no NVLink;
        memory is the machine's RAM; the host has no PCIe hop or NIC in the way, so both links
        are set to the memory bandwidth; one 'SM' per thread measured."""
        return GPU(self.name, _ram_bytes(), self.memory_bandwidth, self.flops, 0, 0, self.memory_bandwidth,
                   self.memory_bandwidth, self.threads)


def _ram_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX system: a stand-in that passes the checks
        return 8 * 1024 * MiB


class RoofProbes:
    """This machine's two roofs, timed one repeat at a time on one core (``one_core``): a copy of
    ``copy_bytes`` and an n x n float32 matmul, n doubled from 256 until one product takes
    ``min_matmul_s`` or n reaches ``max_size``. Create and call it inside ``one_thread()``."""

    def __init__(self, copy_bytes: int = 256 * MiB, min_matmul_s: float = 0.1, max_size: int = 8192) -> None:
        import torch

        if copy_bytes < MiB:
            raise ValueError(f"copy_bytes must be at least 1 MiB, got {copy_bytes!r}; use buffers far larger than "
                             f"the CPU caches.")
        if min_matmul_s <= 0:
            raise ValueError(f"min_matmul_s must be positive, got {min_matmul_s!r}.")
        self.copy_bytes, self.threads = copy_bytes, torch.get_num_threads()
        self.source = torch.ones(copy_bytes // 4, dtype=torch.float32)
        self.destination = torch.empty_like(self.source)
        self.destination.copy_(self.source)  # first-touch page faults, outside any timing
        self.size = 256
        while True:
            self.a, self.b = torch.randn(self.size, self.size), torch.randn(self.size, self.size)
            if cpu_seconds(lambda: self.a @ self.b) >= min_matmul_s or self.size * 2 > max_size:
                break
            self.size *= 2

    @classmethod
    def sized(cls, quick: bool = False) -> "RoofProbes":
        """The default probes, or with ``quick`` a 32 MiB copy and products of at most n = 1024
        taking 20 ms: a measurement well under a second, with noisier figures."""
        return cls(32 * MiB, 0.02, 1024) if quick else cls()

    def copy_rate(self) -> float:
        """Bytes per second of one timed copy: 2 x ``copy_bytes`` (read the source, write the destination)."""
        return 2 * self.source.numel() * 4 / cpu_seconds(lambda: self.destination.copy_(self.source))

    def matmul_rate(self) -> float:
        """FLOP/s of one timed n x n product: 2 n^3 FLOPs."""
        return 2 * self.size**3 / cpu_seconds(lambda: self.a @ self.b)

    def roofline(self, copy_rates: list[float], matmul_rates: list[float], seconds: float) -> MachineRoofline:
        """The medians of repeated ``copy_rate()`` and ``matmul_rate()`` as this machine's roofs."""
        import platform

        if not copy_rates or not matmul_rates:
            raise ValueError("Time at least one copy and one product before asking for the roofline.")
        name = f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores)"
        return MachineRoofline(name, statistics.median(matmul_rates), statistics.median(copy_rates), self.size,
                               self.copy_bytes, self.threads, seconds)


def measure_machine(quick: bool = False, repeats: int = 5) -> MachineRoofline:
    """Both roofs of one core of this machine, medians of ``repeats`` interleaved copies and
    products: a few seconds, or well under one with ``quick=True`` (smaller buffers and products,
    so noisier figures)."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats!r}.")
    started = time.perf_counter()
    with one_thread():
        probes = RoofProbes.sized(quick)
        rates = [(probes.copy_rate(), probes.matmul_rate()) for _ in range(repeats)]
        return probes.roofline([c for c, _ in rates], [m for _, m in rates], time.perf_counter() - started)
