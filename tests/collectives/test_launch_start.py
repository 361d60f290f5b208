"""Starting ranks: launches that neither fail nor stall, a barrier before the caller's code, and a
retry only for a connection lost while joining, never once the caller's code may have run."""

import glob
import logging
import os
import tempfile
import time

import pytest
import torch
import torch.distributed as dist

from course_lib.collectives.launch import RankFailure, run_on_ranks
from course_lib.collectives.launch_benchmark import launch_many
from course_lib.collectives.rank_pool import RankPool

LAUNCH_LOG = "course_lib.collectives.launch"
STALL_LINE_S = 3.5  # a launch that waited longer stalled: the stall this test hunts sleeps 5 s


def test_eight_rank_launches_neither_fail_nor_stall():
    # With a TCPStore, 30 of 180 8-rank launches stalled by 5 s here (a reverse DNS lookup timing
    # out) and 4 failed; 20 launches catch a stall at that rate with probability > 95 %.
    # "wait" is wall time beyond the launch's own CPU time spread over the cores, so a busy machine
    # that slows every rank does not count; a rank sleeping on a timeout does. A stall sleeps 5 s; the
    # suite's other worker, busy on one of the 2 cores, stretched a healthy launch's wait to 2.3 s in
    # one CI run, so the line sits between the two.
    launches = launch_many([8], repeats=20)
    assert [launch.error for launch in launches if launch.error] == []
    assert max(launch.wait_s for launch in launches) < STALL_LINE_S, [round(launch.wall_s, 2) for launch in launches]


def fail_once_while_joining(monkeypatch, marker_dir, failing_rank: int, error: Exception) -> str:
    """Make ``failing_rank``'s first ``init_process_group`` raise ``error``; every call is logged to
    the file whose path is returned (ranks inherit the patch by fork)."""
    original, calls = dist.init_process_group, os.path.join(marker_dir, "init_calls")

    def init(*args, rank, **kwargs):
        with open(calls, "a") as log:
            log.write(f"{rank}\n")
        marker = os.path.join(marker_dir, f"rank{rank}_tried")
        if rank == failing_rank and not os.path.exists(marker):
            open(marker, "w").close()
            raise error
        return original(*args, rank=rank, **kwargs)

    monkeypatch.setattr(dist, "init_process_group", init)
    return calls


def record_run(runs_file: str, fail_on_rank: int | None = None) -> int:
    with open(runs_file, "a") as runs:
        runs.write(f"{dist.get_rank()}\n")
    if dist.get_rank() == fail_on_rank:
        raise RuntimeError("Connection reset by peer (raised by the caller's code)")
    return dist.get_rank()


def lines(path: str) -> list[str]:
    with open(path) as file:
        return sorted(file.read().split())


def test_a_connection_lost_while_joining_is_retried_once_and_logged(monkeypatch, tmp_path, caplog):
    calls = fail_once_while_joining(monkeypatch, tmp_path, 1, RuntimeError("Gloo connectFullMesh failed with "
                                                                           "Connection closed by peer (simulated)"))
    runs = str(tmp_path / "runs")
    with caplog.at_level(logging.WARNING, logger=LAUNCH_LOG):
        assert run_on_ranks(record_run, 2, runs, timeout_s=20) == [0, 1]
    assert lines(runs) == ["0", "1"]  # the caller's function ran once per rank
    assert lines(calls) == ["0", "0", "1", "1"]  # two launches
    [warning] = [record.getMessage() for record in caplog.records if record.name == LAUNCH_LOG]
    assert "lost a connection while joining" in warning and "before running record_run" in warning
    assert "Connection closed by peer (simulated)" in warning and "launch 2 of at most 3" in warning


def test_a_failure_once_the_callers_code_ran_is_never_retried(tmp_path, caplog):
    runs = str(tmp_path / "runs")
    with caplog.at_level(logging.WARNING, logger=LAUNCH_LOG), pytest.raises(RankFailure, match="raised by the caller"):
        run_on_ranks(record_run, 2, runs, 1, timeout_s=20, on_print=lambda rank, line: None)
    assert lines(runs) == ["0", "1"]
    assert not [record for record in caplog.records if record.name == LAUNCH_LOG]


def test_a_join_error_that_is_not_the_network_is_raised_at_once(monkeypatch, tmp_path):
    calls = fail_once_while_joining(monkeypatch, tmp_path, 0, ValueError("no backend named 'glooo'"))
    with pytest.raises(RankFailure, match="rank 0 raised:(.|\n)*no backend named 'glooo'"):
        run_on_ranks(record_run, 2, str(tmp_path / "runs"), timeout_s=20, on_print=lambda rank, line: None)
    assert lines(calls) == ["0", "1"]  # one launch
    assert not os.path.exists(tmp_path / "runs")


def started_at() -> float:
    return time.time()


def test_no_rank_runs_the_function_before_every_rank_has_joined(monkeypatch, tmp_path):
    original, joined_file = dist.init_process_group, str(tmp_path / "rank2_joined")

    def slow_on_rank_two(*args, rank, **kwargs):
        original(*args, rank=rank, **kwargs)
        if rank == 2:
            time.sleep(1.0)
            with open(joined_file, "w") as file:
                file.write(repr(time.time()))

    monkeypatch.setattr(dist, "init_process_group", slow_on_rank_two)
    starts = run_on_ranks(started_at, 3, timeout_s=20)
    with open(joined_file) as file:
        rank_two_joined = float(file.read())
    assert min(starts) >= rank_two_joined


def make_state() -> dict:
    return {"rank": dist.get_rank()}


def sum_in_a_new_group(state: dict) -> float:
    group = dist.new_group([0, 1])  # goes through the store, after the log folder is gone
    value = torch.ones(1)
    dist.all_reduce(value, group=group)
    return value.item()


def test_the_pool_shares_the_retry_and_its_store_outlives_the_log_folder(monkeypatch, tmp_path, caplog):
    fail_once_while_joining(monkeypatch, tmp_path, 0, RuntimeError("Connection refused (simulated)"))
    with caplog.at_level(logging.WARNING, logger=LAUNCH_LOG), RankPool(2, make_state, timeout_s=20) as pool:
        assert [record.name for record in caplog.records].count(LAUNCH_LOG) == 1
        assert not os.path.exists(pool._ranks.log_dir)
        assert pool.call(sum_in_a_new_group) == [2.0, 2.0]
        if os.path.isdir("/proc/self/fd"):  # Linux: the store file has no name, so nothing outlives a killed kernel
            assert glob.glob(os.path.join(tempfile.gettempdir(), "rank_pool_store_*")) == []
