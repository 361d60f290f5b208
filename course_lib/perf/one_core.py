"""Timing on one core, in CPU time: what a piece of work costs on a core of its own, however
busy the machine is.

Wall-clock time on a shared machine counts the moments the operating system gave the cores to
other programs. With several PyTorch threads it is worse: each parallel operation waits for its
slowest thread, so one thread taken off its core stalls the others, and under load small
operations slow down many times more than big ones (a 16-token prefill once took longer than a
512-token one). On one thread PyTorch runs each operation in the calling thread, and that
thread's CPU time counts only the time the work itself ran. Other programs still share the
memory bus and the caches, so a busy machine can still slow memory-bound work somewhat.

torch is imported only when a context is entered, so the other cost models stay torch-free.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterator


@contextmanager
def one_thread() -> Iterator[None]:
    """PyTorch on one intra-op thread inside the block; its thread count as before afterwards."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def cpu_seconds(run: Callable[[], object]) -> float:
    """CPU seconds the calling thread spent in ``run()`` (inside ``one_thread``: the work's own
    time, without the time other programs had the core)."""
    started = time.thread_time()
    run()
    return max(time.thread_time() - started, 1e-9)

