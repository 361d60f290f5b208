"""The single ring, NCCL's rings, hierarchical and tree all-reduce on a cluster: bytes crossing
nodes (per rank and per NIC) and alpha-beta time."""

import pytest

from course_lib.perf.interconnect import INFINIBAND_HDR, INFINIBAND_NDR, NVLINK_4, Link, get_link
from course_lib.perf.topology import (
    ALL_REDUCES,
    Cluster,
    all_reduce_latency,
    all_reduce_time,
    cluster_of,
    compare_all_reduce,
    flat_ring_crossing,
    flat_ring_time,
    h100_cluster,
    hierarchical_crossing,
    hierarchical_time,
    nccl_ring_all_gather_time,
    nccl_ring_crossing,
    nccl_ring_time,
    tree_network_volume,
    tree_time,
)
from course_lib.perf.units import GiB, MiB

NV, IB = 450e9, 50e9  # bytes per second, one direction
RINGS_2X8 = 28 * 1e-6 + 2 * 5e-6  # NCCL's count on 2 x 8: 2(N-M) = 28 NVLink hops, 2(M-1) = 2 InfiniBand


def test_a_flat_ring_crosses_only_at_each_nodes_last_rank():
    crossing = flat_ring_crossing(h100_cluster(2, 4), 4 * MiB)  # 1M float32
    assert crossing.per_rank == (0, 0, 0, 7 * MiB, 0, 0, 0, 7 * MiB)  # 2 x 7/8 x 4 MiB
    assert crossing.total == 14 * MiB and crossing.busiest_nic == 7 * MiB


def test_hierarchical_spreads_fewer_bytes_over_every_nic():
    crossing = hierarchical_crossing(h100_cluster(2, 4), 4 * MiB)
    assert crossing.per_rank == (1 * MiB,) * 8  # 2 x 1/2 of a 1 MiB shard
    assert crossing.total == 8 * MiB  # 2(M-1) K
    two_by_two = hierarchical_crossing(h100_cluster(2, 2), 4 * MiB)
    assert two_by_two.per_rank == (2 * MiB,) * 4
    assert flat_ring_crossing(h100_cluster(2, 2), 4 * MiB).busiest_nic == 6 * MiB


@pytest.mark.parametrize("nodes, per_node", [(2, 2), (2, 8), (3, 2), (4, 8), (64, 8)])
def test_the_busiest_nic_carries_n_minus_1_over_m_minus_1_times_less(nodes, per_node):
    cluster = h100_cluster(nodes, per_node)
    flat, hierarchical = flat_ring_crossing(cluster, GiB), hierarchical_crossing(cluster, GiB)
    assert flat.busiest_nic / hierarchical.busiest_nic == pytest.approx((nodes * per_node - 1) / (nodes - 1))
    assert hierarchical.total < flat.total


def test_one_node_crosses_nothing_and_every_scheme_costs_the_same():
    cluster = h100_cluster(1, 8)
    assert flat_ring_crossing(cluster, GiB).total == hierarchical_crossing(cluster, GiB).total == 0
    assert nccl_ring_crossing(cluster, GiB).total == 0
    for size in (0, 4096, GiB):
        for algorithm in ALL_REDUCES:
            assert all_reduce_time(cluster, size, algorithm) == pytest.approx(flat_ring_time(cluster, size))


def test_nccl_rings_cross_as_much_as_the_single_ring_spread_over_every_nic():
    cluster = h100_cluster(2, 4)
    rings, single = nccl_ring_crossing(cluster, 4 * MiB), flat_ring_crossing(cluster, 4 * MiB)
    assert rings.per_rank == (7 * MiB / 4,) * 8 and rings.total == single.total == 14 * MiB
    assert single.per_nic == single.per_rank and single.busiest_nic == 4 * rings.busiest_nic
    two_nics = h100_cluster(2, 4, nics_per_node=2)  # NIC j of a node serves local ranks 2j, 2j + 1
    rings = nccl_ring_crossing(two_nics, 4 * MiB)
    assert rings.per_rank == (7 * MiB / 2, 0) * 4 and rings.per_nic == (7 * MiB / 2,) * 4
    assert flat_ring_crossing(two_nics, 4 * MiB).per_nic == (0, 7 * MiB) * 2
    assert hierarchical_crossing(two_nics, 4 * MiB).per_nic == (2 * MiB,) * 4  # two shards per NIC


@pytest.mark.parametrize("nodes, per_node", [(2, 8), (4, 8), (64, 8), (3, 2)])
def test_nccl_rings_put_n_minus_1_over_m_minus_1_times_l_more_bytes_per_nic_than_hierarchical(nodes, per_node):
    cluster = h100_cluster(nodes, per_node)
    rings, hierarchical = nccl_ring_crossing(cluster, GiB), hierarchical_crossing(cluster, GiB)
    n = nodes * per_node
    assert rings.busiest_nic / hierarchical.busiest_nic == pytest.approx((n - 1) / ((nodes - 1) * per_node))
    assert set(rings.per_nic) == {rings.busiest_nic}  # even over every NIC


def test_nccl_rings_by_hand():
    cluster = h100_cluster(2, 8)  # 8 NICs per node: 400 GB/s, a little below NVLink's 450
    assert nccl_ring_time(cluster, GiB) == pytest.approx(RINGS_2X8 + 2 * 15 / 16 * GiB / (8 * IB))  # 5.07 ms
    assert nccl_ring_time(cluster, 0) == all_reduce_latency(cluster) == pytest.approx(38e-6)
    one_nic = h100_cluster(2, 8, nics_per_node=1)  # one ring's bandwidth again, but not its lock-step latency
    assert nccl_ring_time(one_nic, GiB) - RINGS_2X8 == pytest.approx(flat_ring_time(cluster, GiB) - 30 * 5e-6)
    fast_nics = Cluster(2, 8, get_link(NVLINK_4), Link("800 Gb/s NIC", 5e-6, 100e9))  # 8 x 100 GB/s > NVLink
    assert nccl_ring_time(fast_nics, GiB) == pytest.approx(RINGS_2X8 + 2 * 15 / 16 * GiB / NV)
    two_nics = h100_cluster(2, 8, nics_per_node=2)
    assert nccl_ring_time(two_nics, MiB) == pytest.approx(RINGS_2X8 + 2 * 15 / 16 * MiB / (2 * IB))
    many = h100_cluster(64, 8)  # 2 x 448 NVLink hops, 2 x 63 InfiniBand ones
    assert all_reduce_latency(many) == pytest.approx(896 * 1e-6 + 126 * 5e-6)
    assert all_reduce_latency(many, "flat ring") == pytest.approx(1022 * 5e-6)  # lock-step: every step a NIC's


@pytest.mark.parametrize("nodes, nics", [(1, 8), (2, 8), (2, 1), (4, 2), (64, 8)])
def test_nccl_rings_never_take_longer_than_the_lock_step_ring(nodes, nics):
    cluster = h100_cluster(nodes, 8, nics)
    for size in (0, MiB, GiB):
        assert nccl_ring_time(cluster, size) <= flat_ring_time(cluster, size) * (1 + 1e-12)


def test_nccl_all_gather_is_half_the_rings():
    node, two = h100_cluster(1, 8), h100_cluster(2, 8)
    assert nccl_ring_all_gather_time(node, MiB) == pytest.approx(7 * 1e-6 + 7 / 8 * MiB / NV)
    assert nccl_ring_all_gather_time(two, MiB) == pytest.approx(14 * 1e-6 + 5e-6 + 15 / 16 * MiB / (8 * IB))
    assert 2 * nccl_ring_all_gather_time(two, GiB) == pytest.approx(nccl_ring_time(two, GiB))


def test_hierarchical_puts_l_over_r_shards_through_each_nic():
    for nics in (8, 4, 1):
        phases = hierarchical_time(h100_cluster(2, 8, nics), GiB)
        assert phases.across_nodes_s == pytest.approx(2 * 5e-6 + GiB / nics / IB)
        assert phases.reduce_scatter_s == phases.all_gather_s == pytest.approx(7 * 1e-6 + 7 / 8 * GiB / NV)


def test_tree_by_hand():
    cluster = h100_cluster(64, 8)  # 2 x 7 NVLink hops along the chain, 2 x 6 levels of the tree over 64 nodes
    assert tree_time(cluster, 25 * MiB) == pytest.approx(14 * 1e-6 + 12 * 5e-6 + 2 * 25 * MiB / (8 * IB))
    assert tree_time(h100_cluster(3, 8, 1), MiB) == pytest.approx(14 * 1e-6 + 2 * 5e-6 + 2 * MiB / IB)
    assert tree_time(cluster, 0) < nccl_ring_time(cluster, 0) / 20  # 74 us against 1.53 ms
    assert tree_time(cluster, 0) < flat_ring_time(cluster, 0) / 50  # against the lock-step 2 x 511 NIC hops
    # two nodes: each tree a root and a leaf, so each node sends K (not 2K) through its NICs
    assert tree_time(h100_cluster(2, 8, 1), GiB) == pytest.approx(14 * 1e-6 + 2 * 5e-6 + GiB / IB)
    # with 8 NICs the K through them (400 GB/s) is faster than the chain's 2K over NVLink
    assert tree_time(h100_cluster(2, 8), GiB) == pytest.approx(14 * 1e-6 + 2 * 5e-6 + 2 * GiB / NV)
    assert tree_time(h100_cluster(4, 8, 1), GiB) == pytest.approx(14 * 1e-6 + 4 * 5e-6 + 2 * GiB / IB)


def test_the_double_binary_tree_sends_k_per_node_on_two_nodes_and_2k_beyond():
    assert [tree_network_volume(m) for m in (1, 2, 3, 4, 64)] == [0, 1, 2, 2, 2]


def test_the_nccl_tests_run_on_200_gbps_nics_lies_between_the_models():
    # nccl-tests, 2 nodes x 8 H100 with 8 x 200 Gb/s NICs: all_reduce of 1 GiB in 6.76 ms
    cluster = Cluster(2, 8, get_link(NVLINK_4), get_link(INFINIBAND_HDR))
    phases = hierarchical_time(cluster, GiB)
    pipelined = max(phases.reduce_scatter_s, phases.across_nodes_s, phases.all_gather_s)
    assert pipelined < 6.76e-3 < phases.total_s < nccl_ring_time(cluster, GiB)
    # the tree's K through 8 x 25 GB/s: 24 us + 5.37 ms, below the measurement; rings 10.1 ms, above
    assert tree_time(cluster, GiB) == pytest.approx(14 * 1e-6 + 2 * 5e-6 + GiB / (8 * 25e9))
    assert tree_time(cluster, GiB) < 6.76e-3 < nccl_ring_time(cluster, GiB) == pytest.approx(10.10e-3, rel=1e-3)
    assert flat_ring_time(cluster, GiB) > 10 * 6.76e-3  # one ring through one NIC: far too slow


def test_times_on_two_h100_nodes_by_hand():
    cluster = h100_cluster(2, 8)
    assert flat_ring_time(cluster, GiB) == pytest.approx(30 * 5e-6 + 2 * 15 / 16 * GiB / IB)  # 40.4 ms
    phases = hierarchical_time(cluster, GiB)
    assert phases.reduce_scatter_s == phases.all_gather_s == pytest.approx(7 * 1e-6 + 7 / 8 * GiB / NV)
    assert phases.across_nodes_s == pytest.approx(2 * 5e-6 + GiB / 8 / IB)  # a ring of 2 on a 128 MiB shard
    assert phases.total_s == pytest.approx(6.884e-3, rel=1e-3)
    small, large = compare_all_reduce(MiB), compare_all_reduce(GiB)
    assert small.flat_s == pytest.approx(150e-6 + 2 * 15 / 16 * MiB / IB)
    assert large.speedup > 5 and small.speedup > 5  # against the single ring
    # against NCCL's rings (38 us of latency: 28 NVLink hops and 2 InfiniBand ones) the hierarchical
    # scheme (24 us: 14 and 2) wins small messages only
    assert small.nccl_ring_s == pytest.approx(RINGS_2X8 + 2 * 15 / 16 * MiB / (8 * IB))
    assert small.nccl_ring_s > 1.3 * small.hierarchical.total_s and large.nccl_ring_s < large.hierarchical.total_s
    assert large.nccl_ring_s == nccl_ring_time(large.cluster, GiB) and large.tree_s == tree_time(large.cluster, GiB)
    assert large.nccl_ring_crossing == nccl_ring_crossing(large.cluster, GiB)
    one_nic = compare_all_reduce(GiB, nics_per_node=1)
    # one NIC: one ring's bandwidth again; the latency is still NCCL's count, not lock-step
    assert one_nic.nccl_ring_s - RINGS_2X8 == pytest.approx(one_nic.flat_s - 30 * 5e-6)
    assert one_nic.hierarchical.across_nodes_s == pytest.approx(2 * 5e-6 + GiB / IB)


def test_larger_messages_never_take_less_time():
    cluster = h100_cluster(4, 8)
    sizes = [0, 1, 4096, MiB, 64 * MiB, GiB]
    for algorithm in ALL_REDUCES:
        times = [all_reduce_time(cluster, k, algorithm) for k in sizes]
        assert times == sorted(times)


def test_cluster_of_fills_whole_nodes():
    assert cluster_of(4) == h100_cluster(1, 4)
    assert cluster_of(16) == h100_cluster(2, 8)
    assert cluster_of(16).ring_link.name == INFINIBAND_NDR and cluster_of(8).ring_link.name == NVLINK_4
    assert cluster_of(16, nics_per_node=2) == h100_cluster(2, 8, 2) and cluster_of(16).nics_per_node == 8
    assert cluster_of(4, nics_per_node=1).nics_per_node == 4  # one node: nothing crosses a NIC
    with pytest.raises(ValueError, match="multiple of 8"):
        cluster_of(12)


@pytest.mark.parametrize("args, message", [
    ((0, 8, get_link(NVLINK_4), get_link(INFINIBAND_NDR)), "nodes must be a whole number"),
    ((2, 2.5, get_link(NVLINK_4), get_link(INFINIBAND_NDR)), "gpus_per_node must be a whole number"),
    ((2, 8, "nvlink", get_link(INFINIBAND_NDR)), "in_node must be a Link"),
    ((2, 8, get_link(NVLINK_4), get_link(INFINIBAND_NDR), 0), "nics_per_node must be a whole number"),
    ((2, 8, get_link(NVLINK_4), get_link(INFINIBAND_NDR), True), "nics_per_node must be a whole number"),
    ((2, 8, get_link(NVLINK_4), get_link(INFINIBAND_NDR), 3), r"nics_per_node \(3\) must divide gpus_per_node"),
])
def test_bad_clusters_say_what_to_change(args, message):
    with pytest.raises((ValueError, TypeError), match=message):
        Cluster(*args)


def test_negative_bytes_and_unknown_algorithms_are_refused():
    for call in (flat_ring_crossing, nccl_ring_crossing, nccl_ring_time, nccl_ring_all_gather_time, tree_time):
        with pytest.raises(ValueError, match="num_bytes must be 0 or more"):
            call(h100_cluster(2, 8), -1)
    with pytest.raises(ValueError, match="all_reduce must be one of"):
        all_reduce_time(h100_cluster(2, 8), MiB, "ring")
