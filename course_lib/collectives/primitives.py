"""The six collective primitives, run per rank for module 05 (call through ``run_on_ranks``).

Rank r starts with ``starting_tensor(r, N)`` = [10r+1, 10r+2, ..., 10r+N], so every value
says which rank it came from and where it sat.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

PRIMITIVES = ("broadcast", "reduce", "all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def all_gather_flat(output: torch.Tensor, tensor: torch.Tensor, **kwargs):
    """Every rank's ``tensor`` concatenated into ``output`` (``dist.all_gather_single`` from torch
    2.13, ``all_gather_into_tensor`` before)."""
    return (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(output, tensor, **kwargs)


def reduce_scatter_flat(output: torch.Tensor, tensor: torch.Tensor, **kwargs):
    """Rank r's ``output`` = the sum of every rank's r-th slice of ``tensor``
    (``dist.reduce_scatter_single`` from torch 2.13, ``reduce_scatter_tensor`` before)."""
    return (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(output, tensor, **kwargs)


def starting_tensor(rank: int, world_size: int) -> torch.Tensor:
    return torch.arange(1, world_size + 1, dtype=torch.float32) + 10 * rank


def run_primitive(name: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """This rank's tensor before and after primitive ``name`` (None: the primitive leaves nothing
    defined on this rank, e.g. a reduce's non-root ranks)."""
    if name not in PRIMITIVES:
        raise ValueError(f"Unknown primitive {name!r}; choose one of {PRIMITIVES}.")
    rank, world = dist.get_rank(), dist.get_world_size()
    before = starting_tensor(rank, world)
    data = before.clone()
    if name == "broadcast":  # rank 0's tensor everywhere
        dist.broadcast(data, src=0)
        return before, data
    if name == "reduce":  # the sum, on rank 0 only
        dist.reduce(data, dst=0)
        return before, data if rank == 0 else None
    if name == "all_reduce":  # the sum, everywhere
        dist.all_reduce(data)
        return before, data
    if name == "all_gather":  # every rank's tensor, concatenated, everywhere
        gathered = torch.empty(world * world)
        all_gather_flat(gathered, data)
        return before, gathered
    if name == "reduce_scatter":  # rank r gets the sum of everyone's element r
        shard = torch.empty(1)
        reduce_scatter_flat(shard, data)
        return before, shard
    received = torch.empty(world)  # all_to_all: rank r gets element r of every rank, a transpose
    dist.all_to_all_single(received, data)
    return before, received


def all_reduce_identities(numel: int = 12, seed: int = 0) -> dict[str, float]:
    """All-reduce three ways on the same random data; the largest difference from dist.all_reduce
    for ReduceScatter + AllGather and for Reduce + Broadcast. ``numel`` must divide by N."""
    rank, world = dist.get_rank(), dist.get_world_size()
    data = torch.randn(numel, generator=torch.Generator().manual_seed(seed + rank))
    expected = data.clone()
    dist.all_reduce(expected)
    shard = torch.empty(numel // world)
    reduce_scatter_flat(shard, data)
    via_shards = torch.empty(numel)
    all_gather_flat(via_shards, shard)
    via_root = data.clone()
    dist.reduce(via_root, dst=0)
    dist.broadcast(via_root, src=0)
    return {"reduce_scatter + all_gather": (via_shards - expected).abs().max().item(),
            "reduce + broadcast": (via_root - expected).abs().max().item()}


def overlap_with_async_op(size: int = 256) -> dict[str, float]:
    """Start an all-reduce with ``async_op=True``, compute something independent, then wait."""
    rank = dist.get_rank()
    gradient = torch.full((size,), float(rank + 1))
    work = dist.all_reduce(gradient, async_op=True)  # returns at once with a handle
    activations = torch.randn(size, size) @ torch.randn(size, size)  # independent work meanwhile
    work.wait()  # the reduced gradient is only safe to read after this
    expected = sum(range(1, dist.get_world_size() + 1))
    return {"error": (gradient - expected).abs().max().item(), "computed_meanwhile": activations.numel()}
