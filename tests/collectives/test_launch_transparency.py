"""The launcher's tracing leaves valid code working, and a failed run names its root cause."""

import os
import time

import pytest
import torch
import torch.distributed as dist

from course_lib.collectives.launch import CollectiveTimeout, RankFailure, _failure_message, _Outcomes, run_on_ranks


def quiet(rank, line):
    pass


def ring_exchange(sizes=None):
    """Each rank sends its rank number to the right and receives from the left, in one batch."""
    rank, world = dist.get_rank(), dist.get_world_size()
    outgoing = torch.full((4,), float(rank))
    incoming = torch.zeros(sizes[rank] if sizes else 4)
    ops = [dist.P2POp(dist.isend, outgoing, (rank + 1) % world),
           dist.P2POp(dist.irecv, incoming, (rank - 1) % world)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return incoming


@pytest.mark.parametrize("world", [2, 3])
def test_a_p2pop_ring_runs_with_tracing_on(world):
    results = run_on_ranks(ring_exchange, world, timeout_s=30, trace_calls=True, on_print=quiet)
    assert [r.tolist() for r in results] == [[float((rank - 1) % world)] * 4 for rank in range(world)]


def what_the_wrappers_look_like():
    import torch.distributed.distributed_c10d as c10d
    return {name: (getattr(dist, name) is getattr(c10d, name), getattr(dist, name).__name__,
                   bool(getattr(dist, name).__doc__), hasattr(getattr(dist, name), "__wrapped__"))
            for name in ("isend", "irecv", "all_reduce", "batch_isend_irecv")}


def test_wrappers_are_one_object_in_both_namespaces_and_keep_their_names():
    seen = run_on_ranks(what_the_wrappers_look_like, 2, timeout_s=30, on_print=quiet)[0]
    assert seen == {name: (True, name, True, True) for name in seen}


def object_collectives():
    rank = dist.get_rank()
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {"rank": rank, "word": "hi" * rank})
    broadcast = [f"from {rank}", rank] if rank == 1 else [None, None]
    dist.broadcast_object_list(broadcast, src=1)
    return gathered, broadcast


def test_object_collectives_work_with_tracing():
    results = run_on_ranks(object_collectives, 3, timeout_s=30, on_print=quiet)
    for gathered, broadcast in results:
        assert gathered == [{"rank": r, "word": "hi" * r} for r in range(3)]
        assert broadcast == ["from 1", 1]


def rank_zero_skips_the_ring():
    if dist.get_rank() == 0:
        dist.barrier()  # the others wait in work.wait() for rank 0's send, which never comes
    else:
        ring_exchange()


def test_a_stuck_batch_is_named_in_the_timeout():
    with pytest.raises(CollectiveTimeout) as error:
        run_on_ranks(rank_zero_skips_the_ring, 3, timeout_s=3, on_print=quiet)
    message = str(error.value)
    assert "rank 0: inside barrier (its communication call #1)" in message
    assert "rank 1: outside any blocking call; its last call (#1) was batch_isend_irecv" in message


def gathers_then_splits():
    dist.all_gather_object([None] * dist.get_world_size(), dist.get_rank())  # calls all_gather inside
    if dist.get_rank() == 0:
        dist.barrier()
    else:
        time.sleep(60)


def test_nested_calls_count_once_and_leave_no_stale_entry():
    with pytest.raises(CollectiveTimeout) as error:
        run_on_ranks(gathers_then_splits, 2, timeout_s=3, on_print=quiet)
    message = str(error.value)
    # all_gather_object was call #1 and was left again; its inner all_gather was not counted
    assert "rank 0: inside barrier (its communication call #2)" in message
    assert "rank 1: outside any blocking call; its last call (#1) was all_gather_object" in message


def sends_four_receives_three():
    if dist.get_rank() == 0:
        dist.send(torch.ones(4), 1)
    else:
        dist.recv(torch.zeros(3), 0)
    return True


# gloo does not raise here: it aborts the receiving rank (SIGABRT) after printing, from C++,
#   terminate called after throwing an instance of 'gloo::EnforceNotMet'
#     what():  [enforce fail at .../gloo/transport/tcp/pair.cc:456] op.preamble.length <= op.nbytes.
#     16 vs 12. Received data size doesn't match expected size. Is there a distributed collective
#     mismatch in your code?
SIZE_ERROR = "Received data size doesn't match expected size"


def test_a_size_mismatch_is_reported_with_gloos_own_words():
    lines = []
    with pytest.raises(RankFailure) as error:
        run_on_ranks(sends_four_receives_three, 2, timeout_s=20, on_print=lambda rank, line: lines.append((rank, line)))
    message = str(error.value)
    head = "\n".join(message.splitlines()[:4])
    assert message.startswith("rank 1 died with exit code -6 (SIGABRT")
    assert SIZE_ERROR in head and "16 vs 12" in head
    assert any(rank == 1 and SIZE_ERROR in line for rank, line in lines)  # native output reaches on_print too


def test_a_ring_with_one_short_buffer_leads_with_the_size_error():
    with pytest.raises(RankFailure) as error:
        run_on_ranks(ring_exchange, 4, [4, 3, 4, 4], timeout_s=20, on_print=quiet)
    message = str(error.value)
    first_lines = message.splitlines()[:4]
    assert first_lines[0].startswith("rank 1 died with exit code -6")
    assert any(SIZE_ERROR in line for line in first_lines)
    assert not any("Connection" in line for line in first_lines)
    assert "The other ranks:" in message and all(f"  rank {r}: " in message for r in (0, 2, 3))


def raises_while_the_other_waits():
    if dist.get_rank() == 0:
        raise ValueError("boom")
    dist.recv(torch.zeros(2), 0)  # gloo then fails this with "Connection closed by peer" or similar


def test_the_raising_rank_leads_not_its_waiting_peer():
    with pytest.raises(RankFailure) as error:
        run_on_ranks(raises_while_the_other_waits, 2, timeout_s=20, on_print=quiet)
    message = str(error.value)
    before_others = message.split("The other ranks:")[0]
    assert message.startswith("rank 0 raised:\nTraceback") and "ValueError: boom" in before_others
    assert "  rank 1: " in message.split("The other ranks:")[1]


def exits_hard():
    if dist.get_rank() == 1:
        os._exit(3)
    dist.recv(torch.zeros(2), 1)


def test_a_rank_that_exits_hard_is_reported_as_died():
    started = time.monotonic()
    with pytest.raises(RankFailure) as error:
        run_on_ranks(exits_hard, 2, timeout_s=20, on_print=quiet)
    assert time.monotonic() - started < 15
    message = str(error.value)
    assert message.startswith("rank 1 died with exit code 3")
    assert "  rank 0: " in message


RESET = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n    dist.recv(t, 1)\n"
         "RuntimeError: [pair.cc:537] Read error [127.0.0.1]:1234: Connection reset by peer.\n")
REAL = "Traceback (most recent call last):\n  File \"x.py\", line 2, in g\n    check()\nAssertionError: shapes differ\n"


def test_a_peer_error_that_arrives_first_does_not_lead():
    outcomes = _Outcomes(4)
    outcomes.errors = {0: (1.0, RESET), 2: (2.0, REAL), 3: (3.0, REAL.replace("differ", "also differ"))}
    outcomes.results = {1: True}
    message = _failure_message(outcomes, [[] for _ in range(4)])
    assert message.startswith("rank 2 raised:\n" + REAL.rstrip())  # the earliest of the telling ones
    assert "  rank 0: raised RuntimeError: [pair.cc:537] Read error [127.0.0.1]:1234: Connection reset by peer. " \
           "(a consequence of the failure above)" in message
    assert "  rank 1: returned" in message and "  rank 3: raised AssertionError: shapes also differ" in message


def test_a_death_outranks_the_peer_errors_it_causes():
    outcomes = _Outcomes(3)
    outcomes.errors = {0: (1.0, RESET)}
    outcomes.exits = {1: (2.0, -9)}
    outcomes.inside[2] = ["all_reduce"]
    outcomes.calls[2] = 5
    message = _failure_message(outcomes, [[], ["native line"], []])
    assert message.startswith("rank 1 died with exit code -9 (SIGKILL")
    assert "Its last native output:\n  native line" in message
    assert "  rank 2: still running when the run was stopped, inside all_reduce (its communication call #5)" \
           in message
