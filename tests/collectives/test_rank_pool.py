"""The persistent rank pool: state kept between calls, the launcher's timeout and failure reports."""

import _thread
import os
import threading
import time

import pytest
import torch
import torch.distributed as dist

from course_lib.collectives.launch import CollectiveTimeout, RankFailure
from course_lib.collectives.rank_pool import RankPool


def make_counter(start: float) -> dict:
    return {"total": start, "rank": dist.get_rank()}


def add_and_sum(state: dict, x: float) -> float:
    state["total"] += x + state["rank"]
    t = torch.tensor([state["total"]])
    dist.all_reduce(t)
    return t.item()


def rank_one_skips(state: dict) -> str:
    if state["rank"] == 1:
        return "skipped"
    dist.all_reduce(torch.ones(1))
    return "done"


def rank_one_raises(state: dict) -> None:
    if state["rank"] == 1:
        raise ValueError("rank 1 cannot do this")
    dist.all_reduce(torch.ones(1))


def pid(state: dict) -> int:
    return os.getpid()


def test_state_persists_between_calls_and_ranks_stay_in_one_group():
    with RankPool(2, make_counter, 10.0, timeout_s=20) as pool:
        assert pool.call(add_and_sum, 1.0) == [23.0, 23.0]  # (10+1+0) + (10+1+1)
        assert pool.call(add_and_sum, 1.0) == [26.0, 26.0]  # the totals carried over: 12 + 14
        first = pool.call(pid)
        assert pool.call(pid) == first and len(set(first)) == 2  # the same two processes every call
    assert pool.closed


def test_a_hang_times_out_naming_the_pending_collective_and_stops_the_pool():
    pool = RankPool(2, make_counter, 0.0, timeout_s=3)
    pids = pool.call(pid)
    with pytest.raises(CollectiveTimeout, match=r"rank 0: inside all_reduce"):
        pool.call(rank_one_skips)
    assert pool.closed
    for rank_pid in pids:  # the ranks are gone, not left spinning
        with pytest.raises(ProcessLookupError):
            os.kill(rank_pid, 0)
    with pytest.raises(RuntimeError, match="stopped after a CollectiveTimeout while running rank_one_skips"):
        pool.call(pid)


def test_a_rank_that_raises_is_reported_first():
    pool = RankPool(2, make_counter, 0.0, timeout_s=10)
    with pytest.raises(RankFailure, match=r"rank 1 raised:(.|\n)*rank 1 cannot do this"):
        pool.call(rank_one_raises)
    assert pool.closed
    pool.close()  # idempotent


def no_weights_here() -> None:
    raise FileNotFoundError("no weights here")


def test_a_failing_setup_raises_from_the_constructor():
    with pytest.raises(RankFailure, match="FileNotFoundError: no weights here"):
        RankPool(2, no_weights_here, timeout_s=10)


def test_an_interrupt_sent_to_the_whole_process_group_leaves_idle_ranks_alive():
    # what a notebook's interrupt does: SIGINT to the kernel's process group, the ranks included
    import signal
    with RankPool(2, make_counter, 0.0, timeout_s=20) as pool:
        pids = pool.call(pid)
        for rank_pid in pids:
            os.kill(rank_pid, signal.SIGINT)
        assert pool.call(add_and_sum, 1.0) == [3.0, 3.0]


def test_what_cannot_be_sent_fails_at_once_and_the_pool_stays_usable():
    with RankPool(2, make_counter, 0.0, timeout_s=20) as pool:
        with pytest.raises(Exception, match="pickle|lambda"):
            pool.call(lambda state: 1)
        assert pool.call(add_and_sum, 1.0) == [3.0, 3.0]


def test_the_log_folder_is_gone_once_the_ranks_are_up():
    with RankPool(2, make_counter, 0.0, timeout_s=20) as pool:
        assert not os.path.exists(pool._ranks.log_dir)
        assert pool.call(add_and_sum, 0.0) == [1.0, 1.0]  # the ranks write on through their open files


ORPHAN_SCRIPT = """
import sys, time
sys.path.insert(0, {tests!r})
from course_lib.collectives.rank_pool import RankPool
from test_rank_pool import make_counter, pid
pool = RankPool(2, make_counter, 0.0, timeout_s=20)
print(*pool.call(pid), flush=True)
time.sleep(60)
"""


def test_ranks_exit_when_the_process_that_started_them_is_killed():
    import subprocess
    import sys
    import time
    script = ORPHAN_SCRIPT.format(tests=os.path.dirname(__file__))
    driver = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in driver.stdout.readline().split()]
    driver.kill()
    driver.wait()
    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [p for p in alive if _running(p)]
    assert not alive, f"ranks {alive} outlived their parent"


def _running(process_id: int) -> bool:
    try:
        with open(f"/proc/{process_id}/stat") as stat:
            return stat.read().split()[2] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def every_rank_refuses(state: dict, x: float) -> None:
    raise ValueError(f"x={x} is not allowed here")


def rank_one_raises_after_the_all_reduce(state: dict) -> None:
    dist.all_reduce(torch.ones(1))
    if state["rank"] == 1:
        raise ValueError("rank 1 failed after the all_reduce")


@pytest.mark.parametrize("fails", [every_rank_refuses, rank_one_raises_after_the_all_reduce])
def test_an_exception_every_rank_got_past_is_raised_and_the_same_ranks_serve_on(fails):
    with RankPool(2, make_counter, 0.0, timeout_s=20) as pool:
        pids = pool.call(pid)
        args = (1.0,) if fails is every_rank_refuses else ()
        with pytest.raises(RankFailure, match="not allowed here|failed after the all_reduce") as raised:
            pool.call(fails, *args)
        assert raised.value.ranks_in_step and not pool.closed
        assert pool.call(add_and_sum, 1.0) == [3.0, 3.0] and pool.call(pid) == pids


def test_a_rank_left_inside_a_collective_by_a_peer_that_raised_stops_the_pool_naming_why():
    pool = RankPool(2, make_counter, 0.0, timeout_s=20)
    with pytest.raises(RankFailure, match=r"rank 0: still running.*inside all_reduce") as raised:
        pool.call(rank_one_raises)
    assert not raised.value.ranks_in_step and pool.closed
    with pytest.raises(RuntimeError, match="after a RankFailure while running rank_one_raises "
                                           r"\(ValueError: rank 1 cannot do this\)"):
        pool.call(pid)


def slow_on_rank_one(state: dict, value: str, seconds: float) -> str:
    """Rank 0 answers at once; rank 1 after ``seconds``, then both meet in an all_reduce next call."""
    if state["rank"] == 1:
        time.sleep(seconds)
    return value


def echo_after_all_reduce(state: dict, value: str) -> str:
    dist.all_reduce(torch.ones(1))
    return value


def interrupt_main_after(seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, _thread.interrupt_main)
    timer.start()
    return timer


def test_ctrl_c_while_waiting_leaves_no_reply_for_the_next_call():
    """Rank 0's reply was read before the interrupt, rank 1's comes after it: the next call gets
    its own replies, not the interrupted call's, and neither rank is left inside a collective."""
    with RankPool(2, make_counter, 0.0, timeout_s=20) as pool:
        interrupt_main_after(0.5)
        with pytest.raises(KeyboardInterrupt):
            pool.call(slow_on_rank_one, "old", 1.5)
        assert not pool.closed
        started = time.monotonic()
        assert pool.call(echo_after_all_reduce, "new") == ["new", "new"]
        assert time.monotonic() - started < 10  # not a timeout: rank 0's early reply was kept
        assert pool.call(add_and_sum, 1.0) == [3.0, 3.0]


def test_ctrl_c_right_after_sending_and_again_while_finishing_it(monkeypatch):
    with RankPool(2, make_counter, 0.0, timeout_s=20) as pool:
        real_collect, calls = pool._ranks.collect, []

        def interrupted_twice(timeout_s):
            calls.append(timeout_s)
            if len(calls) <= 2:  # the call itself, then the next call's reading of its replies
                raise KeyboardInterrupt
            return real_collect(timeout_s)

        monkeypatch.setattr(pool._ranks, "collect", interrupted_twice)
        with pytest.raises(KeyboardInterrupt):
            pool.call(slow_on_rank_one, "old", 0.2)
        with pytest.raises(KeyboardInterrupt):
            pool.call(echo_after_all_reduce, "never sent")
        assert pool.call(echo_after_all_reduce, "new") == ["new", "new"]
        assert pool.call(add_and_sum, 1.0) == [3.0, 3.0]
