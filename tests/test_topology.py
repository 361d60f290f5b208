"""Flat ring vs hierarchical all-reduce on a cluster: bytes crossing nodes and alpha-beta time."""

import pytest

from course_lib.perf.interconnect import INFINIBAND_NDR, NVLINK_4, get_link
from course_lib.perf.topology import (
    Cluster,
    cluster_of,
    compare_all_reduce,
    flat_ring_crossing,
    flat_ring_time,
    h100_cluster,
    hierarchical_crossing,
    hierarchical_time,
)
from course_lib.perf.units import GiB, MiB

NV, IB = 450e9, 50e9  # bytes per second, one direction


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


def test_one_node_crosses_nothing_and_both_schemes_cost_the_same():
    cluster = h100_cluster(1, 8)
    assert flat_ring_crossing(cluster, GiB).total == hierarchical_crossing(cluster, GiB).total == 0
    for size in (0, 4096, GiB):
        assert hierarchical_time(cluster, size).total_s == pytest.approx(flat_ring_time(cluster, size))


def test_times_on_two_h100_nodes_by_hand():
    cluster = h100_cluster(2, 8)
    assert flat_ring_time(cluster, GiB) == pytest.approx(30 * 5e-6 + 2 * 15 / 16 * GiB / IB)  # 40.4 ms
    phases = hierarchical_time(cluster, GiB)
    assert phases.reduce_scatter_s == phases.all_gather_s == pytest.approx(7 * 1e-6 + 7 / 8 * GiB / NV)
    assert phases.across_nodes_s == pytest.approx(2 * 5e-6 + GiB / 8 / IB)  # a ring of 2 on a 128 MiB shard
    assert phases.total_s == pytest.approx(6.884e-3, rel=1e-3)
    small = compare_all_reduce(MiB)
    assert small.flat_s == pytest.approx(150e-6 + 2 * 15 / 16 * MiB / IB)
    assert compare_all_reduce(GiB).speedup > 5 and small.speedup > 5


def test_larger_messages_never_take_less_time():
    cluster = h100_cluster(4, 8)
    sizes = [0, 1, 4096, MiB, 64 * MiB, GiB]
    for time in (lambda k: flat_ring_time(cluster, k), lambda k: hierarchical_time(cluster, k).total_s):
        times = [time(k) for k in sizes]
        assert times == sorted(times)


def test_cluster_of_fills_whole_nodes():
    assert cluster_of(4) == h100_cluster(1, 4)
    assert cluster_of(16) == h100_cluster(2, 8)
    assert cluster_of(16).ring_link.name == INFINIBAND_NDR and cluster_of(8).ring_link.name == NVLINK_4
    with pytest.raises(ValueError, match="multiple of 8"):
        cluster_of(12)


@pytest.mark.parametrize("args, message", [
    ((0, 8, get_link(NVLINK_4), get_link(INFINIBAND_NDR)), "nodes must be a whole number"),
    ((2, 2.5, get_link(NVLINK_4), get_link(INFINIBAND_NDR)), "gpus_per_node must be a whole number"),
    ((2, 8, "nvlink", get_link(INFINIBAND_NDR)), "in_node must be a Link"),
])
def test_bad_clusters_say_what_to_change(args, message):
    with pytest.raises((ValueError, TypeError), match=message):
        Cluster(*args)


def test_negative_bytes_are_refused():
    with pytest.raises(ValueError, match="num_bytes must be 0 or more"):
        flat_ring_crossing(h100_cluster(2, 8), -1)
