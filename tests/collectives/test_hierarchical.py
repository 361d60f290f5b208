"""Hierarchical all-reduce on real ranks: equal to dist.all_reduce, and the bytes it sends
across nodes are the ones perf/topology.py predicts."""

import pytest
import torch
import torch.distributed as dist

from course_lib.collectives.hierarchical import (
    compare_flat_and_hierarchical,
    crossing_bytes,
    hierarchical_all_reduce,
    node_groups,
)
from course_lib.collectives.launch import RankFailure, run_on_ranks
from course_lib.perf.topology import flat_ring_crossing, h100_cluster, hierarchical_crossing

# (numel, dtype): multiples of every layout's rank count, and sizes that are not
CASES = [(1 << 20, "float32"), (4800, "float64"), (4800, "int64"), (1001, "float32"), (7, "int64"),
         (1, "float64"), (96, "bfloat16")]
TOLERANCE = {"float32": 1e-4, "float64": 1e-10, "int64": 0.0, "bfloat16": 0.25}


def every_case(ranks_per_node):
    return [compare_flat_and_hierarchical(numel, ranks_per_node, dtype, seed=index)
            for index, (numel, dtype) in enumerate(CASES)]


@pytest.fixture(scope="module", params=[(2, 2), (2, 4), (3, 2)], ids=lambda p: f"{p[0]}x{p[1]}")
def layout(request):
    nodes, per_node = request.param
    return nodes, per_node, run_on_ranks(every_case, nodes * per_node, per_node, timeout_s=60)


def test_both_equal_gloos_all_reduce(layout):
    _, _, per_rank = layout
    for rank, rows in enumerate(per_rank):
        for (numel, dtype), row in zip(CASES, rows):
            for scheme in ("hierarchical", "flat"):
                assert row[f"{scheme}_max_error"] <= TOLERANCE[dtype], (rank, numel, dtype, scheme, row)


def test_counted_crossing_bytes_equal_the_topology_model(layout):
    nodes, per_node, per_rank = layout
    cluster = h100_cluster(nodes, per_node)
    for index, (numel, dtype) in enumerate(CASES):
        num_bytes = numel * torch.empty(0, dtype=getattr(torch, dtype)).element_size()
        flat = [rows[index]["flat_crossing_bytes"] for rows in per_rank]
        hierarchical = [rows[index]["hierarchical_crossing_bytes"] for rows in per_rank]
        if numel % (nodes * per_node) == 0:  # equal chunks: exact
            assert flat == list(flat_ring_crossing(cluster, num_bytes).per_rank)
            assert hierarchical == list(hierarchical_crossing(cluster, num_bytes).per_rank)
        else:  # unequal chunks (and padding): off by at most one element per send
            slack = 2 * (nodes * per_node - 1) * num_bytes / numel
            assert flat == pytest.approx(flat_ring_crossing(cluster, num_bytes).per_rank, abs=slack)
            assert hierarchical == pytest.approx(hierarchical_crossing(cluster, num_bytes).per_rank, abs=slack)


def test_only_the_last_rank_of_each_node_crosses_in_a_flat_ring(layout):
    nodes, per_node, per_rank = layout
    crossing = [rows[0]["flat_crossing_bytes"] > 0 for rows in per_rank]
    assert crossing == [rank % per_node == per_node - 1 for rank in range(nodes * per_node)]
    busiest_flat = max(rows[0]["flat_crossing_bytes"] for rows in per_rank)
    busiest_hierarchical = max(rows[0]["hierarchical_crossing_bytes"] for rows in per_rank)
    assert busiest_flat / busiest_hierarchical == pytest.approx((nodes * per_node - 1) / (nodes - 1))


def shaped_and_recorded(ranks_per_node):
    groups = node_groups(ranks_per_node)
    data = torch.arange(15, dtype=torch.float64).reshape(3, 5).t() + dist.get_rank()  # not contiguous
    expected = data.clone()
    dist.all_reduce(expected)
    trace = hierarchical_all_reduce(data, groups, record_values=True)
    return (torch.equal(data, expected), groups.node, groups.local_rank,
            [(t.src, t.dst) for t in trace.transfers], len(trace.buffers), crossing_bytes(trace, ranks_per_node))


def test_a_shaped_tensor_in_place_and_the_ring_across_nodes_uses_global_ranks():
    for rank, (equal, node, local, hops, buffers, crossed) in enumerate(run_on_ranks(shaped_and_recorded, 6, 2)):
        assert equal and (node, local) == divmod(rank, 2)
        assert set(hops) == {(rank, (rank + 2) % 6)}  # the next node's rank with the same local rank
        assert buffers == len(hops) == 4  # 2(M-1) steps across 3 nodes
        assert crossed > 0


def test_a_world_that_is_not_whole_nodes_says_what_to_change():
    with pytest.raises(RankFailure, match=r"world size 6 is not a multiple of ranks_per_node=4.*\[1, 2, 3, 6\]"):
        run_on_ranks(node_groups, 6, 4, timeout_s=30)
