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
"""

from __future__ import annotations

import contextlib
import io
import operator
import signal
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
    ``{"value": plain}``, ``{"error": "Type: message"}``, or ``{"timeout": True}`` for the case
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
                        outcomes.append({"error": _error_text(error)})
    except OutOfTime:
        pass
    return outcomes + [{"timeout": True}] * (len(cases) - len(outcomes))


def _error_text(error: BaseException) -> str:
    if isinstance(error, PlainDataError):
        return f"a result that cannot be graded: {error}"
    return f"{type(error).__name__}: {error}"[:2000]
