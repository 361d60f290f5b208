"""Which ``torch.distributed`` calls a piece of code makes, in order, on this rank.

    result, calls = with_calls_recorded(expert_parallel_error, [5, 0])
    calls   # ['all_to_all_single', 'all_to_all_single', 'all_to_all_single']

Every communication function in ``launch.TRACED_CALLS`` is wrapped for the duration of the call
and restored afterwards (in ``torch.distributed`` and in ``distributed_c10d``, where torch's own
code looks them up). A call made from inside another recorded call is not counted separately.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from course_lib.collectives.launch import TRACED_CALLS


def with_calls_recorded(fn: Callable, *args, **kwargs) -> tuple[Any, list[str]]:
    """``fn(*args, **kwargs)`` and the names of the communication calls it made, in order."""
    calls: list[str] = []
    depth = [0]
    replaced = []  # (namespace, name, original)
    for name in TRACED_CALLS:
        original = getattr(dist, name, None)
        if original is None:
            continue

        def recorded(*a, _name=name, _original=original, **kw):
            if depth[0] == 0:
                calls.append(_name)
            depth[0] += 1
            try:
                return _original(*a, **kw)
            finally:
                depth[0] -= 1

        functools.update_wrapper(recorded, original)
        for namespace in (dist, c10d):
            if getattr(namespace, name, None) is original:
                setattr(namespace, name, recorded)
                replaced.append((namespace, name, original))
    try:
        return fn(*args, **kwargs), calls
    finally:
        for namespace, name, original in replaced:
            setattr(namespace, name, original)
