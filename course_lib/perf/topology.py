"""Flat ring vs hierarchical all-reduce on a cluster of nodes: bytes that cross nodes, and time.

A cluster is M nodes of L GPUs (N = M x L), fast links inside a node (NVLink) and slower ones
between nodes (InfiniBand), one NIC per GPU. Rank r sits on node r // L with local rank r % L,
as ``course_lib.collectives.hierarchical`` lays out its real ranks.

An all-reduce of K bytes, two ways:

  flat ring      one ring over all N ranks, r -> r + 1. Every rank sends 2(N-1)/N K, but only
                 the last rank of each node sends to another node: M ranks (and M NICs) carry
                 2(N-1)/N K across each, 2M(N-1)/N K in all; the other NICs stay idle. Each of
                 the 2(N-1) steps waits for its slowest hop, a cross-node one when M > 1:
                   time = 2(N-1) alpha_x + 2(N-1)/N K beta_x
  hierarchical   (1) reduce-scatter inside each node: each local rank ends with 1/L of its
                 node's sum, (L-1) alpha_n + (L-1)/L K beta_n; (2) all-reduce of that K/L shard
                 across the M nodes by L rings at once, one per local rank, each on its own NIC:
                 2(M-1) alpha_x + 2(M-1)/M (K/L) beta_x; (3) all-gather inside the node, as (1).
                 Every rank sends 2(M-1)/M K/L across: 2(M-1) K in all, spread over all N NICs.

So the hierarchical scheme moves about L times fewer bytes through the busiest NIC and pays
2(M-1) slow hops instead of 2(N-1). The byte counts here are exact, equal to what real ranks
count, when the element count divides by N (the ring's chunks are then equal).

Caveat, the whiteboard version: NCCL does not run one flat ring. It builds several rings
(channels) and routes them through different NICs, which spreads a flat all-reduce's
cross-node traffic over all of a node's NICs. Its multi-node trees and NVLink SHARP (in-switch
reduction on NVSwitch systems) are the production forms of the hierarchical idea.
"""

from __future__ import annotations

from dataclasses import dataclass

from course_lib.perf.comm import RING
from course_lib.perf.interconnect import INFINIBAND_NDR, NVLINK_4, Link, get_link


def _require_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number of at least 1, got {value!r}.")


@dataclass(frozen=True)
class Cluster:
    """``nodes`` x ``gpus_per_node`` GPUs; ``in_node`` joins GPUs of a node, ``across_nodes``
    joins nodes (one NIC per GPU)."""

    nodes: int
    gpus_per_node: int
    in_node: Link
    across_nodes: Link

    def __post_init__(self) -> None:
        _require_count("Cluster.nodes", self.nodes)
        _require_count("Cluster.gpus_per_node", self.gpus_per_node)
        for name in ("in_node", "across_nodes"):
            if not isinstance(getattr(self, name), Link):
                raise TypeError(f"Cluster.{name} must be a Link (e.g. get_link(...)), got {getattr(self, name)!r}.")

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    @property
    def ring_link(self) -> Link:
        """The link that paces a flat ring over every GPU: across nodes once there are several."""
        return self.across_nodes if self.nodes > 1 else self.in_node


def h100_cluster(nodes: int, gpus_per_node: int = 8) -> Cluster:
    """H100 nodes: NVLink 4 inside, InfiniBand NDR (400 Gb/s per GPU) between."""
    return Cluster(nodes, gpus_per_node, get_link(NVLINK_4), get_link(INFINIBAND_NDR))


def cluster_of(num_gpus: int, gpus_per_node: int = 8) -> Cluster:
    """The H100 cluster that holds ``num_gpus``: one (partly filled) node up to ``gpus_per_node``,
    else whole nodes, so ``num_gpus`` must then be a multiple of ``gpus_per_node``."""
    _require_count("num_gpus", num_gpus)
    _require_count("gpus_per_node", gpus_per_node)
    if num_gpus <= gpus_per_node:
        return h100_cluster(1, num_gpus)
    if num_gpus % gpus_per_node:
        raise ValueError(f"{num_gpus} GPUs do not fill whole nodes of {gpus_per_node}; "
                         f"use a multiple of {gpus_per_node}.")
    return h100_cluster(num_gpus // gpus_per_node, gpus_per_node)


@dataclass(frozen=True)
class Crossing:
    """Bytes each rank sends to another node in one all-reduce (index = global rank)."""

    per_rank: tuple[float, ...]

    @property
    def total(self) -> float:
        return sum(self.per_rank)

    @property
    def busiest_nic(self) -> float:
        """Bytes out of the busiest NIC (one NIC per GPU, so the busiest rank's sends)."""
        return max(self.per_rank)


def _require_bytes(num_bytes: float) -> None:
    if isinstance(num_bytes, bool) or not isinstance(num_bytes, (int, float)) or num_bytes < 0:
        raise ValueError(f"num_bytes must be 0 or more, got {num_bytes!r}.")


def flat_ring_crossing(cluster: Cluster, num_bytes: float) -> Crossing:
    """A flat ring over all ranks: the last rank of each node sends its 2(N-1)/N K to the next
    node (none when there is one node)."""
    _require_bytes(num_bytes)
    n, last = cluster.num_gpus, cluster.gpus_per_node - 1
    boundary = 2 * (n - 1) * num_bytes / n if cluster.nodes > 1 else 0.0
    return Crossing(tuple(boundary if rank % cluster.gpus_per_node == last else 0.0 for rank in range(n)))


def hierarchical_crossing(cluster: Cluster, num_bytes: float) -> Crossing:
    """Hierarchical: every rank's ring across the M nodes carries 2(M-1)/M of a K/L shard."""
    _require_bytes(num_bytes)
    m, lanes = cluster.nodes, cluster.gpus_per_node
    return Crossing((2 * (m - 1) * num_bytes / (m * lanes),) * cluster.num_gpus)


def flat_ring_time(cluster: Cluster, num_bytes: float) -> float:
    """Seconds for a flat ring all-reduce: every step paced by its slowest hop (across nodes
    when there are several nodes)."""
    _require_bytes(num_bytes)
    link = cluster.ring_link
    return RING.time(cluster.num_gpus, num_bytes, link.alpha_s, link.beta)


@dataclass(frozen=True)
class HierarchicalTime:
    """The three phases of a hierarchical all-reduce, in seconds; they run one after another."""

    reduce_scatter_s: float
    across_nodes_s: float
    all_gather_s: float

    @property
    def total_s(self) -> float:
        return self.reduce_scatter_s + self.across_nodes_s + self.all_gather_s


def hierarchical_time(cluster: Cluster, num_bytes: float) -> HierarchicalTime:
    """Reduce-scatter and all-gather in the node, (L-1) alpha_n + (L-1)/L K beta_n each, around
    a ring all-reduce of K/L across the M nodes."""
    _require_bytes(num_bytes)
    lanes, inside, across = cluster.gpus_per_node, cluster.in_node, cluster.across_nodes
    in_node_s = (lanes - 1) * inside.alpha_s + (lanes - 1) * num_bytes / lanes * inside.beta
    across_s = RING.time(cluster.nodes, num_bytes / lanes, across.alpha_s, across.beta)
    return HierarchicalTime(in_node_s, across_s, in_node_s)


@dataclass(frozen=True)
class AllReduceComparison:
    """Both schemes for one message on one cluster."""

    cluster: Cluster
    num_bytes: float
    flat_s: float
    hierarchical: HierarchicalTime
    flat_crossing: Crossing
    hierarchical_crossing: Crossing

    @property
    def speedup(self) -> float:
        """Flat ring time over hierarchical time."""
        return self.flat_s / self.hierarchical.total_s


def compare_all_reduce(num_bytes: float, nodes: int = 2, gpus_per_node: int = 8) -> AllReduceComparison:
    """Flat ring and hierarchical all-reduce of ``num_bytes`` on H100 nodes (NVLink 4 inside,
    InfiniBand NDR between)."""
    cluster = h100_cluster(nodes, gpus_per_node)
    return AllReduceComparison(cluster, num_bytes, flat_ring_time(cluster, num_bytes),
                               hierarchical_time(cluster, num_bytes), flat_ring_crossing(cluster, num_bytes),
                               hierarchical_crossing(cluster, num_bytes))
