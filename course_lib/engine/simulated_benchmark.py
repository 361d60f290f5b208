"""How fast simulated mode runs: ``python -m course_lib.engine.simulated_benchmark``.

Times a 1,000-request Poisson trace (Llama-3.1-8B on an H100, shared system prompt) and one
setting of module 03's token-budget slider, several times each, and prints the median and the
fastest run side by side (shared CPUs are noisy; the fastest run is the least disturbed).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

from course_lib.engine.simulated import SimulatedEngine, simulate_budget
from course_lib.perf.hardware import get_gpu
from course_lib.perf.models import get_model
from course_lib.perf.workloads import document_among_chats, poisson


def time_runs(run: Callable[[], object], repeats: int) -> list[float]:
    """Wall-clock seconds of ``repeats`` calls of ``run``."""
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - started)
    return seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    model, gpu = get_model("Llama-3.1-8B"), get_gpu("H100-80GB")
    trace = poisson(1000, rate_per_s=20, system_prompt_len=256, seed=1)
    report = SimulatedEngine(model, gpu, max_model_len=8192).run(trace)
    request_steps = sum(len(step.scheduled) for step in report.steps)
    document = document_among_chats(num_chat_users=32, document_at=1.0, duration_s=4.0, chat_output_len=600)
    cases = {
        f"1,000 requests ({len(report.steps):,} steps, {request_steps:,} request-steps)":
            lambda: SimulatedEngine(model, gpu, max_model_len=8192).run(trace),
        "module 03 slider: 16k document among 32 chats, budget 2048":
            lambda: simulate_budget(model, gpu, document, 2048),
    }
    print(f"{'case':66} {'median':>8} {'fastest':>8}")
    for name, run in cases.items():
        seconds = time_runs(run, args.repeats)
        print(f"{name:66} {statistics.median(seconds):7.3f}s {min(seconds):7.3f}s", flush=True)


if __name__ == "__main__":
    main()
