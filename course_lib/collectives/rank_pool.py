"""A pool of N ranks that stay up between calls: for work that talks to its ranks step by step.

    pool = RankPool(2, load_shard, "tiny-llama")    # each rank: state = load_shard("tiny-llama")
    pool.call(forward, batch)                        # each rank: forward(state, batch); results in rank order
    pool.close()

``run_on_ranks`` starts fresh processes for one function; an engine that runs one forward pass
per step cannot pay a second of start-up each step. The pool starts its ranks once (the same
start-up code as ``run_on_ranks``, ``RankProcesses.launch``: one process group joined through a
file, a barrier before ``setup``, a retry should joining lose a connection, traced collectives,
output passed on), then every ``call`` sends one command to every rank and waits for all their results.

The launcher's guarantees hold per call, and a failure stops the ranks only when they are out of
step. An exception that leaves every rank answering, after the same collective calls (a bad
argument every rank refuses, an error after the last collective), is raised as ``RankFailure``
and the same ranks take the next call. A rank that dies, a rank left waiting inside a collective
for a peer that raised, or a call past ``timeout_s`` stops every rank (``RankFailure`` /
``CollectiveTimeout`` says which rank was where); a stopped pool refuses further calls (its ranks'
state is gone): make a new one.

A call left by the caller's own exception (Ctrl-C while waiting) is not lost: the ranks finish it,
and the next call first reads its replies (bounded by the timeout) and drops them, so no rank is
left inside a collective and no reply is taken for a later call's.

Commands travel by pickle, so ``fn`` must be a module-level function; the set-up function and its
arguments are inherited when ranks start by ``fork`` (Linux), so a model object passes for free.
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import threading
import time
import weakref
from typing import Any, Callable

import torch.distributed as dist

from course_lib.collectives.launch import (CollectiveTimeout, RankFailure, RankPlan, RankProcesses, default_backend,
                                          join_process_group, report_result)

_STOP = b""  # the command that ends a rank's loop
PARENT_CHECK_S = 1.0  # how often a rank checks that the process that started it is still alive


def _exit_with_parent(parent: int) -> None:
    """End this rank when its parent dies (SIGKILL, SIGTERM): it would wait for commands forever."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(0)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def _pool_rank_main(rank: int, plan: RankPlan, setup: Callable, args: tuple, kwargs: dict, commands,
                    parent: int) -> None:
    # A notebook's interrupt signals the kernel's whole process group, these ranks included; the
    # caller stops them itself, so they must not die of it between commands.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_with_parent(parent)
    state: dict[str, Any] = {}

    def start() -> None:
        join_process_group(rank, plan)
        state["value"] = setup(*args, **kwargs)

    def run(payload: bytes) -> Any:
        fn, call_args, call_kwargs = pickle.loads(payload)  # inside report_result: a failure here is reported too
        return fn(state["value"], *call_args, **call_kwargs)

    try:
        # a rank that failed to start leaves its command queue alone: should the launch be retried,
        # killing it inside commands.get() would leave the queue's lock held for its successor
        if report_result(plan.messages, rank, start):
            while (payload := commands.get()) != _STOP:
                report_result(plan.messages, rank, lambda: run(payload))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _shut_down(ranks: RankProcesses, commands: list, grace_s: float) -> None:
    for queue in commands:
        queue.cancel_join_thread()  # a dead rank never reads what is queued to it: do not wait on its pipe at exit
        try:
            queue.put(_STOP)
        except (ValueError, OSError):  # already closed
            pass
    ranks.messages.cancel_join_thread()
    ranks.stop(grace_s)
    for queue in commands:
        queue.close()


class RankPool:
    """``world_size`` ranks in one process group, each holding ``setup(*args, **kwargs)``'s result.

    Invariant: every rank has run the same commands in the same order; a call returns only when
    every rank has answered it."""

    def __init__(self, world_size: int, setup: Callable, *args, backend: str | None = None,
                 timeout_s: float = 60.0, on_print: Callable[[int, str], None] | None = None, **kwargs) -> None:
        self.world_size, self.timeout_s = world_size, timeout_s
        self.backend = backend or default_backend(world_size)
        self._ranks = RankProcesses(world_size, setup, on_print, "rank_pool_", self.backend, timeout_s)
        self._commands = [self._ranks.context.Queue() for _ in range(world_size)]
        self._closed_because: str | None = None
        self._unanswered: str | None = None  # the call a caller's exception left before its replies were read
        self._finalizer = weakref.finalize(self, _shut_down, self._ranks, self._commands, 0.5)
        commands, parent = self._commands, os.getpid()
        try:
            self._ranks.launch(_pool_rank_main, lambda rank: (setup, args, kwargs, commands[rank], parent))
        except BaseException as error:
            self._stop_after(error, "starting the ranks")
            raise
        # every rank has opened its log: the files live on in the open descriptors, and nothing is left
        # behind however this process ends (a kernel restart skips the finalizer)
        shutil.rmtree(self._ranks.log_dir, ignore_errors=True)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def _stop_after(self, error: BaseException, what: str) -> None:
        cause = getattr(error, "cause", "")
        self._closed_because = f"{type(error).__name__} while {what}" + (f" ({cause})" if cause else "")
        self._finalizer()

    @property
    def closed_because(self) -> str:
        """Why the ranks are gone: after which failure, or "by close()"."""
        return f"after a {self._closed_because}" if self._closed_because else "by close()"

    def call(self, fn: Callable, *args, timeout_s: float | None = None, **kwargs) -> list:
        """``fn(state, *args, **kwargs)`` on every rank; their results in rank order. ``fn`` and the
        arguments are pickled here first, so what cannot be sent fails at once."""
        if self.closed:
            raise RuntimeError(f"This pool's ranks were stopped {self.closed_because}; start a new one.")
        payload = pickle.dumps((fn, args, kwargs))
        limit = self.timeout_s if timeout_s is None else timeout_s
        if self._unanswered is not None:
            try:
                self._collect(f"finishing {self._unanswered}, a call interrupted earlier", limit)
            except RankFailure as failure:
                if not failure.ranks_in_step:
                    raise
                # the ranks are in step again; the interrupted call's own error had no caller left to tell
        name = getattr(fn, "__name__", repr(fn))
        try:
            for queue in self._commands:
                queue.put(payload)
        except BaseException as error:  # some ranks got the command, some did not: they are out of step
            self._stop_after(error, f"sending {name}")
            raise
        self._unanswered = name
        return self._collect(f"running {name}", limit)

    def _collect(self, what: str, limit: float) -> list:
        """The replies to the call sent last. The ranks' failures end it (the pool stops unless they
        are in step); the caller's own exception (Ctrl-C) leaves it unanswered, to be read next call."""
        try:
            results = self._ranks.collect(limit)
        except (RankFailure, CollectiveTimeout) as error:
            self._unanswered = None
            if not (isinstance(error, RankFailure) and error.ranks_in_step):
                self._stop_after(error, what)
            raise
        self._unanswered = None
        return results

    def close(self) -> None:
        """Stop the ranks (idempotent)."""
        self._finalizer()

    def __enter__(self) -> "RankPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

