"""Ring all-reduce from point-to-point sends: scatter-reduce, then all-gather.

The buffer is split into N chunks and the ranks form a ring (rank r sends to r+1, receives
from r-1). Scatter-reduce: in step s, rank r sends chunk (r - s) mod N and adds the chunk it
receives, (r - s - 1) mod N, into its own; after N-1 steps rank r holds the complete sum of
chunk (r + 1) mod N. All-gather: the same motion N-1 more times, overwriting instead of adding,
until every rank holds every summed chunk.

Every rank sends 2(N-1) chunks of K/N elements: 2(N-1)/N x K in all, nearly independent of N,
which is why the ring is bandwidth-optimal; but the 2(N-1) steps run one after another, so its
latency grows linearly with N.

With ``group`` (from ``dist.new_group``) the ring runs over that group's members only, in the
group's rank order; every member must call it, and ranks outside the group must not. Sends
go to global ranks, and the trace records global ranks as ``src``/``dst`` (its ``world_size``
is the ring's size).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from course_lib.collectives.trace import CommTrace


def _exchange(send: torch.Tensor, dst: int, receive: torch.Tensor, src: int, group=None) -> None:
    """Send one chunk while receiving another (empty chunks are skipped on both sides alike);
    ``dst`` and ``src`` are global ranks."""
    request = dist.isend(send, dst, group=group) if send.numel() else None
    if receive.numel():
        dist.recv(receive, src, group=group)
    if request is not None:
        request.wait()


def _global(group, group_rank: int) -> int:
    """The global rank of ``group``'s member ``group_rank`` (itself without a group)."""
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


def ring_all_reduce(tensor: torch.Tensor, record_values: bool = False, group=None) -> CommTrace:
    """Sum ``tensor`` across all ranks (or the members of ``group``), in place, by the ring
    algorithm; return this rank's trace."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    trace = CommTrace(dist.get_rank(), world, record_values)
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.flatten()
    chunks = flat.tensor_split(world)
    right, left = _global(group, (rank + 1) % world), _global(group, (rank - 1) % world)
    incoming = torch.empty_like(chunks[0])
    for step in range(world - 1):
        send, receive = (rank - step) % world, (rank - step - 1) % world
        landing = incoming[:chunks[receive].numel()]
        _exchange(chunks[send], right, landing, left, group)
        trace.sent("scatter-reduce", step, right, send, chunks[send])
        chunks[receive].add_(landing)
        trace.snapshot("scatter-reduce", step, flat)
    for step in range(world - 1):
        send, receive = (rank + 1 - step) % world, (rank - step) % world
        _exchange(chunks[send], right, chunks[receive], left, group)
        trace.sent("all-gather", step, right, send, chunks[send])
        trace.snapshot("all-gather", step, flat)
    if flat.data_ptr() != tensor.data_ptr():
        tensor.copy_(flat.view_as(tensor))
    return trace
