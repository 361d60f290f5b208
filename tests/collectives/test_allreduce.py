"""Hand-written ring, tree and double-binary-tree all-reduce against dist.all_reduce, on real ranks."""

import pytest
import torch
import torch.distributed as dist

from course_lib.collectives.launch import run_on_ranks
from course_lib.collectives.ring import ring_all_reduce
from course_lib.collectives.tree import double_binary_tree_all_reduce, tree_all_reduce

ALGORITHMS = {"ring": ring_all_reduce, "tree": tree_all_reduce, "double tree": double_binary_tree_all_reduce}
CASES = [((1,), torch.float32), ((7,), torch.int64), ((3, 5), torch.float64), ((1000,), torch.float32),
         ((64,), torch.bfloat16)]


def compare_with_gloo():
    """Every algorithm on every case; returns (algorithm, case index, equal?, bytes sent)."""
    rank = dist.get_rank()
    out = []
    for name, algorithm in ALGORITHMS.items():
        for index, (shape, dtype) in enumerate(CASES):
            generator = torch.Generator().manual_seed(100 * rank + index)
            data = (torch.randn(shape, generator=generator) * 8).to(dtype)
            expected = data.clone()
            dist.all_reduce(expected)
            trace = algorithm(data)
            tolerance = 0.05 * dist.get_world_size() if dtype == torch.bfloat16 else 1e-5
            close = torch.allclose(data.double(), expected.double(), rtol=tolerance, atol=tolerance)
            out.append((name, index, close, trace.bytes_sent))
    return out


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5, 8])
def test_algorithms_equal_gloos_all_reduce(world_size):
    for rank, rows in enumerate(run_on_ranks(compare_with_gloo, world_size, timeout_s=60)):
        wrong = [(name, CASES[index]) for name, index, close, _ in rows if not close]
        assert not wrong, f"rank {rank} of {world_size}: {wrong} differ from dist.all_reduce"


def traced_run(name, numel):
    data = torch.full((numel,), float(dist.get_rank() + 1))
    trace = ALGORITHMS[name](data, record_values=True)
    return data, trace


def test_ring_sends_two_n_minus_one_over_n_of_the_buffer():
    numel, world = 1024, 4  # 4 KiB of float32
    for data, trace in run_on_ranks(traced_run, world, "ring", numel):
        assert torch.equal(data, torch.full((numel,), 10.0))
        assert trace.bytes_sent == 2 * (world - 1) / world * numel * 4  # 6 KiB
        assert [t.phase for t in trace.transfers] == ["scatter-reduce"] * 3 + ["all-gather"] * 3
        assert all(t.dst == (trace.rank + 1) % world for t in trace.transfers)
        # after scatter-reduce, rank r owns the complete sum of chunk r+1
        owned = (trace.rank + 1) % world
        assert trace.buffers[world - 2][2][owned * 256:(owned + 1) * 256] == [10.0] * 256


def test_trees_use_links_unevenly_and_double_trees_balance_them():
    numel, world = 1000, 4
    single = [trace.bytes_sent for _, trace in run_on_ranks(traced_run, world, "tree", numel)]
    double = [trace.bytes_sent for _, trace in run_on_ranks(traced_run, world, "double tree", numel)]
    assert single == [8000, 8000, 4000, 4000]  # root and interior rank send 2 buffers, leaves 1
    assert double == [6000] * 4  # every rank interior in one tree and a leaf in the other


def ring_in_groups():
    """Ranks 0 and 2 form one ring, 1 and 3 the other; each sums only its own members' values."""
    rank = dist.get_rank()
    groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    data = torch.full((6,), float(rank + 1))
    trace = ring_all_reduce(data, group=groups[rank % 2])
    return data, [(t.src, t.dst) for t in trace.transfers], trace.world_size


def test_ring_inside_a_group_sums_its_members_and_records_global_ranks():
    for rank, (data, hops, ring_size) in enumerate(run_on_ranks(ring_in_groups, 4)):
        assert torch.equal(data, torch.full((6,), 4.0 if rank % 2 == 0 else 6.0))
        assert ring_size == 2 and hops == [(rank, (rank + 2) % 4)] * 2
