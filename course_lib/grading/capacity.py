"""How many notebooks the cohort grader runs at once, and how much memory each may take, from
the machine's memory and cores, so that ``--jobs N`` cannot take more memory than there is.

A job is one notebook's sandbox. Every process in it is capped at the notebook's memory limit
(``RLIMIT_AS``, address space), and its private ``/tmp`` and ``/dev/shm`` can hold
``Limits.scratch_bytes`` each on top (tmpfs, which the cap does not count), so one job holds at
most ``memory + 2 x scratch`` while it runs one big process. The grader needs what is *available*
now (``MemAvailable``, lowered to what a container's cgroup still allows): on the hub's box the
learners' servers hold part of the memory, and grading must not push them out. Of that, ``RESERVE_BYTES``
is kept for the grader's own process and the system, and the rest is shared by the jobs:

  memory limit per notebook  min(8 GiB, usable / jobs - 2 x scratch)  when not given
  --jobs                     min(cores, usable // (MIN_NOTEBOOK_BYTES + 2 x scratch)), at least 1
  refused                    jobs x (memory + 2 x scratch) > usable, or a default below
                             MIN_NOTEBOOK_BYTES: the message says which --jobs or --memory-limit-gb fits

Measured (2 cores, 24 GiB): every solution of exercises 01-09 passes under a 1.5 GiB cap (at 1 GiB
exercise 07's four gloo ranks fail), hence ``MIN_NOTEBOOK_BYTES`` = 2 GiB with a margin; grading 270
notebooks, the grader's own process peaked at 330 MiB and a notebook's processes at about 0.25 GiB
of PSS, hence ``RESERVE_BYTES`` = 1 GiB. A notebook's rank processes (up to 4) each get the cap, but
honest ranks are forked and share most of their pages; a learner who starts many big processes on
purpose is stopped only by the time limit (there is no process-count limit without a cgroup).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

GIB = 2**30
RESERVE_BYTES = 1 * GIB          # the grader's own process (measured: at most 330 MiB) and the system
MIN_NOTEBOOK_BYTES = 2 * GIB     # the least address space the course's solutions are known to pass with
MAX_NOTEBOOK_BYTES = 8 * GIB     # the default cap on a machine with memory to spare
SCRATCH_BYTES = 512 * 2**20      # sandbox.Limits.scratch_bytes: each of /tmp and /dev/shm
_UNLIMITED = 2**60               # a cgroup v1 limit this high means none


def _meminfo_available(meminfo: Path) -> int | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (cgroup v2: no limit) reads as None


def _cgroup_room(cgroup_root: Path, proc_cgroup: Path) -> int | None:
    """What this process's memory cgroup still allows (limit minus usage), or None when unlimited."""
    folders = []
    try:
        for line in proc_cgroup.read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            relative = path.lstrip("/")
            if controllers == "":  # cgroup v2
                folders.append((cgroup_root / relative, "memory.max", "memory.current"))
                folders.append((cgroup_root, "memory.max", "memory.current"))
            elif "memory" in controllers.split(","):  # cgroup v1
                folders.append((cgroup_root / "memory" / relative, "memory.limit_in_bytes", "memory.usage_in_bytes"))
                folders.append((cgroup_root / "memory", "memory.limit_in_bytes", "memory.usage_in_bytes"))
    except (OSError, ValueError):
        return None
    rooms = []
    for folder, limit_file, usage_file in folders:
        limit, usage = _read_int(folder / limit_file), _read_int(folder / usage_file)
        if limit is not None and limit < _UNLIMITED and usage is not None:
            rooms.append(max(0, limit - usage))
    return min(rooms) if rooms else None


def memory_available_bytes(meminfo: Path = Path("/proc/meminfo"), cgroup_root: Path = Path("/sys/fs/cgroup"),
                           proc_cgroup: Path = Path("/proc/self/cgroup")) -> int:
    """Memory available now: MemAvailable, or less where a memory cgroup (a container) allows less;
    the machine's physical memory where neither can be read."""
    found = [room for room in (_meminfo_available(meminfo), _cgroup_room(cgroup_root, proc_cgroup))
             if room is not None]
    if found:
        return min(found)
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


class Oversubscribed(ValueError):
    """--jobs and --memory-limit-gb ask for more memory than the machine has available; the message
    says what fits."""


@dataclass(frozen=True)
class Capacity:
    jobs: int
    memory_bytes: int    # the address-space cap of every process of one notebook
    available_bytes: int
    usable_bytes: int    # available minus RESERVE_BYTES: what the jobs share

    def describe(self) -> str:
        return (f"{self.jobs} job(s) at once, {self.memory_bytes / GIB:.1f} GiB per notebook "
                f"({self.available_bytes / GIB:.1f} GiB available, {RESERVE_BYTES / GIB:g} GiB kept for the grader "
                f"and the system)")


def _gib(value: float) -> str:
    return f"{value / GIB:.1f}".rstrip("0").rstrip(".")


def choose_capacity(available_bytes: int, cpus: int, jobs: int | None = None, memory_bytes: int | None = None,
                    scratch_bytes: int = SCRATCH_BYTES) -> Capacity:
    """The jobs and per-notebook memory to grade with on a machine with ``available_bytes`` free
    and ``cpus`` cores; ``jobs`` and ``memory_bytes`` are the caller's choices (None: chosen here).
    Raises ``Oversubscribed`` (its message says what to change) where they cannot fit."""
    if jobs is not None and jobs < 1:
        raise ValueError(f"--jobs must be at least 1, not {jobs}")
    usable = available_bytes - RESERVE_BYTES
    per_job_extra = 2 * scratch_bytes
    fit_min = max(0, usable // (MIN_NOTEBOOK_BYTES + per_job_extra))
    where = (f"this machine has {_gib(available_bytes)} GiB available; {_gib(RESERVE_BYTES)} GiB is kept for the "
             f"grader and the system, and each notebook's /tmp and /dev/shm may hold {_gib(per_job_extra)} GiB more")
    if fit_min < 1:
        raise Oversubscribed(f"not enough memory to grade even one notebook: {where}, and a notebook needs "
                             f"{_gib(MIN_NOTEBOOK_BYTES)} GiB. Free some memory (stop idle learner servers) and "
                             "run it again.")
    if jobs is None:
        if memory_bytes is None:
            jobs = max(1, min(cpus, fit_min))
        else:
            jobs = max(1, min(cpus, usable // (memory_bytes + per_job_extra)))
    if memory_bytes is None:
        memory = min(MAX_NOTEBOOK_BYTES, usable // jobs - per_job_extra)
        if memory < MIN_NOTEBOOK_BYTES:
            raise Oversubscribed(f"--jobs {jobs} leaves {_gib(max(memory, 0))} GiB per notebook: {where}, and a "
                                 f"notebook needs {_gib(MIN_NOTEBOOK_BYTES)} GiB. Use --jobs {fit_min} or fewer.")
        return Capacity(jobs, int(memory), available_bytes, usable)
    needed = jobs * (memory_bytes + per_job_extra)
    if needed > usable:
        fits_jobs = usable // (memory_bytes + per_job_extra)
        fits_memory = usable // jobs - per_job_extra
        options = []
        if fits_jobs >= 1:
            options.append(f"--jobs {fits_jobs}")
        if fits_memory >= MIN_NOTEBOOK_BYTES:
            options.append(f"--memory-limit-gb {_gib(fits_memory // (GIB // 10) * (GIB // 10))}")
        if not options:
            options.append(f"--jobs {fit_min} --memory-limit-gb {_gib(MIN_NOTEBOOK_BYTES)}")
        raise Oversubscribed(f"--jobs {jobs} x --memory-limit-gb {_gib(memory_bytes)} could take "
                             f"{_gib(needed)} GiB: {where}, so {_gib(usable)} GiB is what the jobs may share. "
                             f"Use {' or '.join(options)} (or leave --memory-limit-gb out to have it chosen).")
    return Capacity(jobs, int(memory_bytes), available_bytes, usable)
