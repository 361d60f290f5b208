"""How reliably and how fast ``run_on_ranks`` starts its ranks: many launches of a trivial function.

    .venv/bin/python -m course_lib.collectives.launch_benchmark --repeats 60 --worlds 8 4

Launches alternate between the world sizes (8, 4, 8, 4, ...), so machine load hits each alike.
Each launch's wall time is measured with the CPU time its ranks and the caller used; a launch is a
*stall* when its wall time exceeds ``--stall-s`` (1 s: the course's limit for a widget's answer),
a *failure* when it raises, and *retried* when the launcher started its ranks again after they
lost a connection while joining (a failure the caller never sees, but pays for in time). The
report gives, per world size, launches, failures, retries, stalls, median and maximum wall time,
and the worst *wait* (wall time beyond the launch's CPU time spread over the machine's cores: time
nobody computed, e.g. a rank waiting out a DNS timeout).
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import statistics
import time
from dataclasses import dataclass

import torch.distributed as dist

from course_lib.collectives import launch


def rank_number() -> int:
    """The trivial function each launch runs: no communication beyond joining the group."""
    return dist.get_rank()


@dataclass(frozen=True)
class Launch:
    """One launch: its world size, wall and CPU seconds, the retries it needed, and the line that
    explains its failure (None if it worked)."""

    world_size: int
    wall_s: float
    cpu_s: float
    retries: int
    error: str | None

    @property
    def wait_s(self) -> float:
        """Wall time beyond the CPU time spread over the machine's cores (never below zero)."""
        return max(0.0, self.wall_s - self.cpu_s / _cores())


def _cores() -> int:
    """The cores this process may run on (a container's share, not the host's count where the OS says)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _cpu_seconds() -> float:
    """CPU time of this process and of its children that have been waited for."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class _Warnings(logging.Handler):
    """Counts the launcher's warnings: one per retried start."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


def launch_once(world_size: int, timeout_s: float = 30.0) -> Launch:
    """Run ``rank_number`` on ``world_size`` ranks and measure it; a failure is recorded, not raised."""
    retries, logger = _Warnings(), logging.getLogger(launch.__name__)
    logger.addHandler(retries)
    started, cpu_before = time.monotonic(), _cpu_seconds()
    error = None
    try:
        if launch.run_on_ranks(rank_number, world_size, timeout_s=timeout_s,
                               on_print=lambda rank, line: None) != list(range(world_size)):
            error = "wrong results"
    except Exception as failure:  # noqa: BLE001 - counting failures is the point
        error = f"{type(failure).__name__}: {getattr(failure, 'cause', '') or str(failure).splitlines()[0]}"
    finally:
        logger.removeHandler(retries)
    return Launch(world_size, time.monotonic() - started, _cpu_seconds() - cpu_before, retries.count, error)


def launch_many(worlds: list[int], repeats: int, timeout_s: float = 30.0) -> list[Launch]:
    """``repeats`` launches of each world size, interleaved."""
    return [launch_once(world, timeout_s) for _ in range(repeats) for world in worlds]


def report(launches: list[Launch], stall_s: float = 1.0) -> str:
    """One row per world size, largest first, then one line per failed launch."""
    lines = [f"{'ranks':>5} {'launches':>8} {'failed':>6} {'retried':>7} {'stalls>' + format(stall_s, 'g') + 's':>10} "
             f"{'median s':>8} {'max s':>6} {'max wait s':>10}"]
    for world in sorted({launch.world_size for launch in launches}, reverse=True):
        mine = [launch for launch in launches if launch.world_size == world]
        walls = [launch.wall_s for launch in mine]
        lines.append(f"{world:>5} {len(mine):>8} {sum(launch.error is not None for launch in mine):>6} "
                     f"{sum(launch.retries > 0 for launch in mine):>7} {sum(wall > stall_s for wall in walls):>10} {statistics.median(walls):>8.3f} "
                     f"{max(walls):>6.2f} {max(launch.wait_s for launch in mine):>10.2f}")
    lines += [f"failed: {launch.world_size} ranks, {launch.error}" for launch in launches if launch.error]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=60, help="launches per world size")
    parser.add_argument("--worlds", type=int, nargs="+", default=[8, 4], help="world sizes, launched in turn")
    parser.add_argument("--stall-s", type=float, default=1.0, help="a launch slower than this is a stall")
    options = parser.parse_args(argv)
    launches = launch_many(options.worlds, options.repeats)
    print(report(launches, options.stall_s))


if __name__ == "__main__":
    main()
