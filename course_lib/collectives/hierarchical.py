"""Hierarchical all-reduce on real ranks: reduce-scatter in the node, ring across nodes, all-gather.

The ranks stand for nodes of ``ranks_per_node`` GPUs: rank r is on node r // L with local rank
r % L. ``node_groups`` builds the two kinds of sub-group; ``hierarchical_all_reduce`` then

  1. reduce-scatters inside the node: local rank i ends with shard i of its node's sum
     (1/L of the buffer, zero-padded to a multiple of L elements);
  2. all-reduces that shard across the nodes with the hand-written ring over the cross-node
     group of local rank i (one ring per local rank, all running at once), so every byte that
     crosses a node boundary is a counted send;
  3. all-gathers the summed shards inside the node.

Steps 1 and 3 are library collectives on the in-node group (NVLink's job on a real node) and
are not in the trace; the trace is step 2's, with global ranks. ``crossing_bytes`` reads off it
the bytes that leave this rank's node; ``course_lib.perf.topology`` predicts the same numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from course_lib.checks import require_count
from course_lib.collectives.primitives import all_gather_flat, reduce_scatter_flat
from course_lib.collectives.ring import ring_all_reduce
from course_lib.collectives.trace import CommTrace


@dataclass(frozen=True)
class NodeGroups:
    """This rank's place in the node layout and its two process groups: ``in_node`` (the L ranks
    of its node) and ``across_nodes`` (the ranks with its local rank on every node)."""

    ranks_per_node: int
    num_nodes: int
    node: int
    local_rank: int
    in_node: dist.ProcessGroup
    across_nodes: dist.ProcessGroup


def node_groups(ranks_per_node: int) -> NodeGroups:
    """Split the world into nodes of ``ranks_per_node`` ranks and build every group.

    Every rank must call this, at the same point of its program: ``dist.new_group`` is itself a
    collective, so every rank creates every group (its own and the others'), in the same order:
    first the in-node groups, node 0 to M-1, then the cross-node groups, local rank 0 to L-1.
    """
    world = dist.get_world_size()
    require_count("ranks_per_node", ranks_per_node)
    if world % ranks_per_node:
        divisors = [d for d in range(1, world + 1) if world % d == 0]
        raise ValueError(f"The world size {world} is not a multiple of ranks_per_node={ranks_per_node}: "
                         f"launch nodes x {ranks_per_node} ranks, or pick ranks_per_node from {divisors}.")
    rank, num_nodes = dist.get_rank(), world // ranks_per_node
    node, local_rank = divmod(rank, ranks_per_node)
    in_node = [dist.new_group(list(range(n * ranks_per_node, (n + 1) * ranks_per_node))) for n in range(num_nodes)]
    across = [dist.new_group(list(range(i, world, ranks_per_node))) for i in range(ranks_per_node)]
    return NodeGroups(ranks_per_node, num_nodes, node, local_rank, in_node[node], across[local_rank])


def hierarchical_all_reduce(tensor: torch.Tensor, groups: NodeGroups, record_values: bool = False) -> CommTrace:
    """Sum ``tensor`` across all ranks, in place; return the trace of the cross-node ring (its
    buffers, when recorded, are this rank's shard)."""
    flat = tensor.reshape(-1)
    shard_numel = math.ceil(flat.numel() / groups.ranks_per_node)
    padded = flat.new_zeros(shard_numel * groups.ranks_per_node)
    padded[:flat.numel()] = flat
    shard = flat.new_empty(shard_numel)
    reduce_scatter_flat(shard, padded, group=groups.in_node)
    trace = ring_all_reduce(shard, record_values, group=groups.across_nodes)
    all_gather_flat(padded, shard, group=groups.in_node)
    tensor.copy_(padded[:flat.numel()].view_as(tensor))
    return trace


def crossing_bytes(trace: CommTrace, ranks_per_node: int) -> int:
    """Bytes of this rank's sends whose destination sits on another node."""
    return sum(t.num_bytes for t in trace.transfers if t.src // ranks_per_node != t.dst // ranks_per_node)


def compare_flat_and_hierarchical(numel: int, ranks_per_node: int, dtype_name: str = "float32",
                                  seed: int = 0) -> dict[str, float | int]:
    """One random buffer all-reduced three ways on this rank: ``dist.all_reduce`` (the reference),
    the hierarchical scheme and the flat hand-written ring over all ranks. Returns the largest
    difference from the reference for each, and this rank's bytes crossing nodes for each."""
    dtype = getattr(torch, dtype_name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"Unknown dtype {dtype_name!r}; use a torch dtype name such as 'float32' or 'int64'.")
    require_count("numel", numel)
    groups = node_groups(ranks_per_node)
    generator = torch.Generator().manual_seed(seed + dist.get_rank())
    if dtype.is_floating_point:
        data = torch.randn(numel, generator=generator).to(dtype)
    else:
        data = torch.randint(-1000, 1000, (numel,), generator=generator).to(dtype)
    expected = data.clone()
    dist.all_reduce(expected)
    hierarchical, flat = data.clone(), data.clone()
    hierarchical_trace = hierarchical_all_reduce(hierarchical, groups)
    flat_trace = ring_all_reduce(flat)
    return {"hierarchical_max_error": (hierarchical.double() - expected.double()).abs().max().item(),
            "flat_max_error": (flat.double() - expected.double()).abs().max().item(),
            "hierarchical_crossing_bytes": crossing_bytes(hierarchical_trace, ranks_per_node),
            "flat_crossing_bytes": crossing_bytes(flat_trace, ranks_per_node)}
