"""Exercise 05's tasks, run on real ranks: all-reduce from reduce-scatter + all-gather, from reduce +
broadcast, and DDP's gradient average. The grader computes the sums and the full-batch gradient itself.

Tasks 1 and 2 (and exercise 06's ring) say which calls to make, so the learner's process also reports
every communication a rank made (``calls._record_every_call``) outside the calls the task allows:
one ``dist.all_reduce(tensor)`` gives the right sums but breaks the task. The call kinds join
``calls.CALLS`` when this module is imported, as it is in the learner's process by the set-up cell's
``Checker``:

  in_place_on_ranks_only_<calls>  args ``(world_size, inputs)`` as ``in_place_on_ranks``; returns per
                     rank ``{"other calls": the names of the calls made outside ALLOWED[<calls>], sorted,
                     "tensors": each tensor's contents after the call}``
"""

from __future__ import annotations

import torch

from course_lib.grading import calls
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


# The torch.distributed calls each task allows (as ``calls._record_every_call`` names them), besides
# barriers and setting up groups.
ANYWHERE = ("barrier", "monitored_barrier") + calls.SETUP_CALLS
ALLOWED = {
    "shards": ("reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced", "all_gather",
               "all_gather_into_tensor", "all_gather_coalesced", "all_gather_into_tensor_coalesced",
               "functional reduce_scatter_tensor", "functional all_gather_into_tensor"),
    "root": ("reduce", "broadcast", "functional broadcast"),
    "point_to_point": ("send", "recv"),
}
ALLOWED_TEXT = {"shards": "a reduce-scatter and an all-gather", "root": "dist.reduce and dist.broadcast",
                "point_to_point": "point-to-point calls (isend, irecv, send, recv)"}


def _only_rank(fn, inputs: list, allowed: str) -> dict:
    """``in_place_on_ranks``' rank, also reporting the calls made outside ``ALLOWED[allowed]``."""
    made, state = set(), {"on": False}

    def record(name: str, handed: list) -> None:
        if state["on"] and name not in ALLOWED[allowed] + ANYWHERE:
            made.add(name)

    calls._record_every_call(record)
    state["on"] = True
    try:
        tensors = calls._in_place_rank(fn, inputs)
    finally:
        state["on"] = False
    return {"other calls": sorted(made), "tensors": tensors}


def only_allowed_calls(allowed: str) -> str:
    """The call kind for a task that allows only ``ALLOWED[allowed]`` (registered here)."""
    kind = f"in_place_on_ranks_only_{allowed}"

    def call(fn, world_size: int, inputs: list) -> list:
        from course_lib.collectives.launch import run_on_ranks
        return run_on_ranks(_only_rank, world_size, fn, inputs, allowed, timeout_s=calls.RANK_TIMEOUT_S,
                            on_print=lambda rank, line: None)

    calls.CALLS.setdefault(kind, call)
    return kind


def summed_with_allowed_calls(world_size: int, inputs: list) -> list:
    """On every rank: no call outside the task's, and each tensor summed over the ranks."""
    return [{"other calls": [], "tensors": sums} for sums in summed_on_every_rank(world_size, inputs)]


def only_calls_hint(allowed: str):
    def hint(case: Case, expected, got) -> str | None:
        for rank, result in enumerate(got):
            if result["other calls"]:
                return (f"rank {rank} called {', '.join(result['other calls'])}: this task makes the sum from "
                        f"{ALLOWED_TEXT[allowed]} only; make no other torch.distributed call")
        return in_place_hint(case, [r["tensors"] for r in expected], [r["tensors"] for r in got])
    return hint


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
    Task(1, "AllReduce = ReduceScatter + AllGather", "all_reduce_via_shards", _shard_cases, summed_with_allowed_calls,
         rule=FLOAT32, hint=only_calls_hint("shards"), call=only_allowed_calls("shards"),
         describe=describe_on_ranks("all_reduce_via_shards"), examples=0),
    Task(2, "AllReduce = Reduce + Broadcast", "all_reduce_via_root", _root_cases, summed_with_allowed_calls,
         rule=FLOAT32, hint=only_calls_hint("root"), call=only_allowed_calls("root"),
         describe=describe_on_ranks("all_reduce_via_root"), examples=0),
    Task(3, "Data parallel: average the gradients", "average_gradients",
         lambda: [Case((2, 4), why="2 ranks, 4 rows each"), Case((4, 4), why="4 ranks, 4 rows each")],
         full_batch_gradients, rule=FLOAT32, hint=_ddp_hint, call="ddp_gradients",
         describe=lambda case: f"average_gradients(model) on {case.args[0]} ranks, {case.args[1]} rows each",
         examples=0),
)
