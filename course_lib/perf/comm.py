"""The alpha-beta cost model of all-reduce, and interconnect presets.

A message of K bytes over one link costs ``alpha + K * beta``: alpha is the per-hop start-up
latency (software, NIC, switch), beta the inverse bandwidth (seconds per byte).

  ring             2(N-1) alpha + 2(N-1)/N K beta   2(N-1) hops in sequence; each carries K/N bytes
  binary tree      2 log2(N) alpha + 4 K beta       up and down the tree's depth (floor(log2 N) levels
                                                     when N is not a power of two); pipelined, an
                                                     interior rank receives K from each of two
                                                     children and later sends K to each
  double binary    2 log2(N) alpha + 2 K beta       two trees, each on half the data, every rank
  tree                                               interior in only one: the load evens out

So the ring wins on bandwidth (its K term barely grows with N) and the trees on latency (log N
hops instead of N). Small messages on many ranks are latency-bound: trees win. In this model
the double binary tree even matches the ring's bandwidth; in practice it pipelines the data in
many small pieces, whose overheads the model leaves out, and NCCL still picks the ring for
large messages on few ranks. It chooses by message size and rank count.

Link presets: bandwidths come from the GPU presets (``course_lib.perf.hardware``), per
direction. Alphas are typical orders of magnitude, not measurements: about 1 us for an
NVLink hop, a few us for PCIe, about 5 us for an InfiniBand hop through a switch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from course_lib.checks import require_positive
from course_lib.perf.hardware import get_gpu


@dataclass(frozen=True)
class Link:
    name: str
    alpha_s: float  # per-hop latency (s)
    bandwidth: float  # bytes per second, one direction

    def __post_init__(self) -> None:
        require_positive("Link.alpha_s", self.alpha_s)
        require_positive("Link.bandwidth", self.bandwidth)

    @property
    def beta(self) -> float:
        """Seconds per byte."""
        return 1 / self.bandwidth


def _links() -> dict[str, Link]:
    h100 = get_gpu("H100-80GB")
    return {link.name: link for link in (
        Link("NVLink 4 (H100, within a node)", 1e-6, h100.nvlink_bandwidth / 2),
        Link("PCIe Gen5 x16", 3e-6, h100.pcie_bandwidth),
        Link("InfiniBand NDR 400 Gb/s (across nodes)", 5e-6, h100.network_bandwidth),
    )}


LINKS: dict[str, Link] = _links()


@dataclass(frozen=True)
class AllReduceCost:
    """time = hops(N) x alpha + volume(N) x K x beta, for K bytes on N ranks."""

    name: str
    hops: Callable[[int], float]
    volume: Callable[[int], float]

    def time(self, num_ranks: int, num_bytes: float, alpha_s: float, beta: float) -> float:
        require_positive("num_ranks", num_ranks)
        if num_bytes < 0:
            raise ValueError(f"num_bytes must be 0 or more, got {num_bytes}.")
        if num_ranks == 1:
            return 0.0
        return self.hops(num_ranks) * alpha_s + self.volume(num_ranks) * num_bytes * beta


def _depth(num_ranks: int) -> int:
    """Levels of a heap-shaped binary tree of N ranks: floor(log2 N), log2 N for powers of two."""
    return num_ranks.bit_length() - 1


RING = AllReduceCost("ring", lambda n: 2 * (n - 1), lambda n: 2 * (n - 1) / n)
BINARY_TREE = AllReduceCost("binary tree", lambda n: 2 * _depth(n), lambda n: 4)
DOUBLE_BINARY_TREE = AllReduceCost("double binary tree", lambda n: 2 * _depth(n), lambda n: 2)
ALGORITHMS = {cost.name: cost for cost in (RING, BINARY_TREE, DOUBLE_BINARY_TREE)}


def crossover_bytes(latency_optimal: AllReduceCost, bandwidth_optimal: AllReduceCost, num_ranks: int,
                    alpha_s: float, beta: float) -> float | None:
    """The message size at which the two cost the same: below it the one with fewer hops wins,
    above it the one that moves fewer bytes. None when one is never slower than the other."""
    extra_hops = bandwidth_optimal.hops(num_ranks) - latency_optimal.hops(num_ranks)
    extra_volume = latency_optimal.volume(num_ranks) - bandwidth_optimal.volume(num_ranks)
    if extra_hops <= 0 or extra_volume <= 0:
        return None
    return extra_hops * alpha_s / (extra_volume * beta)
