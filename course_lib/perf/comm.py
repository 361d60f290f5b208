"""The alpha-beta cost model of all-reduce, and interconnect presets.

A message of K bytes over one link costs ``alpha + K * beta``: alpha is the per-hop start-up
latency (software, NIC, switch), beta the inverse bandwidth (seconds per byte).

The whiteboard formulas (the lesson's table; ``chunk_bytes=None``):

  ring             2(N-1) alpha + 2(N-1)/N K beta   2(N-1) hops in sequence; each carries K/N bytes
  binary tree      2 log2(N) alpha + 4 K beta       up and down the tree's depth (floor(log2 N) levels
                                                     when N is not a power of two); pipelined, an
                                                     interior rank receives K from each of two
                                                     children and later sends K to each
  double binary    2 log2(N) alpha + 2 K beta       two trees, each on half the data, every rank
  tree                                               interior in only one: the load evens out

So the ring wins on bandwidth (its K term barely grows with N) and the trees on latency (log N
hops instead of N). Small messages on many ranks are latency-bound: trees win. But in these
formulas the double binary tree also matches the ring's bandwidth, so at 512 ranks it would
win at every size, while NCCL picks the ring for large messages.

What the whiteboard leaves out: a tree's bandwidth term assumes the message is pipelined, and
pipelining is not free. NCCL moves it through each tree in chunks (tens to hundreds of KiB);
a rank forwards a chunk only once its children's chunk has arrived, so every chunk is one
more synchronised step of the pipeline. With ``chunk_bytes=C`` the trees pay for it:

  pieces = max(1, K / (trees x C))                  chunks per tree; trees = 1 or 2
  time   = (hops + pieces - 1) alpha + volume K beta

The first chunk crosses all 2 log2(N) levels, each later chunk adds one alpha. Up to one
chunk per tree this is the whiteboard formula; beyond it every byte costs ``alpha / (trees C)``
on top of its bandwidth, which at large sizes hands the win back to the ring (its K/N pieces
stream to one neighbour back to back, so the model charges the ring no extra step).
``TREE_CHUNK_BYTES`` (128 KiB) is a typical size for NCCL's simple protocol; the widget lets
learners change it. Still left out: congestion, the NVLink-inside / network-between hierarchy,
NCCL's protocols (LL, LL128, Simple) and its measured tuning tables.

Link presets (``LINKS``, re-exported here): the interconnect hierarchy of
``course_lib.perf.interconnect``, bandwidth per direction and a typical per-hop alpha.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from course_lib.checks import require_positive
from course_lib.perf.interconnect import LINKS, Link  # noqa: F401 - re-exported for the cost models' callers
from course_lib.perf.units import KiB


TREE_CHUNK_BYTES = 128 * KiB
"""A typical chunk of NCCL's tree pipeline (simple protocol: 32 KiB to 512 KiB, by message size)."""


@dataclass(frozen=True)
class AllReduceCost:
    """time = (hops(N) + pieces - 1) x alpha + volume(N) x K x beta, for K bytes on N ranks.

    ``trees`` is how many trees share the message (0 for the ring, which is never charged
    for chunks). pieces = max(1, K / (trees x chunk_bytes)) with a chunk size, 1 without one
    (the whiteboard formula). Invariants: the time is 0 on one rank, continuous and
    non-decreasing in K, and never below the whiteboard formula.
    """

    name: str
    hops: Callable[[int], float]
    volume: Callable[[int], float]
    trees: int = 0

    def pieces(self, num_bytes: float, chunk_bytes: float | None = None) -> float:
        """Chunks per tree that the pipeline moves in sequence (1: the message goes whole)."""
        bend = self.chunked_from(chunk_bytes)
        return 1.0 if bend is None else max(1.0, num_bytes / bend)

    def time(self, num_ranks: int, num_bytes: float, alpha_s: float, beta: float,
             chunk_bytes: float | None = None) -> float:
        """Seconds for an all-reduce of ``num_bytes`` on ``num_ranks``; trees pipeline in
        ``chunk_bytes`` pieces when it is given (e.g. ``TREE_CHUNK_BYTES``)."""
        require_positive("num_ranks", num_ranks)
        if num_bytes < 0:
            raise ValueError(f"num_bytes must be 0 or more, got {num_bytes}.")
        if num_ranks == 1:
            return 0.0
        steps = self.hops(num_ranks) + self.pieces(num_bytes, chunk_bytes) - 1
        return steps * alpha_s + self.volume(num_ranks) * num_bytes * beta

    def _line(self, num_ranks: int, num_bytes: float, alpha_s: float, beta: float,
              chunk_bytes: float | None) -> tuple[float, float]:
        """(intercept, slope) of the time against K on the straight stretch that starts at ``num_bytes``."""
        slope = self.volume(num_ranks) * beta
        bend = self.chunked_from(chunk_bytes)
        if bend is not None and num_bytes >= bend:
            return (self.hops(num_ranks) - 1) * alpha_s, slope + alpha_s / bend
        return self.hops(num_ranks) * alpha_s, slope

    def chunked_from(self, chunk_bytes: float | None) -> float | None:
        """The message size above which pipelining adds steps: one chunk per tree (None: never)."""
        if chunk_bytes is None:
            return None
        require_positive("chunk_bytes", chunk_bytes)
        return self.trees * chunk_bytes if self.trees else None


def _depth(num_ranks: int) -> int:
    """Levels of a heap-shaped binary tree of N ranks: floor(log2 N), log2 N for powers of two."""
    return num_ranks.bit_length() - 1


RING = AllReduceCost("ring", lambda n: 2 * (n - 1), lambda n: 2 * (n - 1) / n)
BINARY_TREE = AllReduceCost("binary tree", lambda n: 2 * _depth(n), lambda n: 4, trees=1)
DOUBLE_BINARY_TREE = AllReduceCost("double binary tree", lambda n: 2 * _depth(n), lambda n: 2, trees=2)
ALGORITHMS = {cost.name: cost for cost in (RING, BINARY_TREE, DOUBLE_BINARY_TREE)}


def crossover_bytes(latency_optimal: AllReduceCost, bandwidth_optimal: AllReduceCost, num_ranks: int,
                    alpha_s: float, beta: float, chunk_bytes: float | None = None) -> float | None:
    """The smallest message size at which ``latency_optimal`` stops being the faster: below it
    the one with fewer hops wins, at it both cost the same. None when ``latency_optimal`` is
    not faster for the smallest messages, or stays faster at every size. Both times are piecewise
    linear in K (they bend where pipelining starts), so the crossing is found stretch by stretch,
    exactly."""
    if num_ranks == 1:
        return None
    costs = (latency_optimal, bandwidth_optimal)
    bends = sorted({b for b in (c.chunked_from(chunk_bytes) for c in costs) if b is not None})
    starts = [0.0, *bends]
    for start, end in zip(starts, [*bends, math.inf]):
        (a1, b1), (a2, b2) = (c._line(num_ranks, start, alpha_s, beta, chunk_bytes) for c in costs)
        if start == 0.0 and a1 >= a2:
            return None  # no faster even for the smallest message
        if b1 > b2 and (root := (a2 - a1) / (b1 - b2)) <= end:
            return max(root, start)
    return None
