"""Ring all-reduce from point-to-point sends: scatter-reduce, then all-gather.

The buffer is split into N chunks and the ranks form a ring (rank r sends to r+1, receives
from r-1). Scatter-reduce: in step s, rank r sends chunk (r - s) mod N and adds the chunk it
receives, (r - s - 1) mod N, into its own; after N-1 steps rank r holds the complete sum of
chunk (r + 1) mod N. All-gather: the same motion N-1 more times, overwriting instead of adding,
until every rank holds every summed chunk.

Every rank sends 2(N-1) chunks of K/N elements: 2(N-1)/N x K in all, nearly independent of N,
which is why the ring is bandwidth-optimal; but the 2(N-1) steps run one after another, so its
latency grows linearly with N.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from course_lib.collectives.trace import CommTrace


def _exchange(send: torch.Tensor, dst: int, receive: torch.Tensor, src: int) -> None:
    """Send one chunk while receiving another (empty chunks are skipped on both sides alike)."""
    request = dist.isend(send, dst) if send.numel() else None
    if receive.numel():
        dist.recv(receive, src)
    if request is not None:
        request.wait()


def ring_all_reduce(tensor: torch.Tensor, record_values: bool = False) -> CommTrace:
    """Sum ``tensor`` across all ranks, in place, by the ring algorithm; return this rank's trace."""
    rank, world = dist.get_rank(), dist.get_world_size()
    trace = CommTrace(rank, world, record_values)
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.flatten()
    chunks = flat.tensor_split(world)
    right, left = (rank + 1) % world, (rank - 1) % world
    incoming = torch.empty_like(chunks[0])
    for step in range(world - 1):
        send, receive = (rank - step) % world, (rank - step - 1) % world
        landing = incoming[:chunks[receive].numel()]
        _exchange(chunks[send], right, landing, left)
        trace.sent("scatter-reduce", step, right, send, chunks[send])
        chunks[receive].add_(landing)
        trace.snapshot("scatter-reduce", step, flat)
    for step in range(world - 1):
        send, receive = (rank + 1 - step) % world, (rank - step) % world
        _exchange(chunks[send], right, chunks[receive], left)
        trace.sent("all-gather", step, right, send, chunks[send])
        trace.snapshot("all-gather", step, flat)
    if flat.data_ptr() != tensor.data_ptr():
        tensor.copy_(flat.view_as(tensor))
    return trace
