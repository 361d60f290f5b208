"""The nccl-tests-style benchmark on real gloo ranks: checked rows, nccl-tests' sizes and factors,
progress, the JSON and the table; and the same module under a real torchrun."""

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from course_lib.collectives import bench
from course_lib.collectives.launch import default_backend, run_on_ranks
from course_lib.paths import REPO_ROOT
from course_lib.perf.bus_bandwidth import COLLECTIVES, bus_factor
from course_lib.perf.units import KiB

SMALL = dict(min_bytes=8, max_bytes=64 * KiB, warmup=2, iters=3)


@pytest.fixture(scope="module", params=[2, 4], ids=["2 ranks", "4 ranks"])
def run(request):
    steps = []
    result = bench.benchmark(request.param, on_step=steps.append, **SMALL)
    return request.param, result, steps


def test_every_row_is_checked_correct_and_every_collective_ran(run):
    world, result, _ = run
    assert result.world_size == world and result.backend == default_backend(world) and result.num_nodes == 1
    assert result.rows and all(row.correct for row in result.rows)
    assert list(dict.fromkeys(row.collective for row in result.rows)) == list(COLLECTIVES)
    assert all(row.time_us > 0 and row.dtype == "float32" for row in result.rows)


def test_busbw_is_algbw_times_the_factor(run):
    world, result, _ = run
    for row in result.rows:
        assert row.algbw == pytest.approx(row.size / (row.time_us * 1e-6) / 1e9)
        assert row.busbw == pytest.approx(row.algbw * bus_factor(row.collective, world))


def test_split_buffers_are_rounded_down_to_whole_blocks_and_tiny_ones_skipped(run):
    world, result, _ = run
    requested = bench.message_sizes(SMALL["min_bytes"], SMALL["max_bytes"])
    block = world * 4  # one float32 per rank
    for collective in COLLECTIVES:
        rows = [row for row in result.rows if row.collective == collective]
        if collective in bench.SPLIT:
            kept = [size for size in requested if size >= block]
            assert [row.size for row in rows] == [size - size % block for size in kept]
            assert all(row.count == row.size // block for row in rows)  # one rank's block, as nccl-tests prints
        else:
            assert [row.size for row in rows] == requested
            assert all(row.count == row.size // 4 for row in rows)


def test_progress_reaches_every_step_once_in_order(run):
    _, _, steps = run
    assert steps == list(range(bench.total_steps(COLLECTIVES, SMALL["min_bytes"], SMALL["max_bytes"])))


def test_the_json_round_trips(run, tmp_path):
    _, result, _ = run
    result.save(tmp_path / "deep" / "bench.json")
    assert bench.load_result(tmp_path / "deep" / "bench.json") == result


def test_the_table_has_nccl_tests_columns_and_one_block_per_collective(run):
    world, result, _ = run
    table = bench.format_table(result)
    for column in ("size(B)", "count(elements)", "type", "time(us)", "algbw(GB/s)", "busbw(GB/s)"):
        assert table.count(column) == len(COLLECTIVES)
    for collective in COLLECTIVES:
        assert f"# {collective}: {world} ranks, backend {result.backend}, float32" in table
    assert table.count("# Avg bus bandwidth") == len(COLLECTIVES)
    assert len(table.splitlines()) == 1 + len(result.rows) + 4 * len(COLLECTIVES)


def checks_before_any_call():
    """Each in-place check read before its collective ran: not yet the expected values."""
    outcome = {}
    for collective in ("all_reduce", "broadcast", "reduce"):
        call, check = bench.prepare(collective, 8, torch.float32, torch.device("cpu"))
        outcome[collective] = (check(), call(), check())[::2]
    return dist.get_rank(), outcome


def test_the_checks_fail_until_the_collective_has_run():
    for rank, outcome in run_on_ranks(checks_before_any_call, 2):
        assert outcome["all_reduce"] == (False, True)
        assert outcome["broadcast"] == (rank == 0, True)  # the root already holds the value
        assert outcome["reduce"] == (rank != 0, True)  # only the root is checked


def test_sizes_read_like_nccl_tests_arguments():
    assert [bench.parse_bytes(text) for text in ("8", "1K", "64M", "1G", "2kb", "4KiB")] == [
        8, 1024, 64 * 1024**2, 1024**3, 2048, 4096]
    with pytest.raises(ValueError, match="64M"):
        bench.parse_bytes("1.5M")
    assert bench.message_sizes(8, 100, 4) == [8, 32]
    assert bench.total_steps(("all_reduce", "reduce"), 8, 64, 2) == 8
    assert bench.buffer_elements("all_gather", 100, 4, 4) == 24 and bench.buffer_elements("all_reduce", 100, 4, 4) == 25
    assert bench.buffer_elements("all_to_all", 8, 4, 4) == 0


@pytest.mark.parametrize("settings, message", [
    (dict(dtype="int8"), "float16, bfloat16, float32, float64"), (dict(collectives=("allreduce",)), "all_to_all"),
    (dict(step_factor=1), "at least 2"), (dict(min_bytes=64, max_bytes=8), "min_bytes <= max_bytes"),
    (dict(iters=0), "iters >= 1")])
def test_bad_settings_are_refused_before_any_rank_starts(settings, message):
    with pytest.raises(ValueError, match=message):
        bench.benchmark(2, **settings)


def test_it_runs_under_a_real_torchrun(tmp_path):
    out = tmp_path / "bench.json"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    if sys.platform == "linux":
        env["GLOO_SOCKET_IFNAME"] = "lo"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "course_lib.collectives.bench", "--max-bytes", "1K", "--iters", "2", "--warmup", "1",
                           "--json", str(out)], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    result = bench.load_result(out)
    assert result.world_size == 2 and result.backend == "gloo"
    assert list(dict.fromkeys(row.collective for row in result.rows)) == list(COLLECTIVES)
    assert all(row.correct for row in result.rows)
    assert done.stdout.count("# Avg bus bandwidth") == len(COLLECTIVES)  # rank 0 alone prints the table


def test_saved_results_lists_the_gpu_runs_to_replay(monkeypatch, tmp_path):
    for name in ("nccl_bench_h200.json", "nccl_bench_a100.json", "gpu_report_h200.json"):
        (tmp_path / name).write_text("{}")
    monkeypatch.setattr(bench, "RESULTS_DIR", tmp_path)
    assert [path.name for path in bench.saved_results()] == ["nccl_bench_a100.json", "nccl_bench_h200.json"]
