"""Run one function on N real ``torch.distributed`` ranks, from a script or a notebook cell.

    def demo():
        t = torch.tensor([dist.get_rank() + 1.0])
        dist.all_reduce(t)
        return t

    run_on_ranks(demo, world_size=4)   # -> [tensor([10.]), tensor([10.]), tensor([10.]), tensor([10.])]

Each rank is a fresh process joined to one process group (gloo on CPUs, NCCL when every rank
can have its own GPU). Return values (tensors included) come back in rank order. What a rank
prints appears in the caller's output prefixed with ``[rank r]``.

A run never hangs: the caller watches every rank, and every collective a rank enters and leaves.
When ``timeout_s`` passes, all ranks are stopped and ``CollectiveTimeout`` names the ranks
that did not finish and the collective each is stuck in. A rank that raises stops the others
and ``RankFailure`` carries its traceback.

Ranks start by ``fork`` where the OS has it (Linux), so functions defined in a notebook cell
work; elsewhere they start by ``spawn`` and the function must be importable from a module.
"""

from __future__ import annotations

import datetime
import io
import multiprocessing
import os
import queue as queue_module
import socket
import sys
import time
import traceback
from typing import Any, Callable

import torch
import torch.distributed as dist

if sys.platform == "linux":  # ranks talk over loopback, whatever the machine's network
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

TRACED_CALLS = ("broadcast", "reduce", "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single",
                "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "all_to_all", "all_to_all_single",
                "scatter", "gather", "barrier", "send", "recv", "isend", "irecv")


class RankFailure(RuntimeError):
    """A rank raised an exception or died; the message holds its traceback or exit code."""


class CollectiveTimeout(TimeoutError):
    """The run passed its time limit; the message says which ranks were stuck where."""


def default_backend(world_size: int) -> str:
    """NCCL when there is a GPU for every rank, gloo otherwise. Also gloo once this process has
    started CUDA: forked ranks cannot use CUDA then."""
    if torch.cuda.is_initialized() or not torch.cuda.is_available() or torch.cuda.device_count() < world_size:
        return "gloo"
    return "nccl"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _QueueWriter(io.TextIOBase):
    """A rank's stdout/stderr: whole lines go to the caller as ('print', rank, text)."""

    def __init__(self, messages, rank: int) -> None:
        self.messages, self.rank, self.buffer = messages, rank, ""

    def write(self, text: str) -> int:
        self.buffer += text
        while "\n" in self.buffer:
            line, self.buffer = self.buffer.split("\n", 1)
            self.messages.put(("print", self.rank, line))
        return len(text)

    def flush(self) -> None:
        if self.buffer:
            self.messages.put(("print", self.rank, self.buffer))
            self.buffer = ""


def _trace_collectives(messages, rank: int) -> None:
    """Wrap torch.distributed's communication calls (in this rank's process only) so the caller
    knows which one each rank is inside."""
    for name in TRACED_CALLS:
        original = getattr(dist, name, None)
        if original is None:  # not in this torch release
            continue

        def traced(*args, _original=original, _name=name, **kwargs):
            messages.put(("enter", rank, _name))
            result = _original(*args, **kwargs)
            messages.put(("exit", rank, _name))
            return result

        setattr(dist, name, traced)


def _rank_main(rank: int, world_size: int, backend: str, init_method: str, timeout_s: float, trace_calls: bool,
               fn: Callable, args: tuple, kwargs: dict, messages) -> None:
    sys.stdout = sys.stderr = _QueueWriter(messages, rank)
    try:
        torch.set_num_threads(1)  # N ranks share the machine's cores
        if backend == "nccl":
            torch.cuda.set_device(rank)
        # the backend's own timeout comes later than the caller's, whose message says more
        dist.init_process_group("cpu:gloo,cuda:nccl" if backend == "nccl" else backend,  # CPU tensors work under NCCL too
                                init_method=init_method, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=2 * timeout_s + 10))
        if trace_calls:
            _trace_collectives(messages, rank)
        result = fn(*args, **kwargs)
        payload = io.BytesIO()
        torch.save(_to_cpu(result), payload)
        sys.stdout.flush()
        messages.put(("result", rank, payload.getvalue()))
    except BaseException:  # noqa: BLE001 - everything a rank raises goes back to the caller
        sys.stdout.flush()
        messages.put(("error", rank, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _to_cpu(value: Any) -> Any:
    """Tensors (also inside lists, tuples and dicts) moved to the CPU so the caller can load them."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    return value


def run_on_ranks(fn: Callable, world_size: int, *args, backend: str | None = None, timeout_s: float = 60.0,
                 on_print: Callable[[int, str], None] | None = None, trace_calls: bool = True, **kwargs) -> list:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks; return each rank's result, in rank order.

    ``on_print(rank, line)`` receives what the ranks print (default: print it prefixed).
    ``trace_calls=False`` skips watching collectives (for timing: a timeout then cannot say where
    each rank was).
    """
    if not 1 <= world_size <= 64:
        raise ValueError(f"world_size must be between 1 and 64, got {world_size}.")
    backend = backend or default_backend(world_size)
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    if method == "spawn" and fn.__module__ == "__main__":
        raise ValueError(f"{fn.__name__} is defined in the notebook, but this OS starts ranks by spawn: "
                         "move it into a .py module and import it.")
    context = multiprocessing.get_context(method)
    messages = context.Queue()
    init_method = f"tcp://127.0.0.1:{_free_port()}"
    processes = [context.Process(target=_rank_main, daemon=True,
                                 args=(rank, world_size, backend, init_method, timeout_s, trace_calls, fn, args, kwargs,
                                       messages))
                 for rank in range(world_size)]
    for process in processes:
        process.start()
    on_print = on_print or (lambda rank, line: print(f"[rank {rank}] {line}", flush=True))
    try:
        return _collect(processes, messages, timeout_s, on_print)
    finally:
        grace_until = time.monotonic() + 1.0  # ranks that returned are closing their process group
        for process in processes:
            process.join(timeout=max(0.0, grace_until - time.monotonic()))
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join()
        messages.close()


def _collect(processes, messages, timeout_s: float, on_print) -> list:
    world_size = len(processes)
    results: dict[int, Any] = {}
    inside: dict[int, list[str]] = {rank: [] for rank in range(world_size)}  # collectives entered, not left
    last_call: dict[int, str] = {}
    calls: dict[int, int] = {rank: 0 for rank in range(world_size)}
    deadline = time.monotonic() + timeout_s
    while len(results) < world_size:
        # checked on every pass: a chatty rank must not keep the deadline from being noticed
        if time.monotonic() > deadline:
            raise CollectiveTimeout(_timeout_message(timeout_s, results, inside, last_call, calls, world_size))
        for rank, process in enumerate(processes):
            if rank not in results and process.exitcode not in (None, 0):
                raise RankFailure(f"rank {rank} died with exit code {process.exitcode} (out of memory, or "
                                  "killed) before returning.")
        try:
            kind, rank, body = messages.get(timeout=max(0.001, min(0.05, deadline - time.monotonic())))
        except queue_module.Empty:
            continue
        if kind == "print":
            on_print(rank, body)
        elif kind == "enter":
            inside[rank].append(body)
            last_call[rank] = body
            calls[rank] += 1
        elif kind == "exit":
            inside[rank].remove(body)
        elif kind == "error":
            raise RankFailure(f"rank {rank} raised:\n{body}")
        elif kind == "result":
            results[rank] = torch.load(io.BytesIO(body), weights_only=False)
    return [results[rank] for rank in range(world_size)]


def _timeout_message(timeout_s, results, inside, last_call, calls, world_size) -> str:
    stuck = [rank for rank in range(world_size) if rank not in results]
    lines = [f"No result after {timeout_s:g} s from rank(s) {', '.join(map(str, stuck))}; all ranks were stopped."]
    for rank in stuck:
        if inside[rank]:
            where = f"inside {inside[rank][-1]} (its communication call #{calls[rank]})"
        elif rank in last_call:  # e.g. waiting on the handle of an isend or an async_op collective
            where = f"outside any blocking call; its last call (#{calls[rank]}) was {last_call[rank]}"
        else:
            where = "computing, before any communication call"
        lines.append(f"  rank {rank}: {where}")
    lines.append("Every rank must make the same collective calls in the same order (and matching send/recv "
                 "pairs); a rank that skips one, or calls a different one, leaves the others waiting.")
    return "\n".join(lines)

