"""Expert parallelism on real ranks: equal to the dense layer, three all-to-alls per forward,
all-reduce is the wrong combine, and a rank that skips its forward hangs the others."""

import pytest
import torch

from course_lib.collectives import moe
from course_lib.collectives.call_log import with_calls_recorded
from course_lib.collectives.launch import CollectiveTimeout, run_on_ranks

# per world size: token counts per rank, each case with a rank that has no tokens or one token
CASES = {2: [[5, 0], [1, 9], [16, 3]], 4: [[1, 7, 0, 3], [4, 4, 4, 4], [0, 2, 1, 12]]}


def forwards_with_calls_recorded(cases):
    """Each case's error against the dense reference, and the collectives the forward made."""
    return [with_calls_recorded(moe.expert_parallel_error, tokens_per_rank) for tokens_per_rank in cases]


def assignments_per_destination(tokens_per_rank, world):
    """For each rank's tokens: how many (token, expert) rows go to each rank."""
    weights = moe.make_weights(8, 8, 16, 0)
    counts = []
    for x in moe.rank_tokens(tokens_per_rank, 8, 1):
        experts, _ = moe.route(x, weights.router)
        counts.append(torch.bincount(experts.reshape(-1) // (8 // world), minlength=world).tolist())
    return counts


@pytest.mark.parametrize("world", sorted(CASES))
def test_expert_parallel_equals_the_dense_reference_with_three_all_to_alls(world):
    # the cases include a rank whose tokens reach no expert on some rank: zero splits
    assert any(0 in row for case in CASES[world] for row in assignments_per_destination(case, world))
    results = run_on_ranks(forwards_with_calls_recorded, world, CASES[world], timeout_s=30)
    for rank_results in results:
        for error, calls in rank_results:
            assert error < 1e-5
            assert tuple(calls) == moe.FORWARD_COLLECTIVES


def test_the_router_renormalises_the_top_two_softmax_probabilities():
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(3))
    weights = moe.make_weights(8, 8, 16, 0)
    experts, gates = moe.route(x, weights.router)
    top_logits = (x @ weights.router).gather(1, experts)
    assert torch.allclose(gates, torch.softmax(top_logits, dim=-1), atol=1e-6)
    assert torch.allclose(gates.sum(dim=-1), torch.ones(6))


def test_an_all_reduce_combine_mixes_the_tokens_of_different_ranks():
    errors = run_on_ranks(moe.all_reduce_combine_error, 2, timeout_s=30)
    assert min(errors) > 0.1


def test_a_rank_that_skips_its_forward_hangs_the_others_in_all_to_all_single():
    with pytest.raises(CollectiveTimeout) as error:
        run_on_ranks(moe.data_parallel_moe_step, 2, [6, 0], False, timeout_s=3)
    message = str(error.value)
    assert "rank 0: inside all_to_all_single (its communication call #1)" in message
    assert "rank 1: inside all_reduce" in message


def test_a_dummy_forward_on_zero_tokens_completes_the_step():
    tokens_per_rank = [6, 0, 3, 0]
    losses = run_on_ranks(moe.data_parallel_moe_step, 4, tokens_per_rank, True, timeout_s=30)
    weights = moe.make_weights(8, 8, 16, 0)
    x = torch.cat(moe.rank_tokens(tokens_per_rank, 8, 1))
    expected = (moe.dense_moe_forward(weights, x) ** 2).mean().item()
    assert losses == pytest.approx([expected] * 4, rel=1e-5)


def test_experts_must_shard_evenly_over_the_ranks():
    with pytest.raises(ValueError, match="multiple of the world size"):
        moe.make_weights(8, 6, 16).shard(0, 4)
