"""Exercise 08's tasks, on real ranks: a tensor-parallel MLP with one all-reduce, a one-shot
all-reduce that reads its peers' symmetric buffers, and the split sizes of an MoE dispatch.

Expected values are computed here, on one process: the unsharded MLP in float64, the sums of
every rank's tensors, the split sizes by ``moe.py``'s own rule (``dispatch_split_sizes``, tested
equal to the split sizes ``expert_parallel_moe_forward`` hands ``all_to_all_single``) and
``moe.dense_moe_forward``. On the ranks, the learner's process also reports every communication
its function made (``calls._record_every_call``, at the ProcessGroup methods every
torch.distributed call ends in, and functional collectives' ops): the MLP must make one
all-reduce, of its partial output, and nothing else; the one-shot all-reduce none at all, but a
``buffers.wait()`` after a ``buffers.signal()``, and it must return the tensor it summed into.

So that a rank cannot pass by computing the whole MLP, each rank is handed weights whose entries
outside its own shard differ from rank to rank (``rank_weights``): only the shard is the real
one. So that a one-shot all-reduce cannot pass by luck of timing, every call has one rank start
late and one rank linger after its wait before it reads (``_one_shot_rank``): a rank that reads
before its peers wrote, or writes a buffer a peer may still read, gets the wrong sum. The delays
change from call to call (``LATE_S``), so that a fixed sleep in place of a wait cannot match them.

The three call kinds join ``calls.CALLS`` when this module is imported, as it is in the
learner's process by the set-up cell's ``Checker("08_fused_tp")``:

  tp_mlp_on_ranks    args ``(world_size, problems)``; rank r calls ``fn(x, a, b)`` on each problem
                     with ``rank_weights`` (noise outside its shards) and returns per problem
                     ``{"collective calls": [{"call", "elements"[, "values, sorted"]}, ...],
                     "output": fn's result}`` (an all_reduce's values: what it was handed, sorted)
  one_shot_on_ranks  args ``(world_size, inputs)``; every rank builds one ``SymmetricBuffers`` as
                     large as its largest tensor, then calls ``fn(tensor, buffers)`` on each of
                     ``inputs[r]`` in turn (one rank starts late, another lingers after its wait)
                     and returns per call ``{"collective calls": [...], "buffers": what it did with
                     them (``_buffer_calls``), "tensor": its contents after, "returned": fn's result}``
  moe_dispatch       args ``("table", expert ids row by row, top_k, num_experts, world_size)``:
                     ``fn(table as a [tokens, top_k] int64 tensor, num_experts, world_size)``; or
                     ``("ranks", world_size, tokens_per_rank, seed)``: ``_moe_rank`` on every rank,
                     which returns ``{"routing table": what fn was handed, "send splits": fn's result,
                     "output": the forward's rows}``
"""

from __future__ import annotations

import contextlib
import random
import time
import types
from typing import Any, Callable

import torch
import torch.nn.functional as F

from course_lib.collectives import moe
from course_lib.grading import calls
from course_lib.grading.calls import RANK_TIMEOUT_S, _record_every_call
from course_lib.grading.checks.collectives import FLOAT32, rank_inputs, summed_on_every_rank
from course_lib.grading.task import Case, Task
from course_lib.grading.values import from_plain, same_value, to_plain

# How late one rank starts each one-shot call (call c: LATE_S[c % 5]), and how long another lingers
# after its wait before it reads (LATE_S[(c + 2) % 5]): different from call to call, so that no
# fixed sleep in place of a wait matches them.
LATE_S = (0.03, 0.3, 0.01, 0.12, 0.06)
MOE_D_MODEL, MOE_EXPERTS, MOE_HIDDEN = 8, 8, 16


def _close(a, b) -> bool:
    return same_value(to_plain(a), to_plain(b), FLOAT32)


@contextlib.contextmanager
def _float32_default():
    """torch's default dtype float32 meanwhile, whatever the learner's process set (``moe.py``'s
    weights and tokens are made in the default dtype)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _sorted_values(tensors: list) -> list[float]:
    return sorted(value for tensor in tensors for value in tensor.detach().double().reshape(-1).tolist())


def _recorder() -> tuple[list[dict], Callable[[bool], None]]:
    """Start recording this rank's communication (``calls._record_every_call``: at the
    ProcessGroup, so every way of calling it counts); return the list calls are appended to
    (``{"call": name, "elements": handed in}``, and for an ``all_reduce`` ``"values, sorted"``: what
    it was handed, before the call, in ascending order) and a switch: only calls made while it is
    on count."""
    made: list[dict] = []
    state = {"on": False}

    def record(name: str, handed: list) -> None:
        if state["on"]:
            entry = {"call": name, "elements": sum(tensor.numel() for tensor in handed)}
            if name == "all_reduce":
                entry["values, sorted"] = _sorted_values(handed)
            made.append(entry)

    _record_every_call(record)
    return made, lambda on: state.update(on=on)


def _on_ranks(rank_fn: Callable, world_size: int, *args) -> list:
    from course_lib.collectives.launch import run_on_ranks
    return run_on_ranks(rank_fn, world_size, *args, timeout_s=RANK_TIMEOUT_S, on_print=lambda rank, line: None)


# Task 1

def _shard(hidden: int, rank: int, world_size: int) -> slice:
    per_rank = hidden // world_size
    return slice(rank * per_rank, (rank + 1) * per_rank)


def mlp_problem(tokens: int, features: int, hidden: int, seed: int) -> dict:
    """x [tokens, features], a [features, hidden], b [hidden, features] as float32 values."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, features, generator=generator, dtype=torch.float32)
    a = torch.randn(features, hidden, generator=generator, dtype=torch.float32) / features**0.5
    b = torch.randn(hidden, features, generator=generator, dtype=torch.float32) / hidden**0.5
    return {"x": x.tolist(), "a": a.tolist(), "b": b.tolist(), "noise": seed + 1}


def rank_weights(problem: dict, rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What rank ``rank`` is handed: x, and a and b whose entries outside its shard (columns of a,
    rows of b) are noise of the same scale, different on every rank."""
    x, a, b = (torch.tensor(problem[name], dtype=torch.float32) for name in ("x", "a", "b"))
    mine = _shard(a.shape[1], rank, world_size)
    generator = torch.Generator().manual_seed(problem["noise"] * 1000 + rank)
    noisy_a = torch.randn(a.shape, generator=generator, dtype=torch.float32) * a.std()
    noisy_b = torch.randn(b.shape, generator=generator, dtype=torch.float32) * b.std()
    noisy_a[:, mine], noisy_b[mine, :] = a[:, mine], b[mine, :]
    return x, noisy_a, noisy_b


def _mlp(x, a, b, approximate: str = "none") -> torch.Tensor:
    return F.gelu(x.double() @ a.double(), approximate=approximate) @ b.double()


def _tp_mlp_rank(fn: Callable, problems: list) -> list:
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    made, recording = _recorder()
    results = []
    for problem in problems:
        x, a, b = rank_weights(problem, rank, world)
        made.clear()
        recording(True)
        try:
            out = fn(x, a, b)
        finally:
            recording(False)
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"tensor_parallel_mlp returned {type(out).__name__}, not a tensor: return the "
                            "all-reduced output, a [tokens, features] tensor")
        results.append({"collective calls": list(made), "output": out.detach().tolist()})
    return results


def partial_output(problem: dict, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s share of the output, GeLU(x a_r) b_r, in float64."""
    x, a, b = rank_weights(problem, rank, world_size)
    mine = _shard(a.shape[1], rank, world_size)
    return _mlp(x, a[:, mine], b[mine, :])


def tp_mlp_expected(world_size: int, problems: list) -> list:
    """On every rank: one all_reduce, handed the rank's [tokens, features] partial output (its
    values, in ascending order: any layout of it will do), and the unsharded MLP's output."""
    out = []
    for rank in range(world_size):
        per_problem = []
        for problem in problems:
            x, a, b = (torch.tensor(problem[name], dtype=torch.float32) for name in ("x", "a", "b"))
            per_problem.append({"collective calls": [{"call": "all_reduce", "elements": x.numel(),
                                                      "values, sorted": _sorted_values([partial_output(
                                                          problem, rank, world_size)])}],
                                "output": _mlp(x, a, b).tolist()})
        out.append(per_problem)
    return out


MLP_SHAPES = ((3, 8, 6), (1, 6, 2), (5, 4, 8))  # (tokens, features, hidden per rank)


def _tp_mlp_cases() -> list[Case]:
    cases = []
    for world, why in ((2, "TP=2: each rank holds half the hidden features"),
                       (4, "TP=4: a quarter of the hidden features each")):
        problems = [mlp_problem(tokens, features, per_rank * world, seed=10 * world + i)
                    for i, (tokens, features, per_rank) in enumerate(MLP_SHAPES)]
        cases.append(Case((world, problems), why=why))
    return cases


def _describe_tp_mlp(case: Case) -> str:
    world_size, problems = case.args
    shapes = ", ".join(f"x {len(p['x'])}x{len(p['x'][0])} with hidden {len(p['b'])}" for p in problems)
    return f"tensor_parallel_mlp(x, a, b) on {world_size} ranks: {shapes}"


GATHERING = ("all_gather", "all_gather_into_tensor", "all_gather_coalesced", "all_gather_into_tensor_coalesced",
             "broadcast", "reduce", "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
             "gather", "scatter", "send", "recv")


def _other_calls_hint(where: str, others: list[str]) -> str:
    named = ", ".join(others)
    if any(name.startswith("functional ") for name in others):
        return (f"{where}: your function called {named} (torch.distributed._functional_collectives). This task "
                "wants dist.all_reduce(partial): the in-place collective, called once on the partial output")
    if any(name.startswith("new_") or name == "split_group" for name in others):
        return (f"{where}: your function called {named}: a new process group, set up by every rank together, on "
                "every call. The MLP needs none: dist.all_reduce(partial) on the default group (every rank)")
    if any(name in GATHERING for name in others):
        return (f"{where}: your function called {named}. Tensor parallelism never gathers the weights or the "
                "activations: each rank multiplies by its own shards, and one dist.all_reduce sums the partial "
                "outputs")
    return (f"{where}: your function called {named}. The only torch.distributed call this task makes is one "
            "dist.all_reduce of the partial output")


def _tp_mlp_hint(case: Case, expected, got) -> str | None:
    world_size, problems = case.args
    for rank, (wants, haves) in enumerate(zip(expected, got)):
        for index, (want, have) in enumerate(zip(wants, haves)):
            problem = problems[index]
            tokens, features, hidden = len(problem["x"]), len(problem["x"][0]), len(problem["b"])
            where = f"rank {rank}, x {tokens}x{features} with hidden {hidden}"
            names = [call["call"] for call in have["collective calls"]]
            others = sorted(set(names) - {"all_reduce"})
            if others:
                return _other_calls_hint(where, others)
            if not names:
                return (f"{where}: no dist.all_reduce was made. Each rank's GeLU(x a_r) b_r is only a partial sum "
                        "of the output: all-reduce it")
            if len(names) > 1:
                return (f"{where}: {len(names)} all_reduce calls; one is enough. Split a by columns, so GeLU acts "
                        "on whole hidden features of this rank and nothing is summed before the second matmul")
            made = have["collective calls"][0]
            elements = made["elements"]
            if elements != tokens * features:
                return (f"{where}: the all_reduce was handed {elements} elements; all-reduce the partial output "
                        f"of the second matmul, [tokens, features] = {tokens * features} elements")
            x, a, b = rank_weights(problem, rank, world_size)
            handed = made.get("values, sorted")
            handed_partial = _close(want["collective calls"][0]["values, sorted"], handed)
            if not handed_partial and _close(_sorted_values([x]), handed):
                return (f"{where}: you all-reduced x, the input, which every rank already holds whole. "
                        "All-reduce the partial output GeLU(x a_r) b_r, after the second matmul")
            if _close(want["output"], have["output"]):
                if handed_partial:
                    continue
                return (f"{where}: the all_reduce was handed something else than this rank's partial output "
                        "GeLU(x a_r) b_r (with its own shards): all-reduce that, computed after the second matmul; "
                        "its sum is the output")
            full = torch.tensor(problem["a"]), torch.tensor(problem["b"])
            mine = _shard(hidden, rank, world_size)
            if _close(F.gelu(x @ a[:, mine]) @ b[mine, :], have["output"]):
                return (f"{where}: that is this rank's partial output: return the tensor you all-reduced, the sum "
                        "(with async_op=True, only once you have called wait() on its handle)")
            if _close(torch.tensor(want["output"]) / world_size, have["output"]):
                return f"{where}: that is the mean over the ranks; the all-reduce's sum is the output"
            if _close(_mlp(x, *full, approximate="tanh"), have["output"]):
                return f"{where}: use the exact GeLU, torch.nn.functional.gelu(h), not approximate='tanh'"
            return (f"{where}: the output differs from the unsharded MLP's. Use only your shards, a[:, r*h/N:(r+1)*h/N] "
                    "and b[r*h/N:(r+1)*h/N, :]: the check changes every entry outside them, differently on "
                    "every rank")
    return None


# Task 2

SIGNAL_THEN_WAIT = "signal, then wait"


def _buffer_calls(events: list[str]) -> str:
    """What one call did with the buffers: ``SIGNAL_THEN_WAIT`` when it waited after a signal (as
    every synchronised one-shot or two-shot does), else how often it called each method."""
    if "signal" in events and "wait" in events[events.index("signal"):]:
        return SIGNAL_THEN_WAIT
    counts = ", ".join(f"{name} {events.count(name)}x" for name in ("begin", "signal", "wait"))
    return f"{counts}: no buffers.wait() after a buffers.signal()"


def _returned(result: Any) -> Any:
    """What the function returned, as plain data: a tensor's contents, None, or what it was."""
    if isinstance(result, torch.Tensor):
        return result.detach().tolist()
    return None if result is None else f"a {type(result).__name__}"


def _one_shot_rank(fn: Callable, inputs: list) -> list:
    import torch.distributed as dist

    from course_lib.collectives.symmetric import SymmetricBuffers

    torch.set_default_dtype(torch.float32)
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = inputs[rank]
    buffers = SymmetricBuffers(max(len(values) for values in mine), timeout_s=10.0)
    real_begin, real_signal, real_wait = buffers.begin, buffers.signal, buffers.wait
    events: list[str] = []
    linger = [0.0]

    def begin(tensor):
        events.append("begin")
        return real_begin(tensor)

    def signal() -> None:
        events.append("signal")
        real_signal()

    def wait() -> None:
        events.append("wait")
        real_wait()
        time.sleep(linger[0])  # this rank reads its peers' buffers late: they must not change meanwhile

    buffers.begin, buffers.signal, buffers.wait = begin, signal, wait
    made, recording = _recorder()
    results = []
    for call, values in enumerate(mine):
        tensor = torch.tensor(values, dtype=torch.float32)
        if rank == call % world:
            time.sleep(LATE_S[call % len(LATE_S)])  # this rank writes late: its peers must wait for it
        linger[0] = LATE_S[(call + 2) % len(LATE_S)] if rank == (call + 1) % world else 0.0
        made.clear()
        events.clear()
        recording(True)
        try:
            result = fn(tensor, buffers)
        finally:
            recording(False)
        results.append({"collective calls": list(made), "buffers": _buffer_calls(events),
                        "tensor": tensor.tolist(), "returned": _returned(result)})
    buffers.close()
    return results


def one_shot_expected(world_size: int, inputs: list) -> list:
    """Every rank's tensors summed over the ranks, with no torch.distributed call made, a wait
    after a signal, and the tensor returned."""
    return [[{"collective calls": [], "buffers": SIGNAL_THEN_WAIT, "tensor": tensor, "returned": tensor}
             for tensor in tensors] for tensors in summed_on_every_rank(world_size, inputs)]


def _one_shot_cases() -> list[Case]:
    with _float32_default():
        return [Case((2, rank_inputs(2, (8, 8, 1000, 3, 4099), seed=81)),
                     why="2 ranks, five calls on the same buffers, the same size twice in a row"),
                Case((4, rank_inputs(4, (16, 5, 5, 2048, 1), seed=82)),
                     why="4 ranks: read all 3 peers; a smaller call after a larger one")]


def _describe_one_shot(case: Case) -> str:
    world_size, inputs = case.args
    sizes = ", ".join(str(len(t)) for t in inputs[0])
    return f"my_one_shot_all_reduce(tensor, buffers) on {world_size} ranks, calls of {sizes} elements in turn"


def _one_shot_hint(case: Case, expected, got) -> str | None:
    world_size, inputs = case.args
    for rank, (wants, haves) in enumerate(zip(expected, got)):
        for call, (want, have) in enumerate(zip(wants, haves)):
            names = sorted({made["call"] for made in have["collective calls"]})
            if names:
                return (f"rank {rank}, call {call}: your function called {', '.join(names)}. A one-shot all-reduce "
                        "reads its peers' buffers itself: make no torch.distributed call")
            where = f"rank {rank}, call {call} ({len(want['tensor'])} elements)"
            summed = _close(want["tensor"], have["tensor"])
            if not summed and all(_close(values, result["tensor"]) for values, result in zip(inputs[rank], haves)):
                return f"{where}: the tensor is unchanged: write the sum into tensor itself (in place)"
            if have["buffers"] != SIGNAL_THEN_WAIT:
                return (f"{where}: {have['buffers']}. Only once buffers.wait() returns, after your "
                        "buffers.signal(), is every peer's data in: a sleep or luck of timing is no wait "
                        "(the check makes ranks late by different amounts)")
            if summed:
                if _close(want["returned"], have["returned"]):
                    continue
                returned = have["returned"]
                what = returned if isinstance(returned, str) else "None" if returned is None else "another tensor"
                return f"{where}: the sum is in tensor, but your function returned {what}: return tensor itself"
            own = inputs[rank][call]
            others = [x - y for x, y in zip(want["tensor"], own)]
            if _close(others, have["tensor"]):
                return f"{where}: that is the sum of the peers' tensors only: add this rank's own too"
            return (f"{where}: not the sum of every rank's tensor. Read the peers' buffers only after "
                    "buffers.wait() returns (after your own buffers.signal()), and never write into a buffer "
                    "(yours included) once you have signalled: a peer may still be reading it. Sum into "
                    "tensor. The check makes one rank start each call late and one linger before it reads")
    return None


# Task 3

def dispatch_split_sizes(experts: torch.Tensor, num_experts: int, world_size: int) -> list[int]:
    """How many (token, expert) pairs of the routing table ``experts`` ([tokens, top_k] expert ids)
    go to each rank, rank 0 first, when rank r holds experts [r E/N, (r+1) E/N): the input split
    sizes of ``expert_parallel_moe_forward``'s dispatch ``all_to_all_single``, by its own rule."""
    send_counts = torch.bincount(experts.reshape(-1), minlength=num_experts)
    return send_counts.view(world_size, num_experts // world_size).sum(dim=1).tolist()


def _table(rows: list, top_k: int) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int64).reshape(-1, top_k)


def moe_rank_problem(world_size: int, tokens_per_rank: list[int], seed: int, rank: int):
    """Rank ``rank``'s tokens, the full weights, and its routing table (float32, whatever the
    default dtype)."""
    with _float32_default():
        weights = moe.make_weights(MOE_D_MODEL, MOE_EXPERTS, MOE_HIDDEN, seed)
        x = moe.rank_tokens(tokens_per_rank, MOE_D_MODEL, seed + 1)[rank]
        experts, _ = moe.route(x, weights.router)
    return weights, x, experts


def _plain_result(result: Any) -> Any:
    """``result``, or for a generator or other one-pass iterator (which cannot be sent back as
    plain data, nor handed to all_to_all_single twice) what it is."""
    if isinstance(result, types.GeneratorType) or (hasattr(result, "__next__") and hasattr(result, "__iter__")):
        return f"a {type(result).__name__} object, not a list"
    return result


def _usable(splits: Any, world_size: int, pairs: int) -> list[int] | None:
    """``splits`` as a list of ints when it can be handed to all_to_all_single, else None."""
    try:
        values = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
    except (TypeError, ValueError):
        return None
    ok = len(values) == world_size and all(v >= 0 for v in values) and sum(values) == pairs
    return values if ok else None


def _moe_rank(fn: Callable, tokens_per_rank: list[int], seed: int) -> dict:
    """``moe.expert_parallel_moe_forward`` with the dispatch's split sizes from ``fn``; the
    forward runs only when every rank's split sizes match what its peers expect to receive."""
    import torch.distributed as dist

    torch.set_default_dtype(torch.float32)  # this rank's own process: whatever the learner's set
    rank, world = dist.get_rank(), dist.get_world_size()
    weights, x, experts = moe_rank_problem(world, tokens_per_rank, seed, rank)
    shard, top_k = weights.shard(rank, world), experts.shape[1]
    per_rank = shard.w_in.shape[0]
    got = _plain_result(fn(experts.clone(), MOE_EXPERTS, world))
    torch.set_default_dtype(torch.float32)
    table = experts.tolist()
    reported = from_plain(to_plain(got))  # plain lists: whatever the learner returned, it pickles
    send_splits = _usable(got, world, experts.numel())

    token = torch.arange(x.shape[0]).repeat_interleave(top_k)
    order = torch.argsort(experts.reshape(-1), stable=True)
    gates = moe.route(x, weights.router)[1]
    token, gate = token[order], gates.reshape(-1)[order]
    send_counts = torch.bincount(experts.reshape(-1), minlength=MOE_EXPERTS)
    receive_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(receive_counts, send_counts)
    receive_splits = receive_counts.view(world, per_rank).sum(dim=1).tolist()
    everyone: list = [None] * world
    dist.all_gather_object(everyone, send_splits)
    wrong = [f"rank {source} sends rank {rank} {everyone[source][rank]} rows, where {receive_splits[source]} "
             f"(token, expert) pairs are routed to rank {rank}'s experts" if everyone[source] is not None else
             f"rank {source}'s split sizes cannot be used (a list of {world} ints >= 0 that add up to its "
             f"tokens x top_k pairs)" for source in range(world)
             if everyone[source] is None or everyone[source][rank] != receive_splits[source]]
    verdicts: list = [None] * world
    dist.all_gather_object(verdicts, not wrong)
    if not all(verdicts):
        return {"routing table": table, "send splits": reported,
                "output": "not run: " + ("; ".join(wrong) if wrong else "another rank's split sizes do not match")}
    received = x.new_empty(sum(receive_splits), x.shape[1])
    dist.all_to_all_single(received, x[token], receive_splits, send_splits)
    blocks = received.split(receive_counts.tolist())
    processed = torch.cat([moe.expert_mlp(shard, i % per_rank, block) for i, block in enumerate(blocks)])
    returned = x.new_empty(token.shape[0], x.shape[1])
    dist.all_to_all_single(returned, processed, send_splits, receive_splits)
    out = torch.zeros_like(x).index_add_(0, token, gate[:, None] * returned)
    return {"routing table": table, "send splits": reported, "output": out.tolist()}


def _moe_call(fn: Callable, kind: str, *args) -> Any:
    if kind == "table":
        rows, top_k, num_experts, world_size = args
        return _plain_result(fn(_table(rows, top_k), num_experts, world_size))
    world_size, tokens_per_rank, seed = args
    return _on_ranks(_moe_rank, world_size, fn, tokens_per_rank, seed)


def moe_expected(kind: str, *args) -> Any:
    if kind == "table":
        rows, top_k, num_experts, world_size = args
        return dispatch_split_sizes(_table(rows, top_k), num_experts, world_size)
    world_size, tokens_per_rank, seed = args
    out = []
    for rank in range(world_size):
        weights, x, experts = moe_rank_problem(world_size, tokens_per_rank, seed, rank)
        with _float32_default():
            output = moe.dense_moe_forward(weights, x).tolist()
        out.append({"routing table": experts.tolist(),
                    "send splits": dispatch_split_sizes(experts, MOE_EXPERTS, world_size), "output": output})
    return out


def _random_table(rng: random.Random) -> tuple:
    world = rng.choice([1, 2, 2, 4, 4, 8])
    num_experts = world * rng.choice([1, 2, 4])
    top_k = rng.randint(1, min(4, num_experts))
    tokens = rng.choice([0, 1, 2, rng.randint(3, 40)])
    favourites = rng.sample(range(num_experts), rng.randint(top_k, num_experts))  # often some ranks get none
    rows = [rng.sample(favourites, top_k) for _ in range(tokens)]
    return ("table", [e for row in rows for e in row], top_k, num_experts, world)


def _moe_cases() -> list[Case]:
    def table(rows, num_experts, world_size, why):
        top_k = len(rows[0]) if rows else 2
        return Case(("table", [e for row in rows for e in row], top_k, num_experts, world_size), why=why)

    cases = [table([[0, 5]], 8, 2, "experts 0-3 on rank 0, 4-7 on rank 1: one pair each way"),
             table([[1, 0], [3, 2]], 8, 2, "every pair goes to rank 0: rank 1 receives nothing"),
             table([[7, 6]], 8, 4, "both of a token's experts on rank 3: count pairs, not tokens"),
             table([[1, 2], [3, 0], [2, 1]], 8, 4, "experts 0 and 1 on rank 0: contiguous blocks, not e % N"),
             table([[3, 1, 0], [2, 3, 1]], 4, 4, "one expert per rank, top-3"),
             table([[5, 2], [6, 1], [0, 4]], 8, 1, "one rank holds every expert"),
             table([], 8, 4, "no tokens: every split is 0, a list of N zeros"),
             Case(("ranks", 2, [5, 3], 0), why="on 2 ranks: the forward with your split sizes equals the dense MoE"),
             Case(("ranks", 4, [6, 0, 3, 4], 3),
                  why="on 4 ranks, rank 1 without tokens: it still joins the all-to-alls with zero splits")]
    rng = random.Random(83)
    return cases + [Case(_random_table(rng)) for _ in range(60)]


def _describe_moe(case: Case) -> str:
    kind, *args = case.args
    if kind == "table":
        rows, top_k, num_experts, world_size = args
        table = [rows[i:i + top_k] for i in range(0, len(rows), top_k)]
        handed = f"torch.tensor({table})" if table else f"torch.empty(0, {top_k}, dtype=torch.int64)"
        return f"dispatch_splits({handed}, num_experts={num_experts}, world_size={world_size})"
    world_size, tokens_per_rank, _ = args
    return (f"an expert-parallel MoE forward on {world_size} ranks ({MOE_EXPERTS} experts, top-2, "
            f"{tokens_per_rank} tokens per rank) with dispatch_splits(experts, {MOE_EXPERTS}, {world_size})")


def _moe_hint(case: Case, expected, got) -> str | None:
    kind, *args = case.args
    if kind == "ranks":
        world_size, tokens_per_rank, seed = args
        for rank, (want, have) in enumerate(zip(expected, got)):
            if have.get("routing table") != want["routing table"]:
                return (f"rank {rank}: your function was handed the routing table {have.get('routing table')}, not "
                        f"{want['routing table']}: does your code change torch's settings (its default dtype, say)?")
            if have["send splits"] != want["send splits"]:
                return (f"rank {rank}: its routing table {have['routing table']} gives split sizes "
                        f"{want['send splits']}, yours were {have['send splits']}")
        return ("the split sizes were right, yet the output differs from the dense MoE's: does your function "
                "change anything besides returning the split sizes (its argument, torch's settings)?")
    rows, top_k, num_experts, world_size = args
    table = _table(rows, top_k)
    if isinstance(got, str) and got.endswith(" object, not a list"):
        return (f"your function returned {got[:-len(' object, not a list')]}: a generator expression makes one; "
                f"return a list of {world_size} ints, e.g. [... for r in range(world_size)] or list(...)")
    if not isinstance(got, (list, tuple)):
        return f"return a list of {world_size} ints, one per rank"
    if any(isinstance(value, bool) or not isinstance(value, (int, float)) for value in got):
        kinds = sorted({type(value).__name__ for value in got})
        return (f"return ints, how many pairs go to each rank; yours are {', '.join(kinds)} "
                "(a comparison gives a bool: count with sum(...) or torch.bincount)")
    if len(got) != world_size:
        if len(got) == num_experts and list(got) == torch.bincount(table.reshape(-1), minlength=num_experts).tolist():
            return (f"those are the counts per expert ({num_experts}); add up each rank's {num_experts // world_size} "
                    f"experts: one split per rank, {world_size} in all")
        return f"one split size per rank: {world_size} numbers, rank 0 first (a rank that receives nothing gets 0)"
    per_rank = num_experts // world_size
    tokens = [sum(any(e // per_rank == r for e in row) for row in table.tolist()) for r in range(world_size)]
    if list(got) == tokens:
        return ("that counts tokens; a token whose top-k experts share a rank sends that rank one row per expert: "
                "count (token, expert) pairs")
    strided = torch.bincount(table.reshape(-1) % world_size, minlength=world_size).tolist()
    if list(got) == strided:
        return f"rank r holds experts r*E/N to (r+1)*E/N - 1, a contiguous block: expert e is on rank e // {per_rank}"
    if list(got) == expected[::-1]:
        return "rank 0 first: split i is what goes to rank i"
    return None


def _register_calls() -> None:
    """Make the call kinds known to ``calls.run_cases`` (in whichever process imports this module)."""
    calls.CALLS.setdefault("tp_mlp_on_ranks", lambda fn, world_size, problems: _on_ranks(
        _tp_mlp_rank, world_size, fn, problems))
    calls.CALLS.setdefault("one_shot_on_ranks", lambda fn, world_size, inputs: _on_ranks(
        _one_shot_rank, world_size, fn, inputs))
    calls.CALLS.setdefault("moe_dispatch", _moe_call)


_register_calls()

TASKS = (
    Task(1, "A tensor-parallel MLP with one all-reduce", "tensor_parallel_mlp", _tp_mlp_cases, tp_mlp_expected,
         rule=FLOAT32, hint=_tp_mlp_hint, call="tp_mlp_on_ranks", describe=_describe_tp_mlp, examples=0),
    Task(2, "A one-shot all-reduce from peer buffers", "my_one_shot_all_reduce", _one_shot_cases, one_shot_expected,
         rule=FLOAT32, hint=_one_shot_hint, call="one_shot_on_ranks", describe=_describe_one_shot, examples=0),
    Task(3, "MoE dispatch split sizes", "dispatch_splits", _moe_cases, moe_expected, rule=FLOAT32, hint=_moe_hint,
         call="moe_dispatch", describe=_describe_moe, examples=3),
)
