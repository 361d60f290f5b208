"""How long a piece of work would take on an idle machine, measured on a busy one.

CI runs two pytest workers on two cores beside browsers and rank processes, so a wall-clock
time can be two or three times what the same work takes alone. ``Usage`` keeps what load cannot
inflate, and ``idle_bound_s`` turns it into a time: the largest of three lower bounds of the
idle-machine time,

* the root process's own CPU seconds (a notebook kernel or a handler runs on one thread),
* the CPU seconds of the root and every process it started, over the machine's cores,
* the wall time less the time the processes sat runnable, waiting for a core (Linux counts it
  per thread in ``/proc/<pid>/schedstat``): what is left is computing and deliberate waiting
  (sleeps, timeouts, pipes), which an idle machine does not shorten either,

taken over short intervals and summed (``ProcessTreeMeter``). Work that takes two minutes alone
gives two minutes by one of the three, whatever the load; load raises none of them (it slows
computing a little through shared caches, the only noise left). Without schedstat (not Linux)
the third bound is missing.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

import psutil

CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def waited_for_core_s(pid: int | str = "thread-self") -> float | None:
    """Seconds the main thread of ``pid`` (default: the calling thread) has spent runnable but
    waiting for a core, from Linux's schedstat; None where the kernel does not report it."""
    try:
        with open(f"/proc/{pid}/schedstat", encoding="ascii") as file:
            return int(file.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def schedstat_available() -> bool:
    """Whether this machine reports waits for a core (CI requires it: the wall bound needs it)."""
    return waited_for_core_s() is not None


def idle_bound_s(wall_s: float, waited_s: float | None, root_cpu_s: float, tree_cpu_s: float,
                 cores: int = CORES) -> float:
    """The largest of the three lower bounds of a stretch of work's idle-machine time (the wall
    bound is left out when ``waited_s`` is None)."""
    bounds = [root_cpu_s, tree_cpu_s / cores]
    if waited_s is not None:
        bounds.append(wall_s - waited_s)
    return max(bounds)


@dataclass(frozen=True)
class Usage:
    """One run's wall time, waits for a core, CPU seconds of its root process and of its tree,
    and ``idle_s``, the estimate of its time on an idle machine."""

    wall_s: float
    waited_s: float | None  # None: not measurable here
    root_cpu_s: float
    tree_cpu_s: float  # the root, every descendant, and the children they reaped
    idle_s: float


def _tree(root: psutil.Process) -> list[psutil.Process]:
    try:
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _cpu_s(process: psutil.Process, reaped: bool = True) -> float:
    """CPU seconds of ``process`` (and of the children it reaped, with ``reaped``); 0 once gone."""
    try:
        times = process.cpu_times()
    except psutil.NoSuchProcess:
        return 0.0
    own = times.user + times.system
    return own + (times.children_user + times.children_system if reaped else 0.0)


class ProcessTreeMeter:
    """Measures a process and its descendants between ``start()`` and ``stop()``.

    A thread samples the tree every ``interval_s``: CPU seconds (a descendant that ended counts
    once its parent in the tree reaped it, as ``multiprocessing`` and ``subprocess`` do) and each
    process's waits for a core (read while it lives: one that starts and ends between two samples
    loses its last interval's wait, which raises the estimate a little, never lowers it). The
    three bounds are taken interval by interval and summed, so a sleep and a burst of ranks
    computing side by side in one run each count for their own time: on totals, the ranks'
    waits (several per second of wall time) would cancel the sleep.
    """

    def __init__(self, pid: int, interval_s: float = 0.25) -> None:
        self.root, self.interval_s = psutil.Process(pid), interval_s
        self._first: dict[int, float] = {}  # pid -> its wait when first seen (0 if started since)
        self._last: dict[int, float] = {}
        self._measurable = waited_for_core_s(pid) is not None
        self._idle_s = 0.0
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample_until_done, name="process-tree-meter", daemon=True)

    def start(self) -> ProcessTreeMeter:
        self._start = self._previous = self._snapshot(initial=True)
        self._sampler.start()
        return self

    def stop(self) -> Usage:
        self._done.set()
        self._sampler.join()
        self._advance()
        (start, end) = (self._start, self._previous)
        return Usage(end[0] - start[0], end[3] - start[3] if self._measurable else None, end[1] - start[1],
                     end[2] - start[2], self._idle_s)

    def _sample_until_done(self) -> None:
        while not self._done.wait(self.interval_s):
            self._advance()

    def _advance(self) -> None:
        now, before = self._snapshot(), self._previous
        self._idle_s += idle_bound_s(now[0] - before[0], now[3] - before[3] if self._measurable else None,
                                     max(0.0, now[1] - before[1]), max(0.0, now[2] - before[2]))
        self._previous = now

    def _snapshot(self, initial: bool = False) -> tuple[float, float, float, float]:
        """(time, root CPU, tree CPU, waits for a core since the start) now."""
        wall, processes = time.perf_counter(), _tree(self.root)
        for process in processes:
            waited = waited_for_core_s(process.pid)
            if waited is not None:
                self._first.setdefault(process.pid, waited if initial else 0.0)
                self._last[process.pid] = waited
        waits = sum(self._last[pid] - self._first[pid] for pid in self._last)
        return wall, _cpu_s(self.root, reaped=False), sum(map(_cpu_s, processes)), waits


class HandlerClock:
    """Times a call made on this thread (a widget handler): ``with HandlerClock() as clock: ...``,
    then ``clock.usage``. The root is this process (``time.process_time``), its tree adds the
    children it reaped, and the waits are this thread's."""

    def __enter__(self) -> HandlerClock:
        self._children, self._cpu = _reaped_children_s(), time.process_time()
        self._waited, self._wall = waited_for_core_s(), time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        wall, cpu, waited = time.perf_counter() - self._wall, time.process_time() - self._cpu, waited_for_core_s()
        waited = None if waited is None else waited - self._waited
        tree = cpu + _reaped_children_s() - self._children
        self.usage = Usage(wall, waited, cpu, tree, idle_bound_s(wall, waited, cpu, tree))


def _reaped_children_s() -> float:
    times = os.times()
    return times.children_user + times.children_system
