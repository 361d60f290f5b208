"""How long a cohort takes to grade, and how much memory it holds:
``python -m course_lib.grading.cohort_benchmark --learners 30 --jobs 1 2 4 [--json FILE]``.

It writes a synthetic cohort (``synthetic_cohort.py``: every exercise, tasks planted correct,
undone, wrong, error or slow), then runs ``python -m course_lib.grading.cohort`` on it once per
``--jobs`` value, exactly as an instructor would, under ``/usr/bin/time -v`` where it exists. Per
run it reports the wall time, the largest resident set of any one process (``time -v``), the
peak of the whole process tree's memory (every process the grader started, sandboxes included,
read from ``/proc`` every ``--sample-s``: resident sets summed, and PSS, which counts a page that
forked ranks share once), the machine's load average before and after, and every task whose
verdict is not the one its planted kind calls for (``synthetic_cohort.expected_passes``). The
machine's other work shows in the load: compare runs made together. Grading 30 learners took 4 to
19 minutes here (2 cores): use ``--learners 10`` for a quicker look.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from course_lib.grading.synthetic_cohort import draw_plan, expected_passes, write_cohort
from course_lib.paths import REPO_ROOT

PAGE = os.sysconf("SC_PAGE_SIZE")


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        parent = int(stat[stat.rindex(b")") + 2:].split()[1])
        children.setdefault(parent, []).append(int(entry))
    return children


def tree_memory(root: int) -> tuple[int, int, int]:
    """(resident bytes summed over ``root`` and all its descendants, their proportional set size
    (PSS: a page shared by forked ranks counted once in all), how many processes), from /proc."""
    children, rss, pss, count, todo = _children(), 0, 0, 0, [root]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, ()))
        try:
            with open(f"/proc/{pid}/statm") as handle:
                resident = int(handle.read().split()[1]) * PAGE
        except OSError:
            continue
        rss, count = rss + resident, count + 1
        try:
            with open(f"/proc/{pid}/smaps_rollup") as handle:
                pss += next(int(line.split()[1]) * 1024 for line in handle if line.startswith("Pss:"))
        except (OSError, StopIteration):
            pss += resident
    return rss, pss, count


def load() -> list[float]:
    with open("/proc/loadavg") as handle:
        return [float(x) for x in handle.read().split()[:3]]


def verdicts_match(plan: dict, grades_csv: Path) -> list[str]:
    """Where grades.csv disagrees with the plan (``expected_passes``): 'learner exercise task N: planted
    KIND, passed X'."""
    import csv

    rows: dict[tuple[str, str], list[bool]] = {}
    with open(grades_csv, newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            rows.setdefault((row["learner"], row["exercise"]), []).append(row["passed"] == "1")
    wrong = []
    for learner, modules in plan.items():
        for module, kinds in modules.items():
            passed = rows.get((learner, module), [])
            for task, (kind, expected) in enumerate(zip(kinds, expected_passes(module, kinds)), start=1):
                got = passed[task - 1] if task <= len(passed) else None
                if got is not expected:
                    wrong.append(f"{learner} {module} task {task}: planted {kind}, passed {got}")
    return wrong


def measure(submissions: Path, gradebook: Path, jobs: int, extra: list[str], sample_s: float) -> dict:
    command = [sys.executable, "-m", "course_lib.grading.cohort", str(submissions), "--out", str(gradebook),
               "--jobs", str(jobs), *extra]
    timer = Path("/usr/bin/time")  # GNU time: -v reports the largest process's resident set
    if timer.exists():
        command = [str(timer), "-v", *command]
    before = load()
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = {"rss": 0, "pss": 0, "processes": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for key, value in zip(("rss", "pss", "processes"), tree_memory(process.pid)):
                peak[key] = max(peak[key], value)
            done.wait(sample_s)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = process.communicate()
    wall = time.monotonic() - started
    done.set()
    sampler.join()
    biggest = re.search(r"Maximum resident set size \(kbytes\): (\d+)", err)
    result = {"jobs": jobs, "returncode": process.returncode, "wall_s": round(wall, 1),
              "max_rss_one_process_mib": round(int(biggest.group(1)) / 1024) if biggest else None,
              "peak_tree_rss_mib": round(peak["rss"] / 2**20), "peak_tree_pss_mib": round(peak["pss"] / 2**20),
              "peak_processes": peak["processes"],
              "load_before": before, "load_after": load()}
    if process.returncode != 0:
        result["stderr_tail"] = err[-2000:]
        result["stdout_tail"] = out[-2000:]
    return result


def machine() -> dict:
    from course_lib.grading.capacity import memory_available_bytes

    return {"cpus": os.cpu_count(), "memory_total_gib": round(os.sysconf("SC_PHYS_PAGES") * PAGE / 2**30, 1),
            "memory_available_gib": round(memory_available_bytes() / 2**30, 1), "python": platform.python_version(),
            "kernel": platform.release()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.grading.cohort_benchmark",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--learners", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--exercise", action="append", help="only these modules (default: all)")
    parser.add_argument("--sample-s", type=float, default=0.5, help="how often the process tree is measured")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--keep", type=Path, help="write the cohort and the gradebooks here and keep them")
    parser.add_argument("grader_args", nargs=argparse.REMAINDER,
                        help="after --, passed to the grader (e.g. -- --memory-limit-gb 4)")
    args = parser.parse_args(argv)
    extra = [a for a in args.grader_args if a != "--"]
    base = args.keep or Path(tempfile.mkdtemp(prefix="cohort-benchmark-", dir="/var/tmp"
                                              if os.access("/var/tmp", os.W_OK) else None))
    try:
        plan = draw_plan(args.learners, args.seed, args.exercise)
        write_cohort(base / "submissions", plan)
        if args.exercise:
            extra += [flag for module in args.exercise for flag in ("--exercise", module)]
        report = {"machine": machine(), "learners": args.learners, "seed": args.seed,
                  "notebooks": sum(len(modules) for modules in plan.values()), "grader_args": extra, "runs": []}
        for jobs in args.jobs:
            gradebook = base / f"gradebook-jobs{jobs}"
            run = measure(base / "submissions", gradebook, jobs, extra, args.sample_s)
            if run["returncode"] == 0:
                run["verdicts_off_plan"] = verdicts_match(plan, gradebook / "grades.csv")[:20]
            report["runs"].append(run)
            print(json.dumps(run), flush=True)
        if args.json:
            args.json.write_text(json.dumps(report, indent=1) + "\n")
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
