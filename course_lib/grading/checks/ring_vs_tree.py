"""Exercise 06's tasks: the ring's chunk schedule, the ring all-reduce on real ranks, ring or tree by alpha-beta."""

from __future__ import annotations

import functools
import random

import torch
import torch.distributed as dist

from course_lib.collectives.launch import run_on_ranks
from course_lib.collectives.ring import ring_all_reduce
from course_lib.grading.checks.collectives import (FLOAT32, describe_on_ranks, only_allowed_calls, only_calls_hint,
                                                   rank_inputs, summed_with_allowed_calls)
from course_lib.grading.task import Case, Task
from course_lib.perf.comm import BINARY_TREE, RING


def _sent_chunks() -> list:
    return [(t.phase, t.chunk) for t in ring_all_reduce(torch.zeros(dist.get_world_size())).transfers]


@functools.lru_cache(maxsize=None)
def course_schedule(world_size: int) -> tuple:
    """Per rank, the course ring's (phase, chunk sent, chunk received) in each step of a real run."""
    sent = run_on_ranks(_sent_chunks, world_size, on_print=lambda rank, line: None)
    # what rank r receives in a step is what its left neighbour sends
    return tuple([(phase, chunk, sent[(r - 1) % world_size][i][1]) for i, (phase, chunk) in enumerate(sent[r])]
                 for r in range(world_size))


def _schedule_cases() -> list[Case]:
    cases = [Case((0, 4), why="rank 0 of 4"), Case((1, 2), why="the smallest ring")]
    return cases + [Case((rank, world_size)) for world_size in (2, 3, 4, 6) for rank in range(world_size)]


def _schedule_hint(case: Case, expected, got) -> str | None:
    rank, world_size = case.args
    if len(got) != len(expected):
        return f"2(N-1) = {len(expected)} steps: N-1 of scatter-reduce, then N-1 of all-gather"
    if [tuple(g)[0] for g in got] != [e[0] for e in expected]:
        return "scatter-reduce steps first, then all-gather, with those exact phase names"
    return None


def _ring_cases() -> list[Case]:
    return [Case((2, rank_inputs(2, (10,), seed=6))),
            Case((3, rank_inputs(3, (7, 4), seed=6)), why="chunks of unequal size"),
            Case((4, rank_inputs(4, (64, 6), seed=6)),
                 why="6 elements on 4 ranks: tensor_split gives chunks of 2, 2, 1, 1 (tensor.chunk would give 3)"),
            Case((5, rank_inputs(5, (23,), seed=6)), why="5 ranks, chunks of 5 and 4")]


def _choice_cases() -> list[Case]:
    cases = [Case((512, 4096, 5e-6, 1 / 50e9), why="4 KB on 512 GPUs over InfiniBand"),
             Case((8, 2**30, 5e-6, 1 / 50e9), why="1 GiB on 8 GPUs"),
             Case((2, 0, 1e-6, 1e-10), why="a tie (2 ranks, nothing to send) goes to the ring"),
             Case((4, 4, 5.0, 1.0), why="an exact tie on 4 ranks goes to the ring"),
             Case((8, 2**20, 1e-5, 1 / 52.4288e9),
                  why="8 ranks, 1 MiB: the ring's 2(N-1) latency steps cost more than the tree's 2 log2(N)"),
             Case((4, 2**20, 1e-5, 1 / 116.5e9),
                  why="4 ranks, 1 MiB: the ring sends 2(N-1)/N of the bytes, the tree 4 times: the ring, narrowly")]
    rng = random.Random(6)
    for _ in range(200):
        n, size = rng.choice([2, 4, 8, 64, 512, 4096]), 2 ** rng.randint(10, 32)
        cases.append(Case((n, size, 10 ** rng.uniform(-7, -4), 1 / 10 ** rng.uniform(9, 12))))
    return cases


def faster_by_cost_model(n: int, num_bytes: int, alpha: float, beta: float) -> str:
    ring, tree = RING.time(n, num_bytes, alpha, beta), BINARY_TREE.time(n, num_bytes, alpha, beta)
    return "ring" if ring <= tree else "tree"


def _choice_hint(case: Case, expected, got) -> str | None:
    n, num_bytes, alpha, beta = case.args
    ring, tree = RING.time(n, num_bytes, alpha, beta), BINARY_TREE.time(n, num_bytes, alpha, beta)
    if got not in ("ring", "tree"):
        return "return the string 'ring' or 'tree'"
    if ring == tree:
        return "the two cost the same here: a tie goes to the ring"
    return f"the model gives ring {ring:.6g} s and tree {tree:.6g} s"


TASKS = (
    Task(1, "Who sends which chunk when", "ring_schedule", _schedule_cases, lambda rank, n: course_schedule(n)[rank],
         hint=_schedule_hint, examples=1),
    Task(2, "The ring all-reduce on real ranks", "my_ring_all_reduce", _ring_cases, summed_with_allowed_calls,
         rule=FLOAT32, hint=only_calls_hint("point_to_point"), call=only_allowed_calls("point_to_point"),
         describe=describe_on_ranks("my_ring_all_reduce"), examples=0),
    Task(3, "Ring or tree?", "faster_algorithm", _choice_cases, faster_by_cost_model, hint=_choice_hint, examples=1),
)
