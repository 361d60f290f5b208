"""The launcher: real ranks, results back in rank order, and no hang ever reaches the caller."""

import time

import pytest
import torch
import torch.distributed as dist

from course_lib.collectives.launch import CollectiveTimeout, RankFailure, run_on_ranks


def sum_of_ranks(offset):
    value = torch.tensor([dist.get_rank() + offset])
    print(f"holding {value.item():g}")
    dist.all_reduce(value)
    return {"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": value}


def test_results_come_back_in_rank_order_with_prints():
    lines = []
    results = run_on_ranks(sum_of_ranks, 4, 1.0, on_print=lambda rank, line: lines.append((rank, line)))
    assert [r["rank"] for r in results] == [0, 1, 2, 3] and all(r["world"] == 4 for r in results)
    assert all(torch.equal(r["sum"], torch.tensor([10.0])) for r in results)
    assert sorted(lines) == [(r, f"holding {r + 1}") for r in range(4)]


def mismatched_calls():
    tensor = torch.ones(4)
    if dist.get_rank() == 0:
        dist.broadcast(tensor, src=0)
    else:
        dist.all_reduce(tensor)
    return tensor


def test_a_mismatch_times_out_with_the_pending_calls_named():
    started = time.monotonic()
    with pytest.raises(CollectiveTimeout) as error:
        run_on_ranks(mismatched_calls, 3, timeout_s=3)
    assert time.monotonic() - started < 15
    message = str(error.value)
    assert "rank 0: inside broadcast" in message and "rank 2: inside all_reduce" in message
    assert "same collective calls in the same order" in message


def fails_on_rank_two():
    if dist.get_rank() == 2:
        raise ValueError("rank two cannot do this")
    dist.barrier()  # the others wait for rank 2, which never arrives
    return True


def test_a_rank_that_raises_stops_the_run_with_its_traceback():
    with pytest.raises(RankFailure, match="rank 2 raised:(.|\n)*rank two cannot do this"):
        run_on_ranks(fails_on_rank_two, 3, timeout_s=20)


def test_world_size_is_checked():
    with pytest.raises(ValueError, match="between 1 and 64"):
        run_on_ranks(sum_of_ranks, 0, 1.0)


def chatty_while_the_other_waits():
    if dist.get_rank() == 0:
        while True:  # floods the caller with prints: the deadline must still be seen
            print("still here")
            time.sleep(0.005)
    dist.all_reduce(torch.ones(1))


def waits_on_an_isend():
    peer = 1 - dist.get_rank()
    dist.isend(torch.ones(8), peer).wait()  # both wait for a receive that nobody posts yet
    dist.recv(torch.ones(8), peer)


def test_timeouts_hold_for_chatty_ranks_and_name_async_waits():
    started = time.monotonic()
    with pytest.raises(CollectiveTimeout, match="rank 1: inside all_reduce"):
        run_on_ranks(chatty_while_the_other_waits, 2, timeout_s=2, on_print=lambda rank, line: None)
    assert time.monotonic() - started < 12
    with pytest.raises(CollectiveTimeout, match="its last call \\(#1\\) was isend"):
        run_on_ranks(waits_on_an_isend, 2, timeout_s=3)


def groups_made_differently():
    if dist.get_rank() == 0:
        dist.new_group([0, 1])  # the other rank makes a group of other ranks: rank 0 waits for it
    else:
        dist.new_group([1])
        time.sleep(30)
    return True


def test_a_group_made_differently_on_each_rank_times_out_inside_new_group():
    with pytest.raises(CollectiveTimeout, match="rank 0: inside new_group"):
        run_on_ranks(groups_made_differently, 2, timeout_s=3)


def subgroups_then_sum():
    group, _ = dist.new_subgroups(2)  # calls new_group inside: one traced call, not several
    value = torch.ones(1)
    dist.all_reduce(value, group=group)
    return value.item()


def test_new_subgroups_is_traced_once_and_works():
    assert run_on_ranks(subgroups_then_sum, 4, timeout_s=20) == [2.0] * 4
