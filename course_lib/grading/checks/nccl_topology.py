"""Exercise 07's tasks: busbw from a measurement, a hierarchical all-reduce on real ranks, DDP's
gradient buckets, and a bucketed reducer that overlaps its all-reduces with backward.

Expected values come from ``perf.bus_bandwidth`` (nccl-tests' factors), the sums and the
full-batch gradients computed here on one process, ``collectives.buckets.assign_buckets``
(DDP's own assignment), and the order in which this process's backward accumulates the
gradients. On the ranks, the learner's process also reports what its function handed to
torch.distributed's calls (``calls.py``): the hierarchical all-reduce must send only shards
across nodes, and the reducer must launch one asynchronous all-reduce per bucket as soon as
that bucket's last gradient is ready, and wait on each in ``finish()``, once backward has returned.
"""

from __future__ import annotations

import math
import random

import torch

from course_lib.collectives.buckets import MIB, assign_buckets
from course_lib.grading.calls import reducer_problem, shard_allowance
from course_lib.grading.checks.collectives import (FLOAT32, in_place_hint, local_gradients, rank_inputs,
                                                   summed_on_every_rank)
from course_lib.grading.task import Case, Task
from course_lib.grading.values import same_value, to_plain
from course_lib.perf.bus_bandwidth import COLLECTIVES, algorithm_bandwidth, bus_bandwidth, bus_factor

GB = 1e9  # GB/s as nccl-tests reports it: 10^9 bytes per second
FACTORS = {"all_reduce": "2(N-1)/N", "all_gather": "(N-1)/N", "reduce_scatter": "(N-1)/N", "all_to_all": "(N-1)/N",
           "broadcast": "1", "reduce": "1"}


def _close(a, b) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


# Task 1

def course_bandwidths(collective: str, num_bytes: int, seconds: float, num_ranks: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s, from ``perf.bus_bandwidth``."""
    algbw = algorithm_bandwidth(num_bytes, seconds) / GB
    return algbw, bus_bandwidth(collective, algbw, num_ranks)


def _bandwidth_cases() -> list[Case]:
    cases = [Case(("all_reduce", 10**9, 0.01, 8), why="a 1 GB all-reduce on 8 GPUs at 100 GB/s: busbw 175 GB/s"),
             Case(("all_gather", 10**9, 0.01, 8), why="all-gather: (N-1)/N"),
             Case(("reduce_scatter", 10**9, 0.0125, 8), why="reduce-scatter: (N-1)/N, 80 GB/s of algbw is 70 of busbw"),
             Case(("all_to_all", 2 * 10**9, 0.05, 4), why="all-to-all: (N-1)/N"),
             Case(("broadcast", 10**9, 0.02, 8), why="broadcast: factor 1"),
             Case(("reduce", 10**9, 0.02, 16), why="reduce: factor 1"),
             Case(("all_reduce", 2**30, 0.01, 8), why="a GB is 10^9 bytes: 2^30 bytes in 10 ms is 107.4 GB/s"),
             Case(("all_reduce", 2**26, 0.001, 2), why="an all-reduce on 2 ranks: 2(N-1)/N = 1"),
             Case(("all_reduce", 2**20, 1e-4, 1), why="one rank: an all-reduce moves nothing, factor 0"),
             Case(("all_gather", 2**20, 1e-4, 1), why="one rank: (N-1)/N = 0"),
             Case(("broadcast", 2**20, 1e-4, 1), why="one rank: broadcast's factor is 1 at every N")]
    rng = random.Random(71)
    for _ in range(60):
        num_bytes = rng.choice([2 ** rng.randint(10, 34), 10 ** rng.randint(3, 10), rng.randint(1, 10**10)])
        seconds = 10 ** rng.uniform(-6, -4) + num_bytes / (10 ** rng.uniform(9, 11.5))
        cases.append(Case((rng.choice(COLLECTIVES), num_bytes, seconds, rng.choice([1, 2, 3, 4, 8, 16, 64, 512]))))
    return cases


def _bandwidth_hint(case: Case, expected, got) -> str | None:
    collective, num_bytes, seconds, n = case.args
    if not isinstance(got, (list, tuple)) or len(got) != 2 or not all(isinstance(x, (int, float)) for x in got):
        return "return a pair: (algbw, busbw), both in GB/s"
    (algbw, busbw), (got_algbw, got_busbw) = expected, got
    if not _close(algbw, busbw) and _close(got_algbw, busbw) and _close(got_busbw, algbw):
        return "swapped: return (algbw, busbw), algbw first"
    if not _close(got_algbw, algbw):
        if _close(got_algbw, num_bytes / seconds):
            return "in GB/s: divide the bytes per second by 1e9"
        if _close(got_algbw, num_bytes / seconds / 2**30):
            return "a GB is 10^9 bytes, not 2^30 (that is a GiB): divide by 1e9"
        return "algbw = num_bytes / seconds, in GB/s (divided by 1e9)"
    factor = bus_factor(collective, n)
    if FACTORS[collective] == "1":
        rule = f"{collective}'s factor is 1 at every N: busbw = algbw"
    else:
        ranks = f"{n} rank" + ("s" if n != 1 else "")
        rule = f"{collective}'s factor on {ranks} is {FACTORS[collective]} = {factor:g}: busbw = algbw x {factor:g}"
    if _close(got_busbw, busbw * GB / 2**30):
        return "a GB is 10^9 bytes, not 2^30: busbw in GB/s too"
    once = {"all_reduce": "an all-reduce moves each byte twice (reduce-scatter, then all-gather): 2(N-1)/N, not (N-1)/N",
            "broadcast": "in a broadcast every rank but the root receives the whole buffer: factor 1, not (N-1)/N",
            "reduce": "in a reduce every rank but the root sends a whole buffer of partial sums: factor 1, not (N-1)/N"}
    mistakes = [(1 / factor if factor else None, "the factor is upside down"),
                ((n - 1) / n, once.get(collective)),
                (2 * (n - 1) / n, "only an all-reduce has 2(N-1)/N"),
                (1, "busbw is algbw times the collective's factor"),
                (n, "the factor is not N")]
    for wrong, mistake in mistakes:
        if wrong is not None and mistake and not _close(wrong, factor) and _close(got_busbw, algbw * wrong):
            return f"{mistake}; {rule}"
    return rule


# Task 2

def hierarchical_expected(world_size: int, ranks_per_node: int, inputs: list) -> list:
    """Every rank's tensors summed over the ranks, and no call that was handed too much across nodes."""
    return [[{"too much across nodes": [], "tensor": tensor} for tensor in tensors]
            for tensors in summed_on_every_rank(world_size, inputs)]


def _hierarchical_cases() -> list[Case]:
    layouts = [(4, 2, (8, 7), "2 nodes of 2 ranks: only a half-tensor shard crosses; 7 elements make shards of 4"),
               (6, 2, (12, 5), "3 nodes of 2 ranks"),
               (6, 3, (9, 10), "2 nodes of 3 ranks: shards of a third; 10 elements make shards of 4"),
               (4, 1, (6, 3), "one rank per node: the shard is the whole tensor"),
               (4, 4, (6, 3), "one node: nothing crosses")]
    return [Case((world, per_node, rank_inputs(world, sizes, seed=7)), why=why) for world, per_node, sizes, why in layouts]


def _describe_hierarchical(case: Case) -> str:
    world_size, ranks_per_node, inputs = case.args
    sizes = " and ".join(str(len(t)) for t in inputs[0])
    return (f"my_hierarchical_all_reduce(tensor, ranks_per_node={ranks_per_node}) on {world_size // ranks_per_node} "
            f"node(s) x {ranks_per_node} rank(s), 1-D tensors of {sizes} elements")


def _hierarchical_hint(case: Case, expected, got) -> str | None:
    world_size, ranks_per_node, inputs = case.args
    values = [[t["tensor"] for t in tensors] for tensors in got]
    sums = [[t["tensor"] for t in tensors] for tensors in expected]
    if not same_value(to_plain(sums), to_plain(values), FLOAT32):
        return in_place_hint(Case((world_size, inputs)), sums, values)
    records = [(rank, index, record) for rank, tensors in enumerate(got) for index, t in enumerate(tensors)
               for record in t["too much across nodes"]]
    kind = lambda record: 2 if record.get("outside") else 1 if record["call"].endswith(" cross-node calls") else 0  # noqa: E731
    rank, index, record = min(records, key=lambda found: kind(found[2]))
    numel = len(inputs[rank][index])
    shard, allowed = -(-numel // ranks_per_node), shard_allowance(numel, world_size, ranks_per_node)
    where = f"rank {rank}, the {numel}-element tensor"
    if kind(record) == 1:
        return (f"{where}: {record['call']} (ranks {record['ranks']}) were handed {record['elements']} elements in "
                f"all, more than two shards of {allowed}: a ring over every rank sends about twice the tensor across "
                "a node boundary; send only this rank's shard across")
    call = f"{where}: {record['call']} on ranks {record['ranks']} was handed {record['elements']} elements"
    local_rank = rank % ranks_per_node
    cross_group = list(range(local_rank, world_size, ranks_per_node))
    if kind(record) == 2:
        return (f"{call}: it spans nodes but leaves this rank's cross-node group (the ranks with local rank "
                f"{local_rank}: {cross_group}); across nodes, exchange this rank's shard only with the ranks that "
                "hold the same shard, the same local rank on the other nodes")
    if ranks_per_node == 1:  # the world group is the cross-node group: the shard is the whole tensor
        return (f"{call}, more than the whole tensor: with one rank per node the shard is the tensor itself, "
                f"{numel} elements; hand no cross-node call more than that")
    padded = f", or {allowed} if padded to a multiple of the world size" if allowed > shard else ""
    fix = (f"reduce-scatter inside the node first, so that only this rank's shard (ceil({numel}/{ranks_per_node}) "
           f"= {shard} elements{padded}) is all-reduced across nodes (ranks {cross_group}), then all-gather inside "
           "the node")
    if record["ranks"] == list(range(world_size)):
        return f"{call}: the sum is right, but the world group spans every node, so the whole tensor crossed; {fix}"
    return f"{call}, more than a shard: {fix}"


# Task 3

def _walk(param_bytes: list[int], cap: int, first_cap: int, *, forward: bool = False, strict: bool = False,
          close_first: bool = False, caps: str = "first", early: bool = False) -> list[list[int]]:
    """``assign_buckets`` with one rule changed, to name a mistake: walk front to back, close only
    over the cap, close before adding, close a byte early, or ``caps`` "same" (no first cap) or
    "all-first" (the first cap for every bucket)."""
    limit = lambda number: {"same": cap, "all-first": first_cap}.get(caps, first_cap if number == 0 else cap)  # noqa: E731
    buckets, bucket, held = [], [], 0
    for index in range(len(param_bytes)) if forward else reversed(range(len(param_bytes))):
        size = param_bytes[index]
        if close_first and bucket and held + size > limit(len(buckets)):
            buckets.append(bucket)
            bucket, held = [], 0
        bucket.append(index)
        held += size
        if not close_first and (held > limit(len(buckets)) if strict else held >= limit(len(buckets)) - early):
            buckets.append(bucket)
            bucket, held = [], 0
    return buckets + [bucket] if bucket else buckets


def _bucket_cases() -> list[Case]:
    model = [8 * MIB, 4096, 8 * MIB, 4096, 2 * MIB, 2048]
    cases = [Case(([400, 400, 400, 400], 800, 800), why="reverse order: bucket 0 holds the last parameters"),
             Case(([100, 300, 500, 200], 700, 700), why="a bucket closes when its bytes reach the cap exactly"),
             Case(([100, 600, 300], 500, 500), why="a bucket may overshoot the cap by its last parameter"),
             Case(([1, 399, 400], 400, 400), why="a bucket one byte short of the cap stays open"),
             Case(([50, 5000, 50], 1000, 1000), why="a parameter larger than the cap closes the bucket it joins"),
             Case(([50, 5000, 2000], 1000, 1000), why="a parameter larger than the cap in an empty bucket: alone"),
             Case(([300] * 6, 900, 500), why="only bucket 0 has the first bucket's cap"),
             Case((model, 25 * MIB, MIB), why="DDP's defaults: 25 MiB, and 1 MiB for the first bucket"),
             Case(([200, 300, 500], 500, 500), why="the last parameter fills its bucket: no empty bucket after it"),
             Case(([100, 200, 300], 10**6, 10**6), why="everything fits: one bucket"),
             Case(([4096], 1024, 1024), why="one parameter")]
    rng = random.Random(73)
    for _ in range(50):
        sizes = [4 * round(2 ** rng.uniform(0, 18)) for _ in range(rng.randint(1, 24))]
        cap = round(2 ** rng.uniform(4, 20))
        cases.append(Case((sizes, cap, rng.choice([cap, max(1, cap // rng.choice([2, 4, 25]))]))))
    return cases


def _bucket_hint(case: Case, expected, got) -> str | None:
    param_bytes, cap, first_cap = case.args
    if not isinstance(got, list) or not all(isinstance(b, list) for b in got):
        return "return a list of buckets, each a list of parameter indices"
    variant = lambda **change: _walk(param_bytes, cap, first_cap, **change)  # noqa: E731
    if got and not got[-1] and got[:-1] == expected:
        return "no empty bucket at the end: add the open bucket only when it holds a parameter"
    if [sorted(b, reverse=True) for b in got] == expected:
        return "inside a bucket, list the indices in the order the gradients become ready: descending"
    if got == expected[::-1]:
        return "bucket 0 first: it holds the last parameters, whose gradients are ready first"
    if got == variant(strict=True):
        return "a bucket closes as soon as its bytes reach the cap: >=, not >"
    if got == variant(early=True):
        return "a bucket closes when its bytes reach the cap: one byte short of it, it stays open"
    if got == variant(close_first=True):
        return ("add the parameter first, then close the bucket if its bytes reached the cap: a bucket may overshoot "
                "the cap by its last parameter")
    if got == variant(caps="same"):
        return "bucket 0 closes at first_bucket_cap_bytes"
    if got == variant(caps="all-first"):
        return "only bucket 0 uses first_bucket_cap_bytes; every later bucket closes at bucket_cap_bytes"
    forward = variant(forward=True)
    if got in (forward, forward[::-1], [b[::-1] for b in forward], [b[::-1] for b in forward][::-1]):
        return ("walk from the last parameter to the first: gradients become ready in reverse order, and the "
                "walk's direction decides which parameters share a bucket")
    return None


# Task 4

def _accumulation_order(world_size: int, rows_per_rank: int,
                        registration: list[int] | None = None) -> tuple[list[list[float]], list[int]]:
    """The full batch's gradients, and the parameter indices in the order backward accumulated them."""
    model, inputs, targets = reducer_problem(world_size, rows_per_rank, registration)
    parameters, order = list(model.parameters()), []
    for index, parameter in enumerate(parameters):
        parameter.register_post_accumulate_grad_hook(lambda _, index=index: order.append(index))
    torch.nn.functional.mse_loss(model(inputs), targets).backward()
    return [parameter.grad.tolist() for parameter in parameters], order


def reducer_expected(world_size: int, rows_per_rank: int, buckets: list[list[int]],
                     registration: list[int] | None = None) -> list:
    """Every rank's gradients are the full batch's, and bucket b's all-reduce is asynchronous, of
    the bucket's elements, launched the moment buckets 0..b have all their gradients, and waited on
    only once backward has returned (in ``finish()``)."""
    gradients, order = _accumulation_order(world_size, rows_per_rank, registration)
    sizes = [p.numel() for p in reducer_problem(world_size, rows_per_rank, registration)[0].parameters()]
    position = {index: place for place, index in enumerate(order)}
    calls, ready = [], 0
    for bucket in buckets:
        ready = max(ready, 1 + max(position[index] for index in bucket))
        calls.append({"elements": sum(sizes[index] for index in bucket), "async_op": True, "gradients ready": ready,
                      "waited during backward": False, "waited on": True})
    return [{"all_reduce calls": calls, "gradients": gradients}] * world_size


def _parameter_bytes() -> list[int]:
    return [p.numel() * p.element_size() for p in reducer_problem(1, 1)[0].parameters()]


def _reducer_cases() -> list[Case]:
    sizes = _parameter_bytes()
    return [Case((2, 4, assign_buckets(sizes, 1024, 128)),
                 why="3 buckets: bucket 0 (the last layer) is launched while backward goes on"),
            Case((4, 2, assign_buckets(sizes, 300)), why="4 ranks, 2 buckets"),
            Case((2, 4, assign_buckets(sizes, MIB)), why="one bucket: launched with the last gradient"),
            Case((3, 2, assign_buckets(sizes, 1)), why="a bucket per parameter"),
            Case((2, 2, [[5, 4, 1], [3, 2, 0]], [2, 0, 4]),
                 why="parameters() lists the middle layer first, so backward writes the gradients in the order "
                     "5, 4, 1, 0, 3, 2: count each bucket's missing gradients")]


def _describe_reducer(case: Case) -> str:
    world_size, rows_per_rank, buckets, *registration = case.args
    layers = (f", the Linear layers registered in the order {registration[0]} of the forward pass" if registration
              else "")
    return (f"install_bucketed_reducer(model, buckets={buckets}) on {world_size} ranks, {rows_per_rank} rows each"
            + layers)


def _scaled(value, factor: float):
    """Every number in nested lists ``value`` times ``factor``."""
    return [_scaled(item, factor) for item in value] if isinstance(value, list) else value * factor


def _reducer_hint(case: Case, expected, got) -> str | None:
    world_size, rows_per_rank, buckets, *registration = case.args
    want = expected[0]["all_reduce calls"]
    for calls in (result["all_reduce calls"] for result in got):
        elements = [call["elements"] for call in calls]
        if not calls:
            return "no dist.all_reduce was called: launch one per bucket from the gradient hooks"
        if not all(call["async_op"] for call in calls):
            return ("launch with dist.all_reduce(flat, async_op=True): a blocking all-reduce inside a hook holds up "
                    "backward until it is done, so nothing overlaps")
        if elements != [call["elements"] for call in want]:
            return (f"one all_reduce per bucket, bucket 0 first, of all its gradients flattened into one buffer "
                    f"(torch.cat): {[call['elements'] for call in want]} elements; yours were {elements}")
        early = [b for b, call in enumerate(calls) if call["waited during backward"]]
        if early:
            return (f"you waited on bucket {early[0]} inside backward (in a hook): that holds backward up exactly like "
                    "async_op=False; wait in finish()")
        if not all(call["waited on"] for call in calls):
            return ("finish() must wait on every handle (work.wait()) before it reads the buffers: an asynchronous "
                    "all-reduce may still be running")
        ready = [call["gradients ready"] for call in calls]
        if ready != [call["gradients ready"] for call in want]:
            if len(buckets) > 1 and min(ready) == len(_parameter_bytes()):
                return ("every all_reduce was launched after the last gradient was ready (in the last hook or in "
                        "finish()): launch each bucket as soon as its own last gradient arrives, so that bucket 0's "
                        "all-reduce overlaps the rest of backward")
            if all(got_b == want_b - 1 for got_b, want_b in zip(ready, (c["gradients ready"] for c in want))):
                return ("every bucket was launched before its last gradient was accumulated into .grad (a tensor "
                        "hook, register_hook, runs before that): use register_post_accumulate_grad_hook (rule 1)")
            return (f"launch bucket b the moment its last gradient arrives: after {[c['gradients ready'] for c in want]} "
                    f"gradients; yours after {ready}")
    values = [result["gradients"] for result in got]
    wanted = [result["gradients"] for result in expected]
    if same_value(to_plain(values), to_plain(local_gradients(world_size, rows_per_rank, lambda w, r: reducer_problem(w, r, *registration))), FLOAT32):
        return "the gradients did not change: finish() must write each bucket's averaged slice back into .grad"
    if same_value(to_plain(values), to_plain(_scaled(wanted, world_size)), FLOAT32):
        return "that is the sum over ranks: divide by the number of ranks in finish()"
    return None


TASKS = (
    Task(1, "Bus bandwidth from a measurement", "bandwidths", _bandwidth_cases, course_bandwidths,
         hint=_bandwidth_hint, examples=2),
    Task(2, "A hierarchical all-reduce on real ranks", "my_hierarchical_all_reduce", _hierarchical_cases,
         hierarchical_expected, rule=FLOAT32, hint=_hierarchical_hint, call="hierarchical_on_ranks",
         describe=_describe_hierarchical, examples=0),
    Task(3, "DDP's gradient buckets", "my_assign_buckets", _bucket_cases, assign_buckets, hint=_bucket_hint,
         examples=3),
    Task(4, "A bucketed reducer", "install_bucketed_reducer", _reducer_cases, reducer_expected, rule=FLOAT32,
         hint=_reducer_hint, call="bucketed_reducer", describe=_describe_reducer, examples=0),
)
