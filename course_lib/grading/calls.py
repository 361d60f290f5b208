"""The learner's side of grading: call the learner's function on the grader's inputs, send back data.

This runs where the learner's code runs, so nothing here is trusted: it only turns each case's
inputs (plain data chosen by the grader) into arguments, calls the function with its prints,
warnings and (on ranks) rank output silenced, and returns every result as plain data. The
grader compares those results with values it computed itself.

How a function is called (a task's ``call``):

  direct             ``fn(*args, **kwargs)``; the result is the return value
  in_place_on_ranks  args ``(world_size, inputs)``; rank r builds float32 tensors from
                     ``inputs[r]`` (a list of 1-D lists), calls ``fn(tensor)`` on each, and
                     returns each tensor's contents after the call (the task is in place)
  ddp_gradients      args ``(world_size, rows_per_rank)``; every rank builds the same
                     ``Linear(6, 2)`` and data (fixed seeds), back-propagates the MSE loss of its
                     own rows, calls ``fn(model)``, and returns each parameter's ``.grad``
  repeated_draws     args ``(target_probs, draft_probs, draft_token)``, kwargs ``draws`` and ``seed``;
                     calls ``fn(p, q, draft_token, generator)`` ``draws`` times on float64 tensors
                     (fresh copies each time) and one ``torch.Generator`` seeded with ``seed``, and
                     returns how often each token came back (a token outside the vocabulary, or
                     anything but an int, is an error)
  hierarchical_on_ranks  args ``(world_size, ranks_per_node, inputs)``; rank r (on node
                     r // ranks_per_node) builds float32 tensors from ``inputs[r]``, calls
                     ``fn(tensor, ranks_per_node)`` on each while recording what this rank hands
                     torch.distributed's calls, and returns per tensor ``{"too much across nodes": [...],
                     "tensor": its contents after the call}``: the calls that spanned nodes (a group
                     with ranks on two or more nodes, a send to another node) and were handed more than
                     one shard (``shard_allowance``), plus one record for all of them together when
                     they were handed more than two shards in all, plus those that spanned nodes but
                     left this rank's cross-node group (the ranks with its local rank)
  bucketed_reducer   args ``(world_size, rows_per_rank, buckets[, registration])``; every rank builds the same
                     ``reducer_problem`` model and data, calls ``finish = fn(model, buckets)``,
                     back-propagates the MSE loss of its own rows, calls ``finish()``, and returns
                     ``{"all_reduce calls": [...], "gradients": each parameter's .grad}``: for each
                     ``dist.all_reduce``, its elements, its async_op, how many gradients had been
                     accumulated when it was launched, whether it was waited on while backward was
                     still running (in a hook: a blocking call made there counts), and whether it was
                     waited on at all (``wait()`` on its handle or future, ``torch.futures.wait_all``,
                     or ``value()`` after backward; a future's ``done()`` is no wait)
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import operator
import re
import signal
import threading
import warnings
from typing import Any, Callable

from course_lib.grading.values import PlainDataError, from_plain, to_plain

RANK_TIMEOUT_S = 30.0


class _Discard(io.TextIOBase):
    """Where the learner's prints go while their function is graded: nowhere."""

    def write(self, text: str) -> int:
        return len(text)


_DISCARD = _Discard()


class OutOfTime(BaseException):
    """Raised in the learner's function when its task's time is up (BaseException: a bare
    ``except Exception`` in learner code cannot swallow it)."""


def ddp_problem(world_size: int, rows_per_rank: int):
    """The model and data every rank builds for ``ddp_gradients`` (and the grader, for the reference)."""
    import torch

    inputs = torch.randn(world_size * rows_per_rank, 6, generator=torch.Generator().manual_seed(1))
    targets = torch.randn(world_size * rows_per_rank, 2, generator=torch.Generator().manual_seed(2))
    model = torch.nn.Linear(6, 2)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(0)
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator))
    return model, inputs, targets


def _in_place_rank(fn: Callable, inputs: list) -> list:
    import torch
    import torch.distributed as dist

    results = []
    for values in inputs[dist.get_rank()]:
        tensor = torch.tensor(values, dtype=torch.float32)
        fn(tensor)
        results.append(tensor.tolist())
    return results


def _ddp_rank(fn: Callable, rows_per_rank: int) -> list:
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    model, inputs, targets = ddp_problem(world, rows_per_rank)
    mine = slice(rank * rows_per_rank, (rank + 1) * rows_per_rank)
    torch.nn.functional.mse_loss(model(inputs[mine]), targets[mine]).backward()
    fn(model)
    return [parameter.grad.tolist() for parameter in model.parameters()]


def _token(value: Any, vocab_size: int, draw: int) -> int:
    """``value`` as a token id: an int (or a one-element integer tensor) inside the vocabulary."""
    try:
        if isinstance(value, bool):
            raise TypeError
        token = operator.index(value)
    except TypeError:
        raise TypeError(f"call {draw} returned {value!r:.60} ({type(value).__name__}); return a token id, "
                        "an int") from None
    if not 0 <= token < vocab_size:
        raise ValueError(f"call {draw} returned token {token}, outside the vocabulary (0 to {vocab_size - 1})")
    return token


def _repeated_draws(fn: Callable, target_probs: list, draft_probs: list, draft_token: int, *, draws: int,
                    seed: int) -> list[int]:
    import torch

    p, q = torch.tensor(target_probs, dtype=torch.float64), torch.tensor(draft_probs, dtype=torch.float64)
    generator = torch.Generator().manual_seed(seed)
    counts = [0] * len(target_probs)
    for draw in range(1, draws + 1):
        counts[_token(fn(p.clone(), q.clone(), draft_token, generator), len(counts), draw)] += 1
    return counts


def _record_calls(names: tuple[str, ...], on_call: Callable) -> None:
    """Wrap torch.distributed's functions ``names`` in this rank's process, in ``torch.distributed``
    and in ``distributed_c10d`` alike (as launch.py's tracing does, so that torch's own identity
    checks, ``P2POp``'s among them, still hold). After each call the rank's code makes (not one that
    torch makes inside another), the wrapper returns ``on_call(name, arguments, result)``, with the
    call's arguments by parameter name, defaults filled in."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    depth = threading.local()  # recorded calls this thread is inside

    def wrap(name: str, original: Callable) -> Callable:
        signature = inspect.signature(original)

        @functools.wraps(original)
        def recorded(*args, **kwargs):
            outermost = getattr(depth, "n", 0) == 0
            depth.n = getattr(depth, "n", 0) + 1
            try:
                result = original(*args, **kwargs)
            finally:
                depth.n -= 1
            if not outermost:
                return result
            arguments = signature.bind(*args, **kwargs)
            arguments.apply_defaults()
            return on_call(name, arguments.arguments, result)

        return recorded

    for name in names:
        original = getattr(dist, name, None)
        if original is None:  # not in this torch release
            continue
        recorded = wrap(name, original)
        for namespace in (dist, c10d):
            if getattr(namespace, name, None) is original:
                setattr(namespace, name, recorded)


# The ProcessGroup methods torch.distributed's calls go through (distributed_c10d's ``all_reduce``
# ends in ``group.allreduce([tensor], opts)``), as the torch.distributed call that makes each (the
# name hints use), and the place of the argument that holds what this rank hands it (None: nothing).
PROCESS_GROUP_CALLS = {
    "allreduce": ("all_reduce", 0), "allreduce_coalesced": ("all_reduce_coalesced", 0),
    "broadcast": ("broadcast", 0), "reduce": ("reduce", 0),
    "allgather": ("all_gather", 1), "allgather_coalesced": ("all_gather_coalesced", 1),
    "all_gather_single": ("all_gather_into_tensor", 1), "_allgather_base": ("all_gather_into_tensor", 1),
    "allgather_into_tensor_coalesced": ("all_gather_into_tensor_coalesced", 1),
    "all_gather_single_coalesced": ("all_gather_into_tensor_coalesced", 1),
    "gather": ("gather", 1), "scatter": ("scatter", 1),
    "reduce_scatter": ("reduce_scatter", 1), "reduce_scatter_single": ("reduce_scatter_tensor", 1),
    "_reduce_scatter_base": ("reduce_scatter_tensor", 1),
    "reduce_scatter_single_coalesced": ("reduce_scatter_tensor_coalesced", 1),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter_tensor_coalesced", 1),
    "alltoall": ("all_to_all", 1), "alltoall_base": ("all_to_all_single", 1),
    "all_to_all_single": ("all_to_all_single", 1),
    "barrier": ("barrier", None), "monitored_barrier": ("monitored_barrier", None),
    "send": ("send", 0), "recv": ("recv", None), "recv_anysource": ("recv", None),
}

# Functional collectives (``torch.distributed._functional_collectives``) run these ops, which reach
# the backend from C++, past the ProcessGroup methods; recorded under these names.
FUNCTIONAL_OPS = {name: f"functional {name.rstrip('_')}" for name in (
    "all_reduce", "all_reduce_", "all_reduce_coalesced", "all_reduce_coalesced_", "all_gather_into_tensor",
    "all_gather_into_tensor_out", "all_gather_into_tensor_coalesced", "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced", "all_to_all_single", "broadcast", "broadcast_")}

# torch.distributed calls that make no communication of their own, recorded where they are called.
SETUP_CALLS = ("new_group", "new_subgroups", "new_subgroups_by_enumeration", "split_group")


def _tensors(value: Any) -> list:
    """Every tensor in ``value`` (a tensor, or lists of them)."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [tensor for item in value for tensor in _tensors(item)]
    return []


class _RecordedOp:
    """An op of ``torch.ops`` whose calls are recorded; its overloads (``.default``) and the rest
    are the op's own."""

    def __init__(self, op: Any, recorded: Callable) -> None:
        self._op, self._recorded = op, recorded

    def __call__(self, *args, **kwargs):
        return self._recorded(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._op, name)


def _record_every_call(on_call: Callable[[str, list], None]) -> None:
    """Record every communication this rank's process makes, at the level every path goes through:
    the methods of ``torch.distributed.ProcessGroup`` (and of its backends' classes) that
    torch.distributed's calls end in, so that a call through a name imported with ``from
    torch.distributed import all_reduce``, ``dist.all_reduce.__wrapped__``, ``group.allreduce(...)``
    and coalesced calls are all seen; the ops of functional collectives; and ``SETUP_CALLS``.
    Before each call the rank's code makes (not one made inside another), ``on_call(name, handed)``,
    ``name`` the torch.distributed call's (``PROCESS_GROUP_CALLS``) and ``handed`` the tensors this
    rank hands it, as they are before the call."""
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    depth = threading.local()  # recorded calls this thread is inside

    def wrap(name: str, original: Callable, handed_at: int | None, method: bool) -> Callable:
        @functools.wraps(original)
        def recorded(*args, **kwargs):
            outermost = getattr(depth, "n", 0) == 0
            if outermost:
                place = None if handed_at is None else handed_at + method
                on_call(name, _tensors(args[place]) if place is not None and place < len(args) else [])
            depth.n = getattr(depth, "n", 0) + 1
            try:
                return original(*args, **kwargs)
            finally:
                depth.n -= 1

        recorded._course_recorded = True
        return recorded

    import torch._C._distributed_c10d as c10d_native

    classes = [dist.ProcessGroup, getattr(c10d_native, "Backend", None)]  # a backend called directly, too
    classes += [getattr(dist, backend, None) for backend in ("ProcessGroupGloo", "ProcessGroupNCCL", "ProcessGroupMPI")]
    for cls in classes:
        if not isinstance(cls, type):
            continue
        for method, (name, handed_at) in PROCESS_GROUP_CALLS.items():
            original = cls.__dict__.get(method)
            if original is not None and callable(original) and not getattr(original, "_course_recorded", False):
                setattr(cls, method, wrap(name, original, handed_at, True))
    try:
        import torch.distributed._functional_collectives  # noqa: F401 - what it looks up at import, unwrapped
    except ImportError:
        pass
    namespace = torch.ops._c10d_functional
    for op, name in FUNCTIONAL_OPS.items():
        try:
            original = getattr(namespace, op)
        except (AttributeError, RuntimeError):  # not in this torch release
            continue
        if not isinstance(original, _RecordedOp):
            setattr(namespace, op, _RecordedOp(original, wrap(name, original, 0, False)))
    for name in SETUP_CALLS:
        original = getattr(dist, name, None)
        if original is None:
            continue
        recorded = wrap(name, original, None, False)
        for module in (dist, c10d):
            if getattr(module, name, None) is original:
                setattr(module, name, recorded)


def _numel(value: Any) -> int:
    """Elements of a tensor, or of every tensor in a list (0 for None)."""
    if value is None:
        return 0
    if isinstance(value, (list, tuple)):
        return sum(_numel(item) for item in value)
    return value.numel()


# The argument of each call that holds what this rank hands it (receives carry nothing out).
HANDED_IN = {"all_reduce": "tensor", "broadcast": "tensor", "reduce": "tensor", "all_gather": "tensor",
             "all_gather_into_tensor": "input_tensor", "all_gather_single": "input_tensor",
             "reduce_scatter": "input_list", "reduce_scatter_tensor": "input", "reduce_scatter_single": "input",
             "all_to_all": "input_tensor_list", "all_to_all_single": "input", "scatter": "scatter_list",
             "gather": "tensor", "send": "tensor", "isend": "tensor", "batch_isend_irecv": "p2p_op_list"}


def _handed_in(name: str, arguments: dict) -> list[tuple[str, list[int], int]]:
    """``(call, the ranks it joins, the elements this rank handed it)`` for one recorded call; a
    ``batch_isend_irecv`` gives one entry per send."""
    import torch.distributed as dist

    rank = dist.get_rank()
    if name == "batch_isend_irecv":
        return [("isend in batch_isend_irecv", sorted({rank, op.peer}), _numel(op.tensor))
                for op in arguments["p2p_op_list"] if getattr(op.op, "__name__", "") == "isend"]
    group = dist.group.WORLD if arguments.get("group") is None else arguments["group"]
    if name in ("send", "isend"):
        peer = arguments["dst"] if arguments.get("dst") is not None else dist.get_global_rank(group, arguments["group_dst"])
        return [(name, sorted({rank, peer}), _numel(arguments["tensor"]))]
    return [(name, dist.get_process_group_ranks(group), _numel(arguments[HANDED_IN[name]]))]


def shard_allowance(numel: int, world_size: int, ranks_per_node: int) -> int:
    """The most elements one cross-node call may be handed: a shard, ceil(numel / ranks_per_node),
    or a shard of the tensor padded to a multiple of the world size (equal chunks for a ring
    across the nodes too), ceil(numel / world_size) x the number of nodes, whichever is more."""
    return max(-(-numel // ranks_per_node), -(-numel // world_size) * (world_size // ranks_per_node))


def too_much_across_nodes(handed: list[tuple[str, list[int], int]], ranks_per_node: int, numel: int,
                          world_size: int, rank: int) -> list[dict]:
    """The calls among ``handed`` (made on ``rank``) that spanned nodes and were handed more than
    one shard of a ``numel``-element tensor (``shard_allowance``); then one record for them all
    when together they were handed more than two shards; then those that spanned nodes but left
    this rank's cross-node group (the ranks with its local rank), marked ``"outside"``."""
    shard = shard_allowance(numel, world_size, ranks_per_node)
    across = [(name, ranks, elements) for name, ranks, elements in handed
              if elements and len({r // ranks_per_node for r in ranks}) > 1]
    excess = [{"call": name, "ranks": ranks, "elements": elements} for name, ranks, elements in across if elements > shard]
    total = sum(elements for _, _, elements in across)
    if len(across) > 1 and total > 2 * shard:
        excess.append({"call": f"all {len(across)} cross-node calls",
                       "ranks": sorted({r for _, ranks, _ in across for r in ranks}), "elements": total})
    local_rank = rank % ranks_per_node
    excess += [{"call": name, "ranks": ranks, "elements": elements, "outside": True} for name, ranks, elements in across
               if elements <= shard and any(r % ranks_per_node != local_rank for r in ranks)]
    return excess


def _hierarchical_rank(fn: Callable, ranks_per_node: int, inputs: list) -> list:
    import torch
    import torch.distributed as dist

    handed: list[tuple[str, list[int], int]] = []

    def record(name: str, arguments: dict, result: Any) -> Any:
        handed.extend(_handed_in(name, arguments))
        return result

    _record_calls(tuple(HANDED_IN), record)
    results = []
    for values in inputs[dist.get_rank()]:
        tensor = torch.tensor(values, dtype=torch.float32)
        handed.clear()
        fn(tensor, ranks_per_node)
        results.append({"too much across nodes": too_much_across_nodes(
            handed, ranks_per_node, len(values), dist.get_world_size(), dist.get_rank()),
                        "tensor": tensor.tolist()})
    return results


def reducer_problem(world_size: int, rows_per_rank: int, registration: list[int] | None = None):
    """The model (three ``Linear`` layers, six parameters) and data every rank builds for
    ``bucketed_reducer`` (and the grader, for the reference). ``registration`` (the layers' places
    in the forward pass, e.g. ``[2, 0, 4]``) registers the layers in another order than forward
    uses them, so that ``parameters()`` order is not backward's order reversed."""
    import torch

    inputs = torch.randn(world_size * rows_per_rank, 6, generator=torch.Generator().manual_seed(3))
    targets = torch.randn(world_size * rows_per_rank, 2, generator=torch.Generator().manual_seed(4))
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                                torch.nn.Linear(16, 2))
    with torch.no_grad():
        generator = torch.Generator().manual_seed(5)
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) / 2)
    if registration is not None:
        model = _reordered(model, registration)
    return model, inputs, targets


def _reordered(sequential, registration: list[int]):
    """``sequential``'s forward pass, its layers registered in the order ``registration``."""
    import torch

    class Reordered(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            for place in registration:
                self.add_module(f"layer{place}", sequential[place])
            self.steps = tuple(sequential)  # a tuple: not registered a second time

        def forward(self, x):
            for step in self.steps:
                x = step(x)
            return x

    return Reordered()


class _Waits:
    """When the learner's code waited on one ``async_op=True`` all-reduce: while backward was still
    running (in a hook), and after ``backward()`` had returned (in ``finish()``)."""

    def __init__(self, phase: dict) -> None:
        self.phase, self.during_backward, self.after_backward = phase, False, False

    def note(self) -> None:
        if self.phase["backward returned"]:
            self.after_backward = True
        else:
            self.during_backward = True


def _watched_future(future, waits: _Waits):
    """A ``torch.futures.Future`` that completes with ``future`` and notes each wait on it (a
    ``wait()``, a ``value()`` once backward returned, ``torch.futures.wait_all``/``collect_all``,
    or a wait on a future chained from it by ``then``). A real future, so torch accepts it."""
    import torch

    class Watched(torch.futures.Future):
        def wait(self):
            waits.note()
            return super().wait()

        def value(self):
            if waits.phase["backward returned"]:  # read in finish(); in a then-callback it is no wait
                waits.note()
            return super().value()

        def then(self, callback):
            return _watched_future(super().then(callback), waits)

    watched = Watched()
    watched._course_waits = waits

    def complete(done) -> None:
        try:
            result = done.value()
        except BaseException as error:  # noqa: BLE001 - the all-reduce's own failure, passed on
            watched.set_exception(error)
        else:
            watched.set_result(result)

    future.add_done_callback(complete)
    return watched


def _watch_wait_all(phase: dict) -> None:
    """``torch.futures.wait_all`` and ``collect_all`` note a wait on each watched future handed them."""
    import torch.futures

    def noting(original: Callable) -> Callable:
        @functools.wraps(original)
        def call(futures, *args, **kwargs):
            futures = list(futures)
            for future in futures:
                if getattr(future, "_course_waits", None) is not None:
                    future._course_waits.note()
            return original(futures, *args, **kwargs)
        return call

    for name in ("wait_all", "collect_all"):
        setattr(torch.futures, name, noting(getattr(torch.futures, name)))


class _Handle:
    """What an ``async_op=True`` all-reduce returns to the learner's code: the real handle, noting
    when it (or its future) was waited on."""

    def __init__(self, work, waits: _Waits) -> None:
        self._work, self._waits = work, waits

    def wait(self, *args, **kwargs):
        self._waits.note()
        return self._work.wait(*args, **kwargs)

    def get_future(self):
        return _watched_future(self._work.get_future(), self._waits)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def _reducer_rank(fn: Callable, rows_per_rank: int, buckets: list, registration: list[int] | None = None) -> dict:
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    model, inputs, targets = reducer_problem(world, rows_per_rank, registration)
    parameters = list(model.parameters())
    accumulated: list[int] = []
    for index, parameter in enumerate(parameters):  # registered first, so each runs before the learner's hooks
        parameter.register_post_accumulate_grad_hook(lambda _, index=index: accumulated.append(index))
    phase = {"backward returned": False}
    launches: list[tuple[dict, _Waits]] = []

    def record(name: str, arguments: dict, work: Any) -> Any:
        waits = _Waits(phase)
        if work is None:  # a blocking call waits where it is made
            waits.note()
        launches.append(({"elements": _numel(arguments["tensor"]), "async_op": bool(arguments["async_op"]),
                          "gradients ready": len(accumulated)}, waits))
        return None if work is None else _Handle(work, waits)

    _record_calls(("all_reduce",), record)
    _watch_wait_all(phase)
    finish = fn(model, buckets)
    if not callable(finish):
        raise TypeError(f"the function returned {type(finish).__name__}, not a function: return finish, "
                        "the function that waits for the all-reduces and writes the averages back")
    mine = slice(rank * rows_per_rank, (rank + 1) * rows_per_rank)
    torch.nn.functional.mse_loss(model(inputs[mine]), targets[mine]).backward()
    phase["backward returned"] = True
    finish()
    return {"all_reduce calls": [{**launch, "waited during backward": waits.during_backward,
                                  "waited on": waits.during_backward or waits.after_backward}
                                 for launch, waits in launches],
            "gradients": [parameter.grad.tolist() for parameter in parameters]}


def _on_ranks(rank_fn: Callable) -> Callable:
    def call(fn: Callable, world_size: int, *args) -> list:
        from course_lib.collectives.launch import run_on_ranks
        return run_on_ranks(rank_fn, world_size, fn, *args, timeout_s=RANK_TIMEOUT_S, on_print=lambda rank, line: None)
    return call


CALLS: dict[str, Callable[..., Any]] = {
    "direct": lambda fn, *args, **kwargs: fn(*args, **kwargs),
    "in_place_on_ranks": _on_ranks(_in_place_rank),
    "ddp_gradients": _on_ranks(_ddp_rank),
    "repeated_draws": _repeated_draws,
    "hierarchical_on_ranks": _on_ranks(_hierarchical_rank),
    "bucketed_reducer": _on_ranks(_reducer_rank),
}


@contextlib.contextmanager
def deadline(seconds: float):
    def expire(signum, frame):
        raise OutOfTime()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_cases(fn: Callable, call: str, cases: list[dict], time_limit_s: float) -> list[dict]:
    """Outcomes of calling ``fn`` on each plain case ``{"args": [...], "kwargs": {...}}``, in order:
    ``{"value": plain}``, ``{"error": "Type: message"}`` (``_error_outcome``), or ``{"timeout": True}`` for the case
    running when the time ran out and every case after it."""
    outcomes: list[dict] = []
    caller = CALLS[call]
    try:
        with deadline(time_limit_s):
            for case in cases:
                args, kwargs = from_plain(case["args"]), from_plain(case["kwargs"])
                with warnings.catch_warnings(), contextlib.redirect_stdout(_DISCARD), contextlib.redirect_stderr(_DISCARD):
                    warnings.simplefilter("ignore")
                    try:
                        outcomes.append({"value": to_plain(caller(fn, *args, **kwargs))})
                    except (OutOfTime, KeyboardInterrupt):  # time is up, or the learner pressed stop
                        raise
                    except BaseException as error:  # noqa: BLE001 - sys.exit() too is the learner's result
                        outcomes.append(_error_outcome(error))
    except OutOfTime:
        pass
    return outcomes + [{"timeout": True}] * (len(cases) - len(outcomes))


NOT_WRITTEN = "NotImplementedError: Your code here"  # what a starter raises (exercise.py), also from a rank


def _error_outcome(error: BaseException) -> dict:
    """``{"error": "Type: message"}``, with ``"unwritten": name`` when the error is a starter's
    ``raise NotImplementedError`` in function ``name`` (maybe another task's, which this one calls)."""
    text = _error_text(error)
    if NOT_WRITTEN not in text:
        return {"error": text}
    if type(error).__name__ == "RankFailure":  # the rank's traceback is in the message: its last frame
        frames = re.findall(r", in (\w+)\n", str(error).split(NOT_WRITTEN, 1)[0])
        name = frames[-1] if frames else None
    else:
        last = error.__traceback__
        while last is not None and last.tb_next is not None:
            last = last.tb_next
        name = last.tb_frame.f_code.co_name if last is not None else None
    return {"error": text, "unwritten": name} if name else {"error": text}


def _error_text(error: BaseException) -> str:
    if isinstance(error, PlainDataError):
        return f"a result that cannot be graded: {error}"
    text = f"{type(error).__name__}: {error}"
    lead = _rank_raised(str(error)) if type(error).__name__ == "RankFailure" else None
    if lead is not None:  # the learner's exception line first, where a shortened message still shows it
        text = f"RankFailure: {lead}\n{error}"
    return shortened(text, 2000)


def _rank_raised(message: str) -> str | None:
    """``"rank r raised Type: message"`` from a ``RankFailure`` that leads with a rank's traceback."""
    from course_lib.collectives.launch import _one_line

    first, _, rest = message.partition("\n")
    if not (first.startswith("rank ") and first.endswith(" raised:")):
        return None
    trace = rest.split("\nThe other ranks:\n", 1)[0]
    return f"{first[:-1]} {_one_line(trace)}"


def shortened(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters. A ``RankFailure``'s lines on the other ranks
    (after "The other ranks:", the least telling part) get at most a quarter, cut at their end;
    the rest is cut from its middle, so that its start (the exception line) and its end (the
    traceback's last frames, the learner's own) both stay."""
    lead, marker, others = text.partition("\nThe other ranks:\n")
    if marker:
        others = marker + others
        if len(others) > limit // 4:
            others = others[:limit // 4 - 4].rstrip() + " ..."
        return _middle_cut(lead, limit - len(others)) + others
    return _middle_cut(text, limit)


def _middle_cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head = limit * 2 // 5
    return (f"{text[:head].rstrip()}\n  [... {len(text) - limit} characters left out ...]\n"
            f"{text[len(text) - (limit - head):].lstrip()}")
