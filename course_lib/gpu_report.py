"""Everything that needs a CUDA GPU, in one run and one JSON: ``./course gpu-report``.

    ./course gpu-report          # or: python -m course_lib.gpu_report [--out PATH]

Parts, in this order (those in fresh processes first, before this process holds GPU memory):

  kernel_tests     ``pytest tests/kernels`` with TRITON_INTERPRET unset: the kernels compiled for this GPU
  collectives_tests  (2+ GPUs) ``pytest tests/collectives``: the launcher, on NCCL where every rank has a GPU
  ring_benchmark   (2+ GPUs) ``course_lib.collectives.ring_bench``: the hand ring against NCCL's all-reduce
  nccl_bench       (2+ GPUs) ``course_lib.collectives.bench`` under torchrun on every GPU: nccl-tests' algbw and
                   busbw of the six collectives up to 64 MiB, also saved as ``benchmarks/results/nccl_bench_<gpu>.json``
  tensor_parallel  (2+ GPUs) one-shot and two-shot all-reduce on ``torch.distributed._symmetric_memory`` checked
                   against NCCL's and timed with it and the hand ring (1 KiB .. 64 MiB); the engine at
                   tensor_parallel_size=2 against 1, greedy bf16 tokens
  bandwidth        ``course_lib.kernels.benchmark``'s decode-attention sweep, with roofline predictions
  engine_tokens    greedy tokens of the shipped tiny-llama in bf16: Triton backend against PyTorch's

Every part is timed and gets its own status; a part that fails or raises is recorded and the others
still run. A part passes when its tests pass, when its benchmark completes (the bandwidth targets are
reported in its result, not enforced), or when both backends give the same tokens. Subprocess parts
have time limits that keep the whole run under 10 minutes.

The JSON, ``benchmarks/results/gpu_report_<gpu>.json``: ``device``, ``gpu_count``, ``versions``
(python, torch, cuda, triton), ``started_at`` (UTC), ``duration_s``, ``status`` ("passed" when every
part that ran passed, else "failed") and ``parts``: per name ``status`` (passed | failed | skipped),
``duration_s``, and ``result`` (what the part measured), ``error`` (the traceback's tail, when it
raised) or ``reason`` (why it was skipped). Exit status 0 when passed, 1 when a part failed, and 2,
after one line saying so, on a machine without CUDA.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from course_lib.collectives.ring_bench import SIZES
from course_lib.kernels import benchmark
from course_lib.paths import REPO_ROOT

NO_GPU = ("./course gpu-report needs a CUDA GPU, and torch sees none here; on this machine run ./course test "
          "(kernels in Triton's interpreter) and ./course check instead.")
TAIL_LINES = 40
PROMPTS = ("def fibonacci(n):", "The KV cache holds", "class Scheduler:\n    def schedule(self):",
           "Paged attention reads keys and values through a block table, so", "import torch\n",
           "A request that waits", "for i in range(10):", "The difference between a list and a tuple is")
MAX_TOKENS = 64
RING_SCRIPT = """
import json, sys
from course_lib.collectives.ring_bench import benchmark
from course_lib.collectives.launch import default_backend
n, sizes = int(sys.argv[1]), json.loads(sys.argv[2])
result = {"world_size": n, "backend": default_backend(n), "rows": benchmark(n, sizes, repeats=3)}
json.dump(result, open(sys.argv[3], "w"))
"""

TENSOR_PARALLEL_SCRIPT = """
import json, sys
from course_lib.gpu_report import tensor_parallel_check
json.dump(tensor_parallel_check(int(sys.argv[1])), open(sys.argv[2], "w"))
"""


def say(line: str) -> None:
    print(line, flush=True)


@dataclass(frozen=True)
class Part:
    """One piece of the report: ``run()`` returns (passed, result) or raises."""

    name: str
    run: Callable[[], tuple[bool, dict]]
    min_gpus: int = 1


def run_parts(parts: list[Part], gpu_count: int, log: Callable[[str], None] = say,
              on_entry: Callable[[dict[str, dict]], None] | None = None) -> dict[str, dict]:
    """Each part's entry, in order; a part that raises is recorded as failed and the next one runs.
    ``on_entry(entries)`` sees the entries so far after every part (to save them as they come)."""
    entries = {}
    for number, part in enumerate(parts, 1):
        step = f"[{number}/{len(parts)}] {part.name}"
        if gpu_count < part.min_gpus:
            entries[part.name] = {"status": "skipped", "duration_s": 0.0,
                                  "reason": f"needs {part.min_gpus} GPUs; this machine has {gpu_count}"}
            log(f"{step}: skipped ({entries[part.name]['reason']})")
            if on_entry is not None:
                on_entry(entries)
            continue
        log(f"{step}: running")
        started = time.monotonic()
        try:
            passed, result = part.run()
            status, detail = ("passed" if passed else "failed"), {"result": result}
        except Exception:  # noqa: BLE001 - one broken part must not stop the others
            status, detail = "failed", {"error": "".join(traceback.format_exc().splitlines(True)[-TAIL_LINES:])}
        entries[part.name] = {"status": status, "duration_s": round(time.monotonic() - started, 1), **detail}
        log(f"{step}: {status} in {entries[part.name]['duration_s']:.0f} s")
        if on_entry is not None:
            on_entry(entries)
    return entries


def assemble(device: str, gpu_count: int, versions: dict, started_at: str, duration_s: float,
             parts: dict[str, dict]) -> dict:
    """The report's JSON from ``run_parts``' entries (see the module docstring)."""
    ran = [entry["status"] for entry in parts.values() if entry["status"] != "skipped"]
    return {"device": device, "gpu_count": gpu_count, "versions": versions, "started_at": started_at,
            "duration_s": round(duration_s, 1), "status": "passed" if all(s == "passed" for s in ran) else "failed",
            "parts": parts}


# --- subprocess parts --------------------------------------------------------------------------
def run_command(args: list[str], timeout_s: float, env: dict | None = None,
                log: Callable[[str], None] = say) -> tuple[int | None, str]:
    """Run ``args`` from the repository root, echoing its output; return (exit code, output). After
    ``timeout_s`` its whole process group (ranks it started included) is killed and the code is None."""
    process = subprocess.Popen(args, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    lines: list[str] = []

    def pump() -> None:
        for line in process.stdout:
            lines.append(line)
            log("    " + line.rstrip())

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        code = process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        code = None
    reader.join(timeout=5)
    return code, "".join(lines)


def tail(text: str, lines: int = TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def junit_counts(path: Path) -> dict:
    """tests, passed, failed, errors and skipped from a pytest ``--junitxml`` file."""
    suite = ElementTree.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    tests, failed, errors, skipped = (int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped"))
    return {"tests": tests, "passed": tests - failed - errors - skipped, "failed": failed, "errors": errors,
            "skipped": skipped}


def pytest_part(path: str, timeout_s: float) -> Callable[[], tuple[bool, dict]]:
    """A part running ``pytest path`` in a fresh process without TRITON_INTERPRET (kernels compile)."""
    def run() -> tuple[bool, dict]:
        env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
        with tempfile.TemporaryDirectory() as folder:
            junit = Path(folder) / "junit.xml"
            args = [sys.executable, "-m", "pytest", "-q", f"--junitxml={junit}", path]
            code, output = run_command(args, timeout_s, env)
            counts = junit_counts(junit) if junit.exists() else None
        return code == 0, {"command": f"pytest {path}", "exit_code": code, "timed_out": code is None,
                           "timeout_s": timeout_s, "counts": counts, "tail": tail(output)}
    return run


def script_part(script: str, args: list[str], timeout_s: float,
                passed: Callable[[dict], bool] = lambda result: True) -> Callable[[], tuple[bool, dict]]:
    """A part running ``script`` in a fresh Python (ranks forked from a process that has used CUDA
    would fall back to gloo) with ``args`` and the path of the JSON it writes appended; the part
    passes when the script exits 0 and ``passed(result)``."""
    def run() -> tuple[bool, dict]:
        with tempfile.TemporaryDirectory() as folder:
            out = Path(folder) / "result.json"
            code, output = run_command([sys.executable, "-c", script, *args, str(out)], timeout_s)
            result = json.loads(out.read_text()) if code == 0 else {}
        return code == 0 and passed(result), {**result, "exit_code": code, "timed_out": code is None,
                                              "tail": tail(output)}
    return run


def ring_benchmark(world_size: int, timeout_s: float, sizes: list[int] = SIZES) -> Callable[[], tuple[bool, dict]]:
    """A part timing ``course_lib.collectives.ring_bench.benchmark`` on ``world_size`` ranks."""
    return script_part(RING_SCRIPT, [str(world_size), json.dumps(sizes)], timeout_s)


def tensor_parallel_check(world_size: int) -> dict:
    """Run in a process that has not used CUDA: ``symmetric.largest_difference`` and
    ``symmetric.benchmark`` on ``world_size`` GPUs under NCCL, then greedy bf16 tokens of the
    engine at tensor_parallel_size=2 against 1 (TP=2 first: its ranks fork from this process)."""
    from course_lib.collectives import symmetric
    from course_lib.collectives.launch import run_on_ranks
    from course_lib.engine.llm import LLM
    from course_lib.engine.sampling_params import SamplingParams

    difference = max(run_on_ranks(symmetric.largest_difference, world_size, backend="nccl"))
    rows = symmetric.benchmark(world_size, backend="nccl")
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    tokens = {}
    for size in (2, 1):
        with LLM("tiny-llama", device="cuda", dtype=torch.bfloat16, tensor_parallel_size=size, num_gpu_blocks=256,
                 attention_backend="torch") as llm:
            tokens[size] = [output.outputs[0].token_ids for output in llm.generate(list(PROMPTS), params, use_tqdm=False)]
    return {"world_size": world_size, "largest_difference": difference, "rows": rows,
            "crossovers": symmetric.crossovers(rows), "engine": compare_tokens(tokens[2], tokens[1])}


def nccl_bench(gpu_count: int, timeout_s: float, max_bytes: str = "64M", warmup: int = 3,
               iters: int = 10) -> Callable[[], tuple[bool, dict]]:
    """A part running ``course_lib.collectives.bench`` under torchrun, one rank per GPU; passed when it
    exits 0 (every row checked correct). Its JSON is the result and goes to ``benchmark.RESULTS``."""
    def run() -> tuple[bool, dict]:
        with tempfile.TemporaryDirectory() as folder:
            out = Path(folder) / "bench.json"
            args = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(gpu_count),
                    "-m", "course_lib.collectives.bench", "--max-bytes", max_bytes, "--warmup", str(warmup),
                    "--iters", str(iters), "--json", str(out)]
            code, output = run_command(args, timeout_s)
            result = json.loads(out.read_text()) if out.exists() else {}
        if result:
            saved = benchmark.RESULTS / f"nccl_bench_{benchmark.device_label(result['device'])}.json"
            saved.parent.mkdir(parents=True, exist_ok=True)
            saved.write_text(json.dumps(result, indent=2))
        return code == 0, {**result, "exit_code": code, "timed_out": code is None, "tail": tail(output)}
    return run


# --- in-process parts --------------------------------------------------------------------------
def bandwidth() -> tuple[bool, dict]:
    """The decode-attention sweep on this GPU (``course_lib.kernels.benchmark``'s JSON)."""
    result = benchmark.run()
    torch.cuda.empty_cache()
    return True, result


def compare_tokens(candidate: list[list[int]], reference: list[list[int]]) -> dict:
    """Per prompt, how far two greedy runs agree: positions agreeing before the first difference."""
    if len(candidate) != len(reference):
        raise ValueError(f"{len(candidate)} outputs against {len(reference)}: compare runs of the same prompts.")
    first_difference = []
    for got, want in zip(candidate, reference):
        same = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        first_difference.append(None if got == want else same)
    agreeing = sum(len(want) if first is None else first for first, want in zip(first_difference, reference))
    return {"equal": candidate == reference, "positions": sum(len(want) for want in reference),
            "agreeing_positions": agreeing, "first_difference": first_difference}


def engine_tokens(device: str = "cuda", dtype: torch.dtype = torch.bfloat16, prompts: tuple[str, ...] = PROMPTS,
                  max_tokens: int = MAX_TOKENS) -> tuple[bool, dict]:
    """Greedy tokens of tiny-llama on the Triton backend against the PyTorch backend."""
    from course_lib.engine.llm import LLM
    from course_lib.engine.sampling_params import SamplingParams

    tokens = {}
    for backend in ("torch", "triton"):
        # small prefill chunks and a small pool: chunked prefill, mixed steps, and no GPU-sized KV cache
        llm = LLM("tiny-llama", device=device, dtype=dtype, attention_backend=backend, num_gpu_blocks=256,
                  max_num_batched_tokens=64)
        outputs = llm.generate(list(prompts), SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True),
                               use_tqdm=False)
        tokens[backend] = [output.outputs[0].token_ids for output in outputs]
        del llm
        torch.cuda.empty_cache()
    comparison = compare_tokens(tokens["triton"], tokens["torch"])
    return comparison["equal"], {**comparison, "dtype": str(dtype).removeprefix("torch."), "prompts": list(prompts),
                                 "triton_tokens": tokens["triton"], "torch_tokens": tokens["torch"]}


def default_parts(gpu_count: int) -> list[Part]:
    return [
        Part("kernel_tests", pytest_part("tests/kernels", timeout_s=210)),
        Part("collectives_tests", pytest_part("tests/collectives", timeout_s=100), min_gpus=2),
        Part("ring_benchmark", ring_benchmark(min(gpu_count, 8), timeout_s=90), min_gpus=2),
        Part("nccl_bench", nccl_bench(gpu_count, timeout_s=90), min_gpus=2),
        # float32 sums in a different order: 1e-3 of O(10) values; bf16 tokens may part where logits nearly tie
        Part("tensor_parallel", script_part(TENSOR_PARALLEL_SCRIPT, [str(min(gpu_count, 8))], timeout_s=150,
                                            passed=lambda result: result["largest_difference"] < 1e-3),
             min_gpus=2),
        Part("bandwidth", bandwidth),
        Part("engine_tokens", engine_tokens),
    ]


def versions() -> dict:
    try:
        triton = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton = None
    return {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "triton": triton}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="where to write the JSON "
                        "(default: benchmarks/results/gpu_report_<gpu>.json)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(NO_GPU, file=sys.stderr)
        return 2
    device, gpu_count = torch.cuda.get_device_name(), torch.cuda.device_count()
    say(f"GPU report on {gpu_count} x {device}")
    started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    started, about = time.monotonic(), versions()
    out = args.out or benchmark.RESULTS / f"gpu_report_{benchmark.device_label(device)}.json"
    out.parent.mkdir(parents=True, exist_ok=True)

    def save(entries: dict[str, dict]) -> dict:  # after every part, so a hang later keeps what ran
        report = assemble(device, gpu_count, about, started_at, time.monotonic() - started, entries)
        out.write_text(json.dumps(report, indent=2))
        return report

    report = save(run_parts(default_parts(gpu_count), gpu_count, on_entry=save))
    parts = report["parts"]
    print(f"{report['status']} in {report['duration_s']:.0f} s: "
          + ", ".join(f"{name} {entry['status']}" for name, entry in parts.items()) + f"; wrote {out}")
    return 0 if report["status"] == "passed" else 1


if __name__ == "__main__":
    raise SystemExit(main())
