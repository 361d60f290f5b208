"""Exercise 02's tasks: static batching's steps and idle slots, continuous batching's steps, against the real scheduler."""

from __future__ import annotations

import random

from course_lib.engine.batch_slots import slot_occupancy
from course_lib.engine.simulated import SimulatedEngine
from course_lib.grading.task import Case, Task
from course_lib.perf.hardware import get_gpu
from course_lib.perf.models import ModelSpec
from course_lib.perf.workloads import WorkloadRequest

TINY = ModelSpec("tiny", 2, 4, 2, 8, 1e5, 4096, hidden_size=32, intermediate_size=64, vocab_size=256)
LONG_BATCH = [2000] + [50] * 7


def engine_steps(output_lens: list[int], num_slots: int, policy: str) -> list[dict]:
    """What the real scheduler runs in each step for these requests (tiny prompts, a generous token budget)."""
    engine = SimulatedEngine(TINY, get_gpu("H100-80GB"), max_model_len=4096, max_num_seqs=num_slots,
                             num_gpu_blocks=4096, max_num_batched_tokens=4096, scheduling_policy=policy)
    report = engine.run([WorkloadRequest(0.0, (7, i), n) for i, n in enumerate(output_lens)])
    return [step.scheduled for step in report.steps]


def _random_cases(seed: int) -> list[Case]:
    rng = random.Random(seed)
    return [Case(([rng.randint(1, 40) for _ in range(rng.randint(1, 15))], rng.randint(1, 5))) for _ in range(20)]


def _static_cases() -> list[Case]:
    return [Case((LONG_BATCH, 8), why="one 2000-token request among seven of 50"),
            Case(([1, 10, 1, 10], 2), why="batches form in arrival order, not sorted by length"),
            Case(([3, 5], 4), why="fewer requests than slots"),
            Case(([2, 2, 3, 3], 2), why="two full batches")] + _random_cases(1)


def _idle_cases() -> list[Case]:
    return [Case((LONG_BATCH, 8), why="one 2000-token request among seven of 50"),
            Case(([5, 5, 5], 2), why="the last batch is half empty: its empty slot is idle for the whole batch"),
            Case(([1, 10, 1, 10], 2), why="batches form in arrival order")] + _random_cases(2)


def _continuous_cases() -> list[Case]:
    return [Case((LONG_BATCH * 8, 8), why="eight batches like the one above, continuously"),
            Case(([10, 1, 1, 5], 2), why="the next request takes the slot that frees first"),
            Case(([3], 4), why="fewer requests than slots"),
            Case(([4, 4, 4, 4], 2), why="slots that free in the same step")] + _random_cases(3)


def _static_hint(case: Case, expected, got) -> str | None:
    lens, slots = case.args
    if got == sum(max(b) for b in (sorted(lens)[i:i + slots] for i in range(0, len(lens), slots))):
        return "that is the count for requests sorted by length; batches form in arrival order"
    if got == max(lens):
        return "each batch runs until its longest request finishes, then the next batch starts"
    return None


def _idle_hint(case: Case, expected, got) -> str | None:
    lens, slots = case.args
    if got == expected - (slots - len(lens) % slots) % slots * max(lens[len(lens) - len(lens) % slots:] or [0]):
        return "a batch with fewer requests than slots leaves its empty slots idle too"
    return None


def _continuous_hint(case: Case, expected, got) -> str | None:
    lens, slots = case.args
    if got == -(-sum(lens) // slots):
        return "the total work divided by the slots ignores that one long request can finish last"
    return None


TASKS = (
    Task(1, "Steps under static batching", "static_steps", _static_cases,
         lambda lens, slots: len(engine_steps(lens, slots, "static")), hint=_static_hint, examples=1),
    Task(2, "Idle slot-steps under static batching", "static_idle_slot_steps", _idle_cases,
         lambda lens, slots: sum(r is None for row in slot_occupancy(engine_steps(lens, slots, "static"), slots)
                                 for r in row), hint=_idle_hint, examples=2),
    Task(3, "Steps under continuous batching", "continuous_steps", _continuous_cases,
         lambda lens, slots: len(engine_steps(lens, slots, "continuous")), hint=_continuous_hint, examples=2),
)
