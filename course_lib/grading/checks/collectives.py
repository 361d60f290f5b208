"""Exercise 05's tasks, run on real ranks: all-reduce from reduce-scatter + all-gather, from reduce +
broadcast, and DDP's gradient average. The grader computes the sums and the full-batch gradient itself."""

from __future__ import annotations

import torch

from course_lib.grading.calls import ddp_problem
from course_lib.grading.task import Case, Task
from course_lib.grading.values import Rule, same_value, to_plain

FLOAT32 = Rule(rel_tol=1e-5, abs_tol=1e-5)


def rank_inputs(world_size: int, sizes: tuple[int, ...], seed: int = 0) -> list[list[list[float]]]:
    """Per rank, one random 1-D tensor (as a list) of each size; ranks hold different data."""
    return [[torch.randn(size, generator=torch.Generator().manual_seed(seed + 100 * rank + size)).tolist()
             for size in sizes] for rank in range(world_size)]


def summed_on_every_rank(world_size: int, inputs: list) -> list:
    """What an all-reduce leaves on every rank: each tensor summed element-wise over the ranks."""
    sums = [torch.tensor([inputs[r][i] for r in range(world_size)], dtype=torch.float64).sum(0).tolist()
            for i in range(len(inputs[0]))]
    return [sums] * world_size


def describe_on_ranks(function: str) -> callable:
    def describe(case: Case) -> str:
        world_size, inputs = case.args
        sizes = ", ".join(str(len(t)) for t in inputs[0])
        return f"{function}(tensor) on {world_size} ranks, 1-D tensors of {sizes} elements"
    return describe


def _close(a, b) -> bool:
    return same_value(to_plain(a), to_plain(b), FLOAT32)


def first_difference(expected: list, got: list) -> str:
    """Where per-rank results first differ: "rank 1, tensor 0, element 2: expected 0.5, got 1.5"."""
    for rank, (want, have) in enumerate(zip(expected, got)):
        for index, (a, b) in enumerate(zip(want, have)):
            if len(a) != len(b):
                return f"rank {rank}, tensor {index}: {len(b)} elements where {len(a)} are expected"
            for element, (x, y) in enumerate(zip(a, b)):
                if not _close(x, y):
                    return f"rank {rank}, tensor {index}, element {element}: expected {x:.6g}, got {y:.6g}"
    return ""


def in_place_hint(case: Case, expected, got) -> str | None:
    world_size, inputs = case.args
    where = first_difference(expected, got)
    if _close(got, inputs):
        return "every tensor is unchanged: write the result into `tensor` itself (in place, e.g. tensor.copy_(...))"
    if _close(got[0], expected[0]):
        return f"rank 0 has the sum but other ranks do not: every rank must end with it ({where})"
    if _close([[[world_size * x for x in t] for t in rank] for rank in got], expected):
        return "that is the mean; an all-reduce here sums"
    return where or None


def _shard_cases() -> list[Case]:
    return [Case((world_size, rank_inputs(world_size, (4, 8, 24), seed=world_size)), why="three lengths that divide by N")
            for world_size in (2, 4)]


def _root_cases() -> list[Case]:
    return [Case((world_size, rank_inputs(world_size, (3, 5, 16), seed=world_size)), why="lengths that need not divide by N")
            for world_size in (2, 3, 4)]


def full_batch_gradients(world_size: int, rows_per_rank: int) -> list:
    """Every rank's expected gradients: those of the whole batch's loss on one process."""
    model, inputs, targets = ddp_problem(world_size, rows_per_rank)
    torch.nn.functional.mse_loss(model(inputs), targets).backward()
    return [[parameter.grad.tolist() for parameter in model.parameters()]] * world_size


def local_gradients(world_size: int, rows_per_rank: int, problem=ddp_problem) -> list:
    """Per rank, the gradients of its own rows only (what a rank holds before any averaging)."""
    grads = []
    for rank in range(world_size):
        model, inputs, targets = problem(world_size, rows_per_rank)
        mine = slice(rank * rows_per_rank, (rank + 1) * rows_per_rank)
        torch.nn.functional.mse_loss(model(inputs[mine]), targets[mine]).backward()
        grads.append([parameter.grad.tolist() for parameter in model.parameters()])
    return grads


def _flat(value) -> list[float]:
    return [x for item in value for x in _flat(item)] if isinstance(value, (list, tuple)) else [value]


def _ddp_hint(case: Case, expected, got) -> str | None:
    world_size, rows = case.args
    near = lambda a, b: len(a) == len(b) and all(abs(x - y) < 1e-4 for x, y in zip(a, b))  # noqa: E731
    if near(_flat(got), _flat(local_gradients(world_size, rows))):
        return "the gradients did not change: write the averaged gradient back into each parameter's .grad"
    if near(_flat(got), [world_size * x for x in _flat(expected)]):
        return "that is the sum over ranks: divide by the number of ranks"
    return None


TASKS = (
    Task(1, "AllReduce = ReduceScatter + AllGather", "all_reduce_via_shards", _shard_cases, summed_on_every_rank,
         rule=FLOAT32, hint=in_place_hint, call="in_place_on_ranks", describe=describe_on_ranks("all_reduce_via_shards"),
         examples=0),
    Task(2, "AllReduce = Reduce + Broadcast", "all_reduce_via_root", _root_cases, summed_on_every_rank,
         rule=FLOAT32, hint=in_place_hint, call="in_place_on_ranks", describe=describe_on_ranks("all_reduce_via_root"),
         examples=0),
    Task(3, "Data parallel: average the gradients", "average_gradients",
         lambda: [Case((2, 4), why="2 ranks, 4 rows each"), Case((4, 4), why="4 ranks, 4 rows each")],
         full_batch_gradients, rule=FLOAT32, hint=_ddp_hint, call="ddp_gradients",
         describe=lambda case: f"average_gradients(model) on {case.args[0]} ranks, {case.args[1]} rows each",
         examples=0),
)
