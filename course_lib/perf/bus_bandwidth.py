"""Algorithm bandwidth and bus bandwidth, with nccl-tests' factors.

A collective's *algorithm bandwidth* (algbw) is the buffer size over the time it took. It
cannot be held against a link's peak: an all-reduce moves each byte about twice over the
busiest link (reduce-scatter, then all-gather), a broadcast once, and the share grows with the
number of ranks. The *bus bandwidth* (busbw) multiplies algbw by the factor that counts those
crossings for the best algorithm, so it is what one rank's link actually carried. That takes the
algorithm out of the figure: every collective, at every rank count, is then comparable with
the hardware's link bandwidth and with each other.

Example: a 1 GB all-reduce over 8 GPUs at a measured algbw of 100 GB/s has the factor
2 x 7 / 8 = 1.75, so a busbw of 175 GB/s, the number to read against NVLink's peak.

``num_bytes`` follows nccl-tests: the full buffer (the output of an all-gather, the input of a
reduce-scatter, the whole buffer of an all-to-all, the buffer of the others).
"""

from __future__ import annotations

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce")


def bus_factor(collective: str, num_ranks: int) -> float:
    """busbw / algbw: 2(N-1)/N for all_reduce; (N-1)/N for all_gather, reduce_scatter and
    all_to_all; 1 for broadcast and reduce."""
    if collective not in COLLECTIVES:
        raise ValueError(f"Unknown collective {collective!r}; choose one of {', '.join(COLLECTIVES)}.")
    if num_ranks < 1:
        raise ValueError(f"num_ranks must be at least 1, got {num_ranks}.")
    if collective == "all_reduce":
        return 2 * (num_ranks - 1) / num_ranks
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (num_ranks - 1) / num_ranks
    return 1.0


def algorithm_bandwidth(num_bytes: float, seconds: float) -> float:
    """Bytes per second: the full buffer (see the module docstring) over the time of one call."""
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, got {seconds}.")
    return num_bytes / seconds


def bus_bandwidth(collective: str, algbw: float, num_ranks: int) -> float:
    """The bandwidth one rank's link carried: ``algbw`` x ``bus_factor``, in algbw's unit."""
    return algbw * bus_factor(collective, num_ranks)
