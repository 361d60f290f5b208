"""Tree all-reduce from point-to-point sends, and the double binary tree idea.

Binary tree: the ranks sit in a heap-shaped tree (position i has children 2i+1 and 2i+2).
Reduce: every rank adds its children's buffers into its own, then sends the sum to its parent;
the root ends with the total. Broadcast: the root sends the total down the same tree. Each
phase takes ceil(log2 N) levels, so latency grows with log N instead of N; but an interior
rank receives from two children and sends to two, while a leaf only sends up and receives
down, so the links are used unevenly.

Double binary tree (NCCL 2.4+): split the buffer in halves and reduce each over its own tree,
the second tree the mirror image of the first, so that most ranks are interior in one tree and
a leaf in the other and the two halves keep the links busy: the load evens out, though not
exactly (at 8 ranks, 6,000 against 8,000 bytes per rank for a 4,000-byte buffer). Here the two halves
run one after the other, which shows the balanced traffic; NCCL also pipelines them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from course_lib.collectives.trace import CommTrace


def _depth(position: int) -> int:
    return (position + 1).bit_length() - 1


def _tree_all_reduce(flat: torch.Tensor, order: list[int], trace: CommTrace, label: str) -> None:
    """All-reduce ``flat`` over the binary tree whose position i holds rank ``order[i]``."""
    world = len(order)
    position = order.index(trace.rank)
    children = [order[c] for c in (2 * position + 1, 2 * position + 2) if c < world]
    parent = order[(position - 1) // 2] if position else None
    height = _depth(world - 1)
    incoming = torch.empty_like(flat)
    for child in children:
        dist.recv(incoming, child)
        flat.add_(incoming)
    if parent is not None:
        dist.send(flat, parent)
        trace.sent(f"{label}reduce", height - _depth(position), parent, -1, flat)
    trace.snapshot(f"{label}reduce", height - _depth(position), flat)
    if parent is not None:
        dist.recv(flat, parent)
    for child in children:
        dist.send(flat, child)
        trace.sent(f"{label}broadcast", _depth(position), child, -1, flat)
    trace.snapshot(f"{label}broadcast", _depth(position), flat)


def tree_all_reduce(tensor: torch.Tensor, record_values: bool = False) -> CommTrace:
    """Sum ``tensor`` across all ranks, in place, by reduce-then-broadcast on one binary tree."""
    trace = CommTrace(dist.get_rank(), dist.get_world_size(), record_values)
    flat = tensor.flatten()
    _tree_all_reduce(flat, list(range(trace.world_size)), trace, "")
    tensor.copy_(flat.view_as(tensor))
    return trace


def mirrored_order(world_size: int) -> list[int]:
    """The second tree's layout: position i holds rank N-1-i, so the first tree's leaves are its
    interior ranks."""
    return [world_size - 1 - i for i in range(world_size)]


def double_binary_tree_all_reduce(tensor: torch.Tensor, record_values: bool = False) -> CommTrace:
    """Sum ``tensor`` across all ranks, in place: each half of the buffer over its own tree."""
    trace = CommTrace(dist.get_rank(), dist.get_world_size(), record_values)
    flat = tensor.flatten()
    first, second = flat.tensor_split(2)
    _tree_all_reduce(first, list(range(trace.world_size)), trace, "tree 1 ")
    _tree_all_reduce(second, mirrored_order(trace.world_size), trace, "tree 2 ")
    tensor.copy_(flat.view_as(tensor))
    return trace
