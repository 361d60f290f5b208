"""All-reduce on a cluster of nodes: bytes that cross nodes, and alpha-beta time, four ways.

A cluster is M nodes of L GPUs (N = M x L) with R NICs per node: fast links inside a node
(NVLink) and slower ones between nodes (InfiniBand, ``across_nodes`` is one NIC). A DGX/HGX H100
node is rail-optimised, R = L = 8: one 400 Gb/s NIC per GPU. Rank r sits on node r // L with
local rank r % L, as ``course_lib.collectives.hierarchical`` lays out its real ranks; a NIC
serves L/R consecutive local ranks (NIC j of a node: local ranks [j L/R, (j+1) L/R)).

An all-reduce of K bytes (alpha_n, beta_n: NVLink; alpha_x, beta_x: one NIC):

  flat ring      the single ring: the whiteboard case, and what the course's hand-written ring
                 does on real ranks. One ring over all N ranks, r -> r + 1. Every rank sends
                 2(N-1)/N K, but only the last rank of each node sends to another node: M
                 NICs carry 2(N-1)/N K across each, 2M(N-1)/N K in all, and the other NICs
                 stay idle. Timed lock-step, the pessimistic whiteboard bound: each of the
                 2(N-1) steps waits for its slowest hop, a cross-node one when M > 1, as the
                 course's hand-written ring with its blocking exchanges does:
                   time = 2(N-1) alpha_x + 2(N-1)/N K beta_x
  NCCL rings     what NCCL runs instead: R rings (channels), each on K/R of the buffer, each
                 crossing every node boundary through its own NIC. The same bytes cross as for
                 the single ring, spread evenly over all M x R NICs. Per step each GPU sends the
                 rings' chunks over NVLink together, while each NIC carries one ring's.
                 No barrier between steps: a chunk's critical path crosses each hop with that
                 hop's own latency, 2(M-1) network hops and 2(N-M) NVLink ones, as NCCL's tuner
                 counts it (src/graph/tuning.cc: (nsteps - nInterSteps) intraLat + nInterSteps
                 interLat, nsteps = 2(N-1), nInterSteps = 2(M-1)):
                   time = 2(N-M) alpha_n + 2(M-1) alpha_x + 2(N-1)/N K max(beta_n, beta_x / R)
  hierarchical   (1) reduce-scatter inside each node: each local rank ends with 1/L of its
                 node's sum, (L-1) alpha_n + (L-1)/L K beta_n; (2) all-reduce of those shards
                 across the M nodes, one ring per local rank, the L/R shards of a NIC's GPUs
                 through that NIC: 2(M-1) alpha_x + 2(M-1)/M K/R beta_x; (3) all-gather inside
                 the node, as (1). Every rank sends 2(M-1)/M K/L across: 2(M-1) K in all.
  tree           NCCL's tree: a chain through the GPUs of each node and a double binary tree
                 over the nodes, pipelined, R of them side by side. Its first chunk climbs
                 (L-1) NVLink and floor(log2 M) network hops and comes back down (NCCL's
                 tuner: 2((N/M - 1) intraLat + log2 M interLat)). Each GPU sends 2K along the
                 chain (up, then down); each node sends V K through its R NICs, V = 2 (an
                 interior node of both trees: K/2 up and K/2 down in each; most nodes, for
                 large M), but V = 1 on M = 2, where each tree is one root and one leaf: each
                 node sends K/2 up in one tree and K/2 down in the other:
                   time = 2(L-1) alpha_n + 2 floor(log2 M) alpha_x + max(2K beta_n, V K beta_x / R)
                 NCCL uses trees only across nodes; on one node this is the NCCL rings' time.

Bytes through the busiest NIC: the single ring's is (N-1)/(M-1) x R/L times the hierarchical
scheme's ((N-1)/(M-1) with a NIC per GPU); NCCL's rings send (N-1)/((M-1) L) times the
hierarchical scheme's through every NIC (15/8 on 2 x 8). Latency: NCCL's rings and the hierarchical
scheme cross 2(M-1) network hops, the tree 2 log2 M, each plus NVLink hops: 2(N-M) for the
rings, 2(L-1) for the others; only the lock-step single ring pays 2(N-1) network alphas. An
algorithm's alpha part is its time for 0 bytes (``all_reduce_latency``). The byte counts are
exact, equal to what real ranks count, when the element count divides by N.

What the model leaves out. NCCL pipelines the phases of its hierarchical and tree
algorithms, where this model adds them up (the hierarchical total is an upper bound). It picks
the algorithm and protocol (LL, LL128, Simple) per size from measured tuning tables, so small
messages across nodes go by tree and low-latency protocols (whose per-hop latencies are not
this model's alphas), and at scale it switches to trees. It uses NVLink SHARP (NVLS, in-switch reduction on
NVSwitch systems) and SHARP in InfiniBand switches where they exist. Congestion and the PCIe
path between a GPU and its NIC, left out too, make real times longer.
"""

from __future__ import annotations

from dataclasses import dataclass

from course_lib.checks import require_count
from course_lib.perf.comm import DOUBLE_BINARY_TREE, RING
from course_lib.perf.interconnect import INFINIBAND_NDR, NVLINK_4, Link, get_link

ALL_REDUCES = ("nccl rings", "hierarchical", "tree", "flat ring")
"""The all-reduce algorithms ``all_reduce_time`` knows, NCCL's default first; "flat ring" is the
single ring (the whiteboard case)."""


@dataclass(frozen=True)
class Cluster:
    """``nodes`` x ``gpus_per_node`` GPUs; ``in_node`` joins GPUs of a node, ``across_nodes``
    is one of a node's ``nics_per_node`` NICs (None: one per GPU, rail-optimised). A NIC
    serves gpus_per_node / nics_per_node GPUs, so nics_per_node must divide gpus_per_node."""

    nodes: int
    gpus_per_node: int
    in_node: Link
    across_nodes: Link
    nics_per_node: int | None = None

    def __post_init__(self) -> None:
        require_count("Cluster.nodes", self.nodes)
        require_count("Cluster.gpus_per_node", self.gpus_per_node)
        for name in ("in_node", "across_nodes"):
            if not isinstance(getattr(self, name), Link):
                raise TypeError(f"Cluster.{name} must be a Link (e.g. get_link(...)), got {getattr(self, name)!r}.")
        if self.nics_per_node is None:
            object.__setattr__(self, "nics_per_node", self.gpus_per_node)
        require_count("Cluster.nics_per_node", self.nics_per_node)
        if self.gpus_per_node % self.nics_per_node:
            raise ValueError(f"Cluster.nics_per_node ({self.nics_per_node}) must divide gpus_per_node "
                             f"({self.gpus_per_node}): each NIC serves the same number of GPUs.")

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def gpus_per_nic(self) -> int:
        return self.gpus_per_node // self.nics_per_node

    @property
    def ring_link(self) -> Link:
        """The slowest hop of a ring over all GPUs: across nodes once there are several. It
        paces every step of the lock-step single ring (latency and bandwidth); NCCL's rings
        cross it 2(M-1) times and share its bandwidth over the NICs."""
        return self.across_nodes if self.nodes > 1 else self.in_node


def h100_cluster(nodes: int, gpus_per_node: int = 8, nics_per_node: int | None = None) -> Cluster:
    """H100 nodes: NVLink 4 inside, InfiniBand NDR NICs (400 Gb/s each) between, one per GPU
    unless ``nics_per_node`` says fewer."""
    return Cluster(nodes, gpus_per_node, get_link(NVLINK_4), get_link(INFINIBAND_NDR), nics_per_node)


def cluster_of(num_gpus: int, gpus_per_node: int = 8, nics_per_node: int | None = None) -> Cluster:
    """The H100 cluster that holds ``num_gpus``: a single node up to ``gpus_per_node`` (nothing
    crosses a NIC there, so it gets one per GPU), else whole nodes with ``nics_per_node`` NICs
    each, so ``num_gpus`` must then be a multiple of ``gpus_per_node``."""
    require_count("num_gpus", num_gpus)
    require_count("gpus_per_node", gpus_per_node)
    if num_gpus <= gpus_per_node:
        return h100_cluster(1, num_gpus)
    if num_gpus % gpus_per_node:
        raise ValueError(f"{num_gpus} GPUs do not fill whole nodes of {gpus_per_node}; "
                         f"use a multiple of {gpus_per_node}.")
    return h100_cluster(num_gpus // gpus_per_node, gpus_per_node, nics_per_node)


@dataclass(frozen=True)
class Crossing:
    """Bytes sent to another node in one all-reduce: ``per_rank[r]`` by global rank r, and
    ``per_nic[i]`` through NIC i of the cluster, which serves ranks [i g, (i+1) g) for g =
    ``gpus_per_nic``. Both sum to ``total``."""

    per_rank: tuple[float, ...]
    gpus_per_nic: int = 1

    @property
    def per_nic(self) -> tuple[float, ...]:
        g = self.gpus_per_nic
        return tuple(sum(self.per_rank[i:i + g]) for i in range(0, len(self.per_rank), g))

    @property
    def total(self) -> float:
        return sum(self.per_rank)

    @property
    def busiest_nic(self) -> float:
        """Bytes out of the busiest NIC."""
        return max(self.per_nic)


def _require_bytes(num_bytes: float) -> None:
    if isinstance(num_bytes, bool) or not isinstance(num_bytes, (int, float)) or num_bytes < 0:
        raise ValueError(f"num_bytes must be 0 or more, got {num_bytes!r}.")


def _ring_bytes(cluster: Cluster, num_bytes: float) -> float:
    """2(N-1)/N K: what each ring hop carries in all, and what a node boundary sees (0 on one node)."""
    n = cluster.num_gpus
    return 2 * (n - 1) * num_bytes / n if cluster.nodes > 1 else 0.0


def flat_ring_crossing(cluster: Cluster, num_bytes: float) -> Crossing:
    """The single ring over all ranks: the last rank of each node sends its 2(N-1)/N K to the
    next node through its NIC (none when there is one node)."""
    _require_bytes(num_bytes)
    boundary, last = _ring_bytes(cluster, num_bytes), cluster.gpus_per_node - 1
    return Crossing(tuple(boundary if rank % cluster.gpus_per_node == last else 0.0
                          for rank in range(cluster.num_gpus)), cluster.gpus_per_nic)


def nccl_ring_crossing(cluster: Cluster, num_bytes: float) -> Crossing:
    """NCCL's R rings: ring j leaves each node from the first GPU of NIC j, with 2(N-1)/N of
    its K/R. Same total as the single ring; every NIC carries 1/R of a boundary's bytes."""
    _require_bytes(num_bytes)
    share, g = _ring_bytes(cluster, num_bytes) / cluster.nics_per_node, cluster.gpus_per_nic
    return Crossing(tuple(share if rank % g == 0 else 0.0 for rank in range(cluster.num_gpus)), g)


def hierarchical_crossing(cluster: Cluster, num_bytes: float) -> Crossing:
    """Hierarchical: every rank's ring across the M nodes carries 2(M-1)/M of a K/L shard."""
    _require_bytes(num_bytes)
    m, lanes = cluster.nodes, cluster.gpus_per_node
    return Crossing((2 * (m - 1) * num_bytes / (m * lanes),) * cluster.num_gpus, cluster.gpus_per_nic)


def flat_ring_time(cluster: Cluster, num_bytes: float) -> float:
    """Seconds for the single ring, lock-step: the pessimistic whiteboard bound. Every one of
    the 2(N-1) steps is paced by its slowest hop (across nodes, one NIC, when there are several
    nodes), as in the course's hand-written ring with its blocking exchanges. Real rings have
    no barrier between steps: see ``nccl_ring_time``."""
    _require_bytes(num_bytes)
    link = cluster.ring_link
    return RING.time(cluster.num_gpus, num_bytes, link.alpha_s, link.beta)


def _rings_beta(cluster: Cluster) -> float:
    """Seconds per byte of a GPU's share of R side-by-side rings or trees: NVLink, or one NIC
    per ring where the node's R NICs together are slower."""
    if cluster.nodes == 1:
        return cluster.in_node.beta
    return max(cluster.in_node.beta, cluster.across_nodes.beta / cluster.nics_per_node)


def _ring_latency(cluster: Cluster, steps: int, network_steps: int) -> float:
    """NCCL's ring latency: ``network_steps`` of the ``steps`` cross a node boundary and pay
    alpha_x, the rest pay alpha_n (no barrier between steps: each hop its own latency)."""
    return (steps - network_steps) * cluster.in_node.alpha_s + network_steps * cluster.across_nodes.alpha_s


def nccl_ring_time(cluster: Cluster, num_bytes: float) -> float:
    """Seconds for NCCL's R rings on K/R each: 2(N-M) alpha_n + 2(M-1) alpha_x (NCCL's tuner's
    count) + 2(N-1)/N K at the slower of NVLink and R NICs. Equal to ``flat_ring_time`` on one
    node; never more than it."""
    _require_bytes(num_bytes)
    n, m = cluster.num_gpus, cluster.nodes
    return (_ring_latency(cluster, 2 * (n - 1), 2 * (m - 1))
            + RING.volume(n) * num_bytes * _rings_beta(cluster))


def nccl_ring_all_gather_time(cluster: Cluster, num_bytes: float) -> float:
    """Seconds for NCCL's rings to all-gather ``num_bytes`` in all (K/N from each rank): half
    an all-reduce, (N-M) alpha_n + (M-1) alpha_x + (N-1)/N K at the rings' speed; on one node
    (N-1) alpha_n + (N-1)/N K beta_n."""
    _require_bytes(num_bytes)
    n, m = cluster.num_gpus, cluster.nodes
    return _ring_latency(cluster, n - 1, m - 1) + (n - 1) / n * num_bytes * _rings_beta(cluster)


def tree_network_volume(nodes: int) -> float:
    """Bytes per byte all-reduced that a node sends across in NCCL's double binary tree: 1 on
    2 nodes (each tree is a root and a leaf: K/2 up in one tree, K/2 down in the other), 2
    otherwise (each tree carries K/2; a node is interior in one tree, K/2 up and K/2 down to
    each of two children, and a leaf in the other, K/2 up: 2K, exact for large M, an upper
    bound on few nodes), 0 on one node."""
    require_count("nodes", nodes)
    return 0.0 if nodes == 1 else 1.0 if nodes == 2 else 2.0


def tree_time(cluster: Cluster, num_bytes: float) -> float:
    """Seconds for NCCL's trees across nodes: 2(L-1) alpha_n + 2 floor(log2 M) alpha_x +
    max(2K beta_n, V K beta_x / R), pipelined so the slower of the in-node chain (2K over
    NVLink) and the NICs (V = ``tree_network_volume(M)``: 1 on 2 nodes, else 2) sets the pace;
    on one node NCCL's rings."""
    _require_bytes(num_bytes)
    if cluster.nodes == 1:
        return nccl_ring_time(cluster, num_bytes)
    m, inside, across = cluster.nodes, cluster.in_node, cluster.across_nodes
    chain_s = 2 * num_bytes * inside.beta
    network_s = tree_network_volume(m) * num_bytes * across.beta / cluster.nics_per_node
    return (2 * (cluster.gpus_per_node - 1) * inside.alpha_s + DOUBLE_BINARY_TREE.hops(m) * across.alpha_s
            + max(chain_s, network_s))


@dataclass(frozen=True)
class HierarchicalTime:
    """The three phases of a hierarchical all-reduce, in seconds, added up (NCCL would pipeline
    them, so ``total_s`` is an upper bound)."""

    reduce_scatter_s: float
    across_nodes_s: float
    all_gather_s: float

    @property
    def total_s(self) -> float:
        return self.reduce_scatter_s + self.across_nodes_s + self.all_gather_s


def hierarchical_time(cluster: Cluster, num_bytes: float) -> HierarchicalTime:
    """Reduce-scatter and all-gather in the node, (L-1) alpha_n + (L-1)/L K beta_n each, around
    a ring all-reduce across the M nodes that puts K/R through each NIC (L/R GPUs' shards)."""
    _require_bytes(num_bytes)
    lanes, inside, across = cluster.gpus_per_node, cluster.in_node, cluster.across_nodes
    in_node_s = (lanes - 1) * inside.alpha_s + (lanes - 1) * num_bytes / lanes * inside.beta
    across_s = RING.time(cluster.nodes, num_bytes / cluster.nics_per_node, across.alpha_s, across.beta)
    return HierarchicalTime(in_node_s, across_s, in_node_s)


def all_reduce_time(cluster: Cluster, num_bytes: float, algorithm: str = "nccl rings") -> float:
    """Seconds for one all-reduce of ``num_bytes`` by one of ``ALL_REDUCES``."""
    if algorithm == "nccl rings":
        return nccl_ring_time(cluster, num_bytes)
    if algorithm == "hierarchical":
        return hierarchical_time(cluster, num_bytes).total_s
    if algorithm == "tree":
        return tree_time(cluster, num_bytes)
    if algorithm == "flat ring":
        return flat_ring_time(cluster, num_bytes)
    raise ValueError(f"all_reduce must be one of {ALL_REDUCES}, got {algorithm!r}.")


def all_reduce_latency(cluster: Cluster, algorithm: str = "nccl rings") -> float:
    """The alpha part of ``all_reduce_time``: its time for 0 bytes (every model here is alpha
    terms plus a term proportional to the bytes)."""
    return all_reduce_time(cluster, 0, algorithm)


@dataclass(frozen=True)
class AllReduceComparison:
    """Every scheme for one message on one cluster: ``flat_s`` is the single ring,
    ``nccl_ring_s`` NCCL's R rings."""

    cluster: Cluster
    num_bytes: float
    flat_s: float
    hierarchical: HierarchicalTime
    flat_crossing: Crossing
    hierarchical_crossing: Crossing
    nccl_ring_s: float
    nccl_ring_crossing: Crossing
    tree_s: float

    @property
    def speedup(self) -> float:
        """Single ring time over hierarchical time."""
        return self.flat_s / self.hierarchical.total_s


def compare_all_reduce(num_bytes: float, nodes: int = 2, gpus_per_node: int = 8,
                       nics_per_node: int | None = None) -> AllReduceComparison:
    """The single ring, NCCL's rings, hierarchical and tree all-reduce of ``num_bytes`` on H100
    nodes (NVLink 4 inside, ``nics_per_node`` InfiniBand NDR NICs between, one per GPU unless
    given)."""
    cluster = h100_cluster(nodes, gpus_per_node, nics_per_node)
    return AllReduceComparison(cluster, num_bytes, flat_ring_time(cluster, num_bytes),
                               hierarchical_time(cluster, num_bytes), flat_ring_crossing(cluster, num_bytes),
                               hierarchical_crossing(cluster, num_bytes), nccl_ring_time(cluster, num_bytes),
                               nccl_ring_crossing(cluster, num_bytes), tree_time(cluster, num_bytes))
