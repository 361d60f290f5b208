"""Tensor-parallel MLP and attention (Megatron's f and g) against the unsharded layers, on real ranks."""

import pytest
import torch
import torch.distributed as dist

from course_lib.collectives.launch import run_on_ranks
from course_lib.collectives.tensor_parallel import (Attention, MLP, TensorParallelAttention, TensorParallelMLP,
                                                    mlp_check, tensor_parallel_report, wrong_order_mlp)

TOLERANCE = 1e-12  # float64 throughout


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"tp{n}")
def reports(request):
    return request.param, run_on_ranks(tensor_parallel_report, request.param, timeout_s=60)


@pytest.mark.parametrize("block", ["mlp", "attention"])
def test_block_equals_the_unsharded_layer_forward_and_backward(reports, block):
    world, per_rank = reports
    for rank, report in enumerate(per_rank):
        result = report[block]
        assert result["forward"] < TOLERANCE, (world, rank)
        assert result["input_grad"] < TOLERANCE, (world, rank)
        names = {"mlp": ["up", "down"], "attention": ["q", "k", "v", "out"]}[block]
        assert sorted(result["weight_grads"]) == sorted(f"{n}.{p}" for n in names for p in ("weight", "bias"))
        assert max(result["weight_grads"].values()) < TOLERANCE, (world, rank, result["weight_grads"])


@pytest.mark.parametrize("block", ["mlp", "attention"])
def test_exactly_one_all_reduce_forward_and_one_backward_per_block(reports, block):
    _, per_rank = reports
    for report in per_rank:
        assert report[block]["forward_calls"] == ["all_reduce"]  # g after the row-parallel layer
        assert report[block]["backward_calls"] == ["all_reduce"]  # f's, on the block's input


def test_wrong_order_mlp_needs_two_forward_collectives_and_the_middle_one_matters(reports):
    _, per_rank = reports
    for report in per_rank:
        gelu, identity = report["wrong_order"]["gelu"], report["wrong_order"]["identity"]
        assert gelu["forward_calls"] == ["all_reduce", "all_gather"]
        assert gelu["error"] < TOLERANCE
        assert gelu["error_without_middle"] > 1e-2  # GELU of partial sums is not the sum's GELU
        assert identity["error_without_middle"] < TOLERANCE  # a linear activation commutes with the sum


def count_real_all_reduces():
    """mlp_check with dist.all_reduce itself counted, forward and backward together."""
    calls = []
    original = dist.all_reduce

    def counting(*args, **kwargs):
        calls.append("all_reduce")
        return original(*args, **kwargs)

    dist.all_reduce = counting
    try:
        result = mlp_check()
    finally:
        dist.all_reduce = original
    return len(calls), result["forward_calls"] + result["backward_calls"]


def test_comm_count_matches_the_real_calls():
    for real, recorded in run_on_ranks(count_real_all_reduces, 2):
        assert real == len(recorded) == 2


def test_a_rank_holds_only_its_shard():
    full = MLP(8, 16)
    parallel = TensorParallelMLP(full, rank=1, world_size=4)
    assert parallel.up.weight.shape == (4, 8) and parallel.down.weight.shape == (8, 4)
    assert torch.equal(parallel.up.weight, full.up.weight[4:8])
    assert torch.equal(parallel.down.weight, full.down.weight[:, 4:8])
    assert torch.equal(parallel.down.bias, full.down.bias)  # the row-parallel bias is whole, added after the sum
    attention = TensorParallelAttention(Attention(16, 8), rank=3, world_size=4)
    assert sum(p.numel() for p in attention.parameters()) == 4 * (16 * 16 // 4) + 3 * 4 + 16


def test_heads_or_features_that_do_not_divide_say_what_to_change():
    with pytest.raises(ValueError, match=r"heads = 6 does not divide by the tensor-parallel size 4.*e\.g\. 8"):
        TensorParallelAttention(Attention(12, 6), rank=0, world_size=4)
    with pytest.raises(ValueError, match=r"MLP hidden size = 10 does not divide by the tensor-parallel size 4.*"
                                         r"1, 2, 5, 10"):
        TensorParallelMLP(MLP(8, 10), rank=0, world_size=4)
    with pytest.raises(ValueError, match=r"features = 6 does not divide by the tensor-parallel size 4"):
        wrong_order_mlp(torch.zeros(2, 6), MLP(6, 8), rank=0, world_size=4)
    with pytest.raises(ValueError, match=r"rank must be in 0\.\.1"):
        TensorParallelMLP(MLP(8, 16), rank=2, world_size=2)
