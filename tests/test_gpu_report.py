"""``./course gpu-report``: refuses cleanly without CUDA; the report keeps going past a failed part and
writes the documented JSON. The GPU parts are stubbed or shrunk to what a CPU can run."""

import json
import os
import subprocess
import sys
import time

import pytest
import torch

from course_lib import gpu_report
from course_lib.gpu_report import Part
from course_lib.paths import REPO_ROOT
from course_lib.perf.bus_bandwidth import COLLECTIVES

NO_CUDA = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # a GPU box looks like this machine


def launcher_is_set_up() -> bool:
    """``./course`` installs packages first unless its stamp is newer than pyproject.toml."""
    stamp = os.path.join(sys.prefix, ".course-installed")
    return os.path.exists(stamp) and os.path.getmtime(stamp) >= os.path.getmtime(REPO_ROOT / "pyproject.toml")


@pytest.mark.parametrize("command", [
    pytest.param(["./course", "gpu-report"], id="launcher"),
    pytest.param([sys.executable, "-m", "course_lib.gpu_report"], id="module"),
])
def test_without_cuda_it_says_what_to_run_instead_and_exits_2(command):
    if command[0] == "./course" and not launcher_is_set_up():
        pytest.skip("./course would install the environment first")
    done = subprocess.run(command, cwd=REPO_ROOT, env={**NO_CUDA, "COURSE_VENV": sys.prefix}, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    assert done.stdout == "" and done.stderr.strip() == gpu_report.NO_GPU
    assert "needs a CUDA GPU" in gpu_report.NO_GPU and "./course test" in gpu_report.NO_GPU


def test_a_failing_part_is_recorded_and_the_others_still_run():
    ran, lines = [], []

    def part(name, passed=True, raises=False):
        def run():
            ran.append(name)
            if raises:
                raise RuntimeError(f"{name} broke")
            return passed, {"value": name}
        return run

    parts = [Part("first", part("first", raises=True)), Part("second", part("second", passed=False)),
             Part("pair", part("pair"), min_gpus=2), Part("last", part("last"))]
    entries = gpu_report.run_parts(parts, gpu_count=1, log=lines.append)
    assert ran == ["first", "second", "last"]
    assert list(entries) == ["first", "second", "pair", "last"]
    assert entries["first"]["status"] == "failed" and "RuntimeError: first broke" in entries["first"]["error"]
    assert entries["second"] == {"status": "failed", "duration_s": entries["second"]["duration_s"],
                                 "result": {"value": "second"}}
    assert entries["pair"]["status"] == "skipped" and entries["pair"]["reason"] == "needs 2 GPUs; this machine has 1"
    assert entries["last"]["status"] == "passed" and entries["last"]["result"] == {"value": "last"}
    assert all(isinstance(entry["duration_s"], float) for entry in entries.values())
    assert lines[0] == "[1/4] first: running" and "[3/4] pair: skipped" in lines[4] and lines[-1].startswith(
        "[4/4] last: passed in")


def test_a_part_records_its_own_duration():
    entries = gpu_report.run_parts([Part("slow", lambda: (time.sleep(0.2), (True, {}))[1])], 1, log=lambda line: None)
    assert 0.2 <= entries["slow"]["duration_s"] < 5


def test_the_overall_status_ignores_skipped_parts():
    passed, skipped, failed = ({"status": s, "duration_s": 0.0} for s in ("passed", "skipped", "failed"))
    assert gpu_report.assemble("GPU", 1, {}, "t", 1.0, {"a": passed, "b": skipped})["status"] == "passed"
    assert gpu_report.assemble("GPU", 1, {}, "t", 1.0, {"a": passed, "c": failed})["status"] == "failed"


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    """One 'NVIDIA H200' seen by torch, results into tmp_path, and parts stubbed: one fails."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(gpu_report.benchmark, "RESULTS", tmp_path)

    def broken():
        raise RuntimeError("out of memory")

    monkeypatch.setattr(gpu_report, "default_parts", lambda gpu_count: [
        Part("kernel_tests", lambda: (True, {"counts": {"passed": 3}})), Part("bandwidth", broken),
        Part("collectives_tests", lambda: (True, {}), min_gpus=2), Part("engine_tokens", lambda: (True, {"equal": True}))])
    return tmp_path


def test_the_report_is_one_json_with_the_documented_fields(fake_gpu, capsys):
    assert gpu_report.main([]) == 1  # a part failed
    written = list(fake_gpu.iterdir())
    assert [path.name for path in written] == ["gpu_report_H200-141GB.json"]
    report = json.loads(written[0].read_text())
    assert set(report) == {"device", "gpu_count", "versions", "started_at", "duration_s", "status", "parts"}
    assert report["device"] == "NVIDIA H200" and report["gpu_count"] == 1 and report["status"] == "failed"
    assert set(report["versions"]) == {"python", "torch", "cuda", "triton"}
    assert [(name, entry["status"]) for name, entry in report["parts"].items()] == [
        ("kernel_tests", "passed"), ("bandwidth", "failed"), ("collectives_tests", "skipped"), ("engine_tokens", "passed")]
    assert "out of memory" in report["parts"]["bandwidth"]["error"]
    out = capsys.readouterr().out
    assert out.startswith("GPU report on 1 x NVIDIA H200") and "[2/4] bandwidth: failed" in out
    assert out.rstrip().endswith(str(written[0]))


def test_tokens_are_compared_position_by_position_up_to_the_first_difference():
    same = gpu_report.compare_tokens([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 5]])
    assert same == {"equal": True, "positions": 5, "agreeing_positions": 5, "first_difference": [None, None]}
    # a difference at position 1 of the first prompt: later agreement does not count
    differ = gpu_report.compare_tokens([[1, 9, 3], [4, 5]], [[1, 2, 3], [4, 5]])
    assert differ == {"equal": False, "positions": 5, "agreeing_positions": 3, "first_difference": [1, None]}
    with pytest.raises(ValueError, match="same prompts"):
        gpu_report.compare_tokens([[1]], [[1], [2]])


@pytest.mark.skipif(not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
                    reason="needs a GPU or Triton's interpreter")
def test_the_engine_part_runs_both_backends_on_the_shipped_model():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    passed, result = gpu_report.engine_tokens(device, torch.float32, ("def f(x):", "The KV cache"), max_tokens=4)
    assert passed and result["equal"] and result["positions"] == 8 and result["dtype"] == "float32"
    assert result["triton_tokens"] == result["torch_tokens"] and len(result["torch_tokens"][0]) == 4


def test_a_test_part_counts_passes_failures_and_skips(tmp_path):
    (tmp_path / "test_sample.py").write_text(
        "import pytest\n"
        "def test_a(): pass\n"
        "def test_b(): pass\n"
        "def test_c(): assert 1 == 2\n"
        "@pytest.mark.skip(reason='not here')\n"
        "def test_d(): pass\n")
    passed, result = gpu_report.pytest_part(str(tmp_path / "test_sample.py"), timeout_s=120)()
    assert not passed and result["exit_code"] == 1 and not result["timed_out"]
    assert result["counts"] == {"tests": 4, "passed": 2, "failed": 1, "errors": 0, "skipped": 1}
    assert "1 failed, 2 passed, 1 skipped" in result["tail"]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead, just not reaped yet
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_command_past_its_time_limit_is_killed_with_its_children():
    started = time.monotonic()
    code, output = gpu_report.run_command(
        [sys.executable, "-c", "import subprocess, sys, time; "
         "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
         "print(child.pid, flush=True); time.sleep(60)"],
        timeout_s=2, log=lambda line: None)
    assert code is None and time.monotonic() - started < 10
    grandchild = int(output.split()[0])
    deadline = time.monotonic() + 5
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(grandchild)


def test_the_ring_part_runs_the_dist_benchmark_in_a_fresh_process():
    passed, result = gpu_report.ring_benchmark(2, timeout_s=120, sizes=[4096])()
    assert passed, result["tail"]
    assert result["world_size"] == 2 and result["backend"] in ("gloo", "nccl")
    assert [row["size"] for row in result["rows"]] == [4096]
    assert result["rows"][0]["backend_s"] > 0 and result["rows"][0]["ring_s"] > 0


def test_every_entry_is_handed_over_as_soon_as_its_part_ends():
    from course_lib.gpu_report import Part, run_parts

    seen = []
    parts = [Part("one", lambda: (True, {"x": 1})), Part("two", lambda: (False, {})),
             Part("many", lambda: (True, {}), min_gpus=4)]
    run_parts(parts, gpu_count=1, log=lambda line: None, on_entry=lambda entries: seen.append(list(entries)))
    assert seen == [["one"], ["one", "two"], ["one", "two", "many"]]


def test_the_nccl_bench_part_runs_torchrun_and_keeps_the_json(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_report.benchmark, "RESULTS", tmp_path)
    if sys.platform == "linux":
        monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")  # one machine's ranks: loopback
    passed, result = gpu_report.nccl_bench(2, timeout_s=120, max_bytes="64", warmup=1, iters=1)()
    assert passed, result["tail"]
    assert result["world_size"] == 2 and not result["timed_out"]
    assert {row["collective"] for row in result["rows"]} == set(COLLECTIVES)
    assert all(row["correct"] for row in result["rows"])
    [saved] = tmp_path.iterdir()
    assert saved.name.startswith("nccl_bench_") and json.loads(saved.read_text())["rows"] == result["rows"]


def test_the_docstring_lists_every_part_in_order():
    names = [part.name for part in gpu_report.default_parts(2)]
    block = gpu_report.__doc__.split("Parts, in this order")[1].split("\n\n")[1]
    listed = [line.split()[0] for line in block.splitlines() if line.startswith("  ") and not line.startswith("   ")]
    assert listed == names


def test_a_script_part_passes_only_when_its_check_of_the_result_holds():
    script = "import json, sys\njson.dump({'value': int(sys.argv[1])}, open(sys.argv[2], 'w'))"
    passed, result = gpu_report.script_part(script, ["3"], timeout_s=60, passed=lambda r: r["value"] > 2)()
    assert passed and result["value"] == 3 and result["exit_code"] == 0
    passed, result = gpu_report.script_part(script, ["1"], timeout_s=60, passed=lambda r: r["value"] > 2)()
    assert not passed and result["value"] == 1


def test_the_tensor_parallel_part_runs_from_two_gpus():
    assert "tensor_parallel" not in [part.name for part in gpu_report.default_parts(1) if part.min_gpus <= 1]
    part = next(part for part in gpu_report.default_parts(2) if part.name == "tensor_parallel")
    assert part.min_gpus == 2
