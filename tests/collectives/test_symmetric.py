"""One-shot and two-shot all-reduce over symmetric buffers against gloo's ``dist.all_reduce``."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from course_lib.collectives.launch import RankFailure, run_on_ranks
from course_lib.collectives.symmetric import (SymmetricBuffers, crossovers, one_shot_all_reduce, symmetric_buffers,
                                              time_all_reduces, two_shot_all_reduce)

SIZES = (1, 7, 1000, 1 << 20)


def _compare(sizes, dtype, parent):
    """Every size, both algorithms, twice each on the same buffers: (got, expected) pairs."""
    pairs = []
    with SymmetricBuffers(max(sizes), dtype=dtype, parent=parent) as buffers:
        for repeat in range(2):
            for size in sizes:
                for all_reduce in (one_shot_all_reduce, two_shot_all_reduce):
                    generator = torch.Generator().manual_seed(1000 * dist.get_rank() + 10 * size + repeat)
                    data = torch.randn(size, dtype=dtype, generator=generator)
                    expected = data.clone()
                    dist.all_reduce(expected)
                    assert all_reduce(data, buffers) is data
                    pairs.append((data, expected))
    return pairs


@pytest.mark.parametrize("world_size, dtype", [(2, torch.float32), (3, torch.float64), (4, torch.float32)])
def test_matches_dist_all_reduce_repeatedly(world_size, dtype, tmp_path):
    results = run_on_ranks(_compare, world_size, SIZES, dtype, str(tmp_path))
    for pairs in results:
        for got, expected in pairs:
            torch.testing.assert_close(got, expected)
    for got_pairs in zip(*results):  # rank-order sums: every rank holds the same bits
        assert all(torch.equal(pair[0], got_pairs[0][0]) for pair in got_pairs)
    assert os.listdir(tmp_path) == []


def _reduce_shaped(parent):
    with SymmetricBuffers(12, parent=parent) as buffers:
        data = torch.full((3, 4), float(dist.get_rank() + 1))
        one_shot_all_reduce(data, buffers)
        two_shot_all_reduce(data[:2], buffers)
        return data


def test_shaped_tensor_and_a_smaller_view(tmp_path):
    for data in run_on_ranks(_reduce_shaped, 3, str(tmp_path)):
        torch.testing.assert_close(data, torch.tensor([[18.0] * 4, [18.0] * 4, [6.0] * 4]))


def _skip_on_rank_one(parent, algorithm):
    buffers = SymmetricBuffers(16, timeout_s=1.0, parent=parent)
    if dist.get_rank() != 1:
        algorithm(torch.ones(16), buffers)
    return buffers.directory


@pytest.mark.parametrize("algorithm", [one_shot_all_reduce, two_shot_all_reduce])
def test_missing_peer_times_out_clearly(algorithm, tmp_path):
    with pytest.raises(RankFailure) as failure:
        run_on_ranks(_skip_on_rank_one, 3, str(tmp_path), algorithm, timeout_s=30)
    message = str(failure.value)
    assert "SymmetricTimeout" in message and "waited 1 s for signal 1" in message and "rank 1 at 0" in message
    assert os.listdir(tmp_path) == []


def _wrong_tensor(parent):
    with SymmetricBuffers(4, parent=parent) as buffers:
        with pytest.raises(ValueError, match="at most 4 elements"):
            one_shot_all_reduce(torch.ones(5), buffers)
        with pytest.raises(ValueError, match="torch.float32"):
            one_shot_all_reduce(torch.ones(4, dtype=torch.float64), buffers)
    return True


def test_rejects_tensors_that_do_not_fit(tmp_path):
    assert run_on_ranks(_wrong_tensor, 2, str(tmp_path)) == [True, True]


def test_timing_rows_and_crossovers():
    rows = run_on_ranks(time_all_reduces, 2, [1024, 4096], 2, trace_calls=False)
    assert rows[0] == rows[1] and [row["bytes"] for row in rows[0]] == [1024, 4096]
    assert all(row[name] > 0 for row in rows[0] for name in ("one_shot_s", "two_shot_s", "ring_s", "gloo_s"))
    table = [{"bytes": 1, "one_shot_s": 1.0, "two_shot_s": 2.0, "gloo_s": 3.0},
             {"bytes": 2, "one_shot_s": 2.0, "two_shot_s": 1.0, "gloo_s": 3.0},
             {"bytes": 4, "one_shot_s": 4.0, "two_shot_s": 1.0, "gloo_s": 3.0}]
    assert crossovers(table) == {"two_shot_over_one_shot": 2, "one_shot_over_gloo": None, "two_shot_over_gloo": 1}
    with_ring = [{**row, "ring_s": 1.5} for row in table]
    assert crossovers(with_ring) == {"two_shot_over_one_shot": 2, "one_shot_over_gloo": None,
                                     "two_shot_over_gloo": 1, "one_shot_over_ring": None, "two_shot_over_ring": 2}


def test_the_gpu_path_is_chosen_only_under_nccl_with_cuda():
    # gloo ranks get shared-memory buffers; DeviceSymmetricBuffers needs CUDA and is checked by gpu-report
    kinds = run_on_ranks(_buffer_kind, 2)
    assert kinds == ["SymmetricBuffers", "SymmetricBuffers"]


def _buffer_kind() -> str:
    with symmetric_buffers(16, torch.float32) as buffers:
        return type(buffers).__name__
