"""nccl-tests for torch.distributed: ``python -m course_lib.collectives.bench``.

Like NVIDIA's nccl-tests (all_reduce_perf and its siblings): for each collective and each message
size from ``--min-bytes`` to ``--max-bytes`` (times ``--step-factor``), the buffers are allocated
once, the result is checked once (nccl-tests' ``-c``), ``--warmup`` calls run untimed, then
``--iters`` calls are timed together after a barrier; a rank's time is that total over
``--iters`` and the row's time is the mean of the ranks' times (nccl-tests' ``-a 1``). Each row
gives algbw and busbw (``course_lib.perf.bus_bandwidth``); busbw is the one to hold against the
link's peak.

Sizes follow nccl-tests: ``size`` is the full buffer (the output of an all-gather, the input of a
reduce-scatter, the whole buffer of an all-to-all). The collectives that split a buffer into one
block per rank round it down to a multiple of ranks x element size (nccl-tests' integer division)
and report the size that ran; a size under one element per rank is skipped. ``count`` is the
elements of one call's argument as nccl-tests prints it: one rank's block for those three.
All-reduce, broadcast and reduce run in place (torch has no out-of-place form); the others out
of place.

Run it three ways:

    python -m course_lib.collectives.bench --world-size 4 --max-bytes 64M     # forks 4 local ranks
    torchrun --standalone --nproc-per-node 2 -m course_lib.collectives.bench --max-bytes 1G
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:PORT \\
        -m course_lib.collectives.bench --json busbw.json                   # on each of the 2 nodes

Under torchrun (RANK, WORLD_SIZE, LOCAL_RANK and MASTER_ADDR set) each process is one rank;
rank 0 prints the table and writes ``--json``. Gloo and NCCL pick a network interface
themselves; where they pick the wrong one, name it: ``GLOO_SOCKET_IFNAME=lo`` for one machine
(the forking launcher sets that for its own ranks), ``GLOO_SOCKET_IFNAME=eth0`` or
``NCCL_SOCKET_IFNAME=eth0`` (the interface between the nodes) for several.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from course_lib.checks import require_count
from course_lib.collectives.launch import default_backend, progress_lines, run_on_ranks
from course_lib.collectives.primitives import all_gather_flat, reduce_scatter_flat
from course_lib.paths import RESULTS_DIR
from course_lib.perf.bus_bandwidth import COLLECTIVES, algorithm_bandwidth, bus_bandwidth
from course_lib.perf.units import GB, MiB

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}
SPLIT = ("all_gather", "reduce_scatter", "all_to_all")  # one block of the buffer per rank
STEP_MARKER = "@@bench-step "  # rank 0's progress line; the driver turns it into on_step calls
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")


@dataclass
class BenchRow:
    """One (collective, size) point. ``size``: bytes of the full buffer as run; ``count``: elements
    as nccl-tests prints them; ``time_us``: per call, the mean over ranks; ``algbw`` and
    ``busbw``: GB/s (10^9 bytes/s); ``correct``: every rank's result matched once."""

    collective: str
    size: int
    count: int
    dtype: str
    time_us: float
    algbw: float
    busbw: float
    correct: bool


@dataclass
class BenchResult:
    """A whole run; ``hostnames`` in rank order of first appearance, one per machine."""

    backend: str
    world_size: int
    num_nodes: int
    hostnames: list[str]
    torch_version: str
    device: str
    dtype: str
    warmup: int
    iters: int
    rows: list[BenchRow] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json())


def load_result(path: str | Path) -> BenchResult:
    """The ``BenchResult`` that ``save`` wrote."""
    data = json.loads(Path(path).read_text())
    return BenchResult(**{**data, "rows": [BenchRow(**row) for row in data["rows"]]})


def saved_results() -> list[Path]:
    """The GPU runs saved by ``./course gpu-report`` (``benchmarks/results/nccl_bench_*.json``), to replay."""
    return sorted(RESULTS_DIR.glob("nccl_bench_*.json"))


def parse_bytes(text: str) -> int:
    """``"8"``, ``"1K"``, ``"64M"``, ``"1G"`` (binary units, as nccl-tests reads them; a trailing
    ``B`` or ``iB`` is allowed) -> bytes."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(I?B)?\s*", text.upper())
    if not match or (match.group(3) == "IB" and not match.group(2)):
        raise ValueError(f"Cannot read {text!r} as a size; write bytes with an optional K, M or G, e.g. 64M.")
    return int(match.group(1)) * 1024 ** "_KMG".index(match.group(2) or "_")


def message_sizes(min_bytes: int = 8, max_bytes: int = 64 * MiB, step_factor: int = 2) -> list[int]:
    """``min_bytes``, times ``step_factor``, ..., up to ``max_bytes`` included."""
    if min_bytes < 1 or max_bytes < min_bytes:
        raise ValueError(f"Need 1 <= min_bytes <= max_bytes, got {min_bytes} and {max_bytes}.")
    require_count("step_factor", step_factor, minimum=2)
    sizes = [min_bytes]
    while sizes[-1] * step_factor <= max_bytes:
        sizes.append(sizes[-1] * step_factor)
    return sizes


def total_steps(collectives: Sequence[str] = COLLECTIVES, min_bytes: int = 8, max_bytes: int = 64 * MiB,
                step_factor: int = 2) -> int:
    """How many (collective, size) steps a run reports to ``on_step``, skipped sizes included."""
    return len(collectives) * len(message_sizes(min_bytes, max_bytes, step_factor))


def buffer_elements(collective: str, num_bytes: int, world_size: int, element_size: int) -> int:
    """Elements of the full buffer for a ``num_bytes`` message: a multiple of ``world_size`` for the
    split collectives, rounded down; 0 means the size is skipped."""
    elements = num_bytes // element_size
    return elements - elements % world_size if collective in SPLIT else elements


def _check_settings(collectives: Sequence[str], dtype: str, warmup: int, iters: int) -> None:
    unknown = [name for name in collectives if name not in COLLECTIVES]
    if unknown or not collectives:
        raise ValueError(f"Unknown collectives {unknown}; choose among {', '.join(COLLECTIVES)}.")
    if dtype not in DTYPES:
        raise ValueError(f"Unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}.")
    if warmup < 0 or iters < 1:
        raise ValueError(f"Need warmup >= 0 and iters >= 1, got {warmup} and {iters}.")


def _matches(got: torch.Tensor, expected: torch.Tensor, world: int) -> bool:
    """Within the rounding a sum of ``world`` terms can pick up in ``got``'s dtype."""
    tolerance = world * torch.finfo(got.dtype).eps
    return bool(torch.allclose(got.double(), expected.to(got.device, torch.float64), rtol=tolerance, atol=0))


def prepare(collective: str, elements: int, dtype: torch.dtype,
            device: torch.device) -> tuple[Callable[[], object], Callable[[], bool]]:
    """The buffers, filled with values whose result is easy to predict, and two closures over
    them: one call of the collective, and the check of the result after the first call."""
    rank, world = dist.get_rank(), dist.get_world_size()
    block = elements // world
    blocks = torch.arange(world, dtype=torch.float64)  # one value per block of a split buffer
    everyone = world * (world + 1) / 2  # sum over ranks of rank + 1
    data = torch.full((elements if collective not in SPLIT else block,), rank + 1.0, dtype=dtype, device=device)
    if collective == "all_reduce":
        return lambda: dist.all_reduce(data), lambda: _matches(data, torch.tensor(everyone), world)
    if collective == "broadcast":
        return lambda: dist.broadcast(data, src=0), lambda: _matches(data, torch.tensor(1.0), world)
    if collective == "reduce":
        return (lambda: dist.reduce(data, dst=0),
                lambda: rank != 0 or _matches(data, torch.tensor(everyone), world))
    if collective == "all_gather":  # block i of the output is rank i's rank + 1
        gathered = torch.empty(elements, dtype=dtype, device=device)
        return (lambda: all_gather_flat(gathered, data),
                lambda: _matches(gathered, (blocks + 1).repeat_interleave(block), world))
    if collective == "reduce_scatter":  # block j on rank r is (r + 1)(j + 1): rank j gets (j + 1) x everyone
        source = ((rank + 1) * (blocks + 1)).repeat_interleave(block).to(device, dtype)
        shard = torch.empty(block, dtype=dtype, device=device)
        return (lambda: reduce_scatter_flat(shard, source),
                lambda: _matches(shard, torch.tensor((rank + 1) * everyone), world))
    # all_to_all: block j on rank r is r * N + j + 1, so rank r receives i * N + r + 1 from rank i
    source = (rank * world + blocks + 1).repeat_interleave(block).to(device, dtype)
    received = torch.empty(elements, dtype=dtype, device=device)
    expected = (blocks * world + rank + 1).repeat_interleave(block)
    return lambda: dist.all_to_all_single(received, source), lambda: _matches(received, expected, world)


def _seconds_per_call(call: Callable[[], object], warmup: int, iters: int, on_gpu: bool) -> float:
    for _ in range(warmup):
        call()
    dist.barrier()
    if on_gpu:
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(iters):
        call()
    if on_gpu:
        torch.cuda.synchronize()
    return (time.perf_counter() - started) / iters


def bench_on_rank(collectives: Sequence[str] = COLLECTIVES, min_bytes: int = 8, max_bytes: int = 64 * MiB,
                  step_factor: int = 2, warmup: int = 5, iters: int = 20, dtype: str = "float32",
                  report_steps: bool = False) -> BenchResult:
    """Run on every rank of an initialised process group (``run_on_ranks`` or torchrun); every
    rank returns the same result. ``report_steps``: rank 0 prints ``STEP_MARKER`` + the step's
    index after each (collective, size) step."""
    _check_settings(collectives, dtype, warmup, iters)
    sizes = message_sizes(min_bytes, max_bytes, step_factor)
    rank, world = dist.get_rank(), dist.get_world_size()
    backend = dist.get_backend()
    on_gpu = "nccl" in backend
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    torch_dtype = DTYPES[dtype]
    element_size = torch.empty((), dtype=torch_dtype).element_size()
    rows = []
    for step, (collective, num_bytes) in enumerate((c, s) for c in collectives for s in sizes):
        elements = buffer_elements(collective, num_bytes, world, element_size)
        if elements > 0:
            call, check = prepare(collective, elements, torch_dtype, device)
            try:
                call()
            except RuntimeError as error:
                raise RuntimeError(f"{backend} could not run {collective} on {dtype} tensors ({error}); try "
                                   f"dtype float32{' or the nccl backend' if not on_gpu else ''}.") from error
            correct = check()
            seconds = _seconds_per_call(call, warmup, iters, on_gpu)
            totals = torch.tensor([seconds, 0.0 if correct else 1.0], dtype=torch.float64, device=device)
            dist.all_reduce(totals)  # sum of the ranks' times, and of the ranks whose check failed
            seconds, size = totals[0].item() / world, elements * element_size
            algbw = algorithm_bandwidth(size, seconds) / GB
            rows.append(BenchRow(collective, size, elements // world if collective in SPLIT else elements, dtype,
                                 seconds * 1e6, algbw, bus_bandwidth(collective, algbw, world),
                                 totals[1].item() == 0))
        if report_steps and rank == 0:
            print(f"{STEP_MARKER}{step}", flush=True)
    hostnames: list[str] = [""] * world
    dist.all_gather_object(hostnames, socket.gethostname())
    local_world = os.environ.get("LOCAL_WORLD_SIZE")
    num_nodes = int(os.environ["WORLD_SIZE"]) // int(local_world) if local_world and "WORLD_SIZE" in os.environ else 1
    device_name = torch.cuda.get_device_name(device) if on_gpu else f"CPU ({platform.machine()})"
    return BenchResult("nccl" if on_gpu else backend, world, num_nodes, list(dict.fromkeys(hostnames)),
                       torch.__version__, device_name, dtype, warmup, iters, rows)


def benchmark(world_size: int = 4, collectives: Sequence[str] = COLLECTIVES, min_bytes: int = 8,
              max_bytes: int = 64 * MiB, step_factor: int = 2, warmup: int = 5, iters: int = 20,
              dtype: str = "float32", backend: str | None = None, on_step: Callable[[int], None] | None = None,
              timeout_s: float = 600.0) -> BenchResult:
    """``bench_on_rank`` on ``world_size`` local ranks. ``on_step(i)`` is called for i = 0 ..
    ``total_steps(...) - 1`` as rank 0 finishes each step (e.g. a notebook's progress bar)."""
    _check_settings(collectives, dtype, warmup, iters)
    message_sizes(min_bytes, max_bytes, step_factor)

    results = run_on_ranks(bench_on_rank, world_size, collectives=tuple(collectives), min_bytes=min_bytes,
                           max_bytes=max_bytes, step_factor=step_factor, warmup=warmup, iters=iters, dtype=dtype,
                           report_steps=True, backend=backend, timeout_s=timeout_s, trace_calls=False,
                           on_print=progress_lines(STEP_MARKER, on_step))
    return results[0]


def format_table(result: BenchResult) -> str:
    """nccl-tests-like text: per collective a header, one line per size, the mean busbw."""
    nodes = f"{result.num_nodes} node{'s' if result.num_nodes != 1 else ''}"
    lines = [f"# torch {result.torch_version}, {result.world_size} ranks on {nodes} ({', '.join(result.hostnames)}), "
             f"{result.device}; warmup {result.warmup}, iters {result.iters}; time: mean over ranks"]
    for collective in dict.fromkeys(row.collective for row in result.rows):
        rows = [row for row in result.rows if row.collective == collective]
        lines += ["#", f"# {collective}: {result.world_size} ranks, backend {result.backend}, {result.dtype}",
                  f"# {'size(B)':>12} {'count(elements)':>16} {'type':>9} {'time(us)':>11} {'algbw(GB/s)':>12} "
                  f"{'busbw(GB/s)':>12} {'check':>6}"]
        lines += [f"  {row.size:>12} {row.count:>16} {row.dtype:>9} {row.time_us:>11.1f} {row.algbw:>12.3f} "
                  f"{row.busbw:>12.3f} {'ok' if row.correct else 'WRONG':>6}" for row in rows]
        lines.append(f"# Avg bus bandwidth    : {sum(row.busbw for row in rows) / len(rows):.3f} GB/s")
    return "\n".join(lines)


def under_torchrun() -> bool:
    """True in a process that torchrun started (its rendezvous variables are set)."""
    return all(name in os.environ for name in TORCHRUN_ENV)


def _torchrun_backend() -> str:
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= local_world else "gloo"


def _run_under_torchrun(backend: str | None, settings: dict, timeout_s: float) -> BenchResult:
    """One torchrun process's part; a collective stuck for ``timeout_s`` raises instead of waiting
    for the backend's default of 30 minutes (gloo) or 10 (NCCL)."""
    backend = backend or _torchrun_backend()
    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        dist.init_process_group(backend, device_id=device, timeout=timeout)
    else:
        dist.init_process_group(backend, timeout=timeout)
    try:
        return bench_on_rank(**settings)
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """The command line; 0 when every row's check passed, else 1."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collectives", nargs="+", choices=COLLECTIVES, default=list(COLLECTIVES))
    parser.add_argument("--min-bytes", type=parse_bytes, default=8, help="e.g. 8, 1K, 64M, 1G")
    parser.add_argument("--max-bytes", type=parse_bytes, default=64 * MiB)
    parser.add_argument("--step-factor", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--world-size", type=int, default=None,
                        help="local ranks to fork (default 4); under torchrun, torchrun's --nproc-per-node decides")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                        help="default: nccl with CUDA and a GPU per local rank, else gloo")
    parser.add_argument("--json", type=Path, default=None, help="write the result here (rank 0)")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="give up on a stuck run after this long")
    args = parser.parse_args(argv)
    settings = dict(collectives=args.collectives, min_bytes=args.min_bytes, max_bytes=args.max_bytes,
                    step_factor=args.step_factor, warmup=args.warmup, iters=args.iters, dtype=args.dtype)
    if under_torchrun():
        if args.world_size is not None:
            parser.error("--world-size forks local ranks; under torchrun the ranks are torchrun's: drop it")
        result = _run_under_torchrun(args.backend, settings, args.timeout_s)
        lead = int(os.environ["RANK"]) == 0
    else:
        args.world_size = args.world_size or 4
        per_collective = len(message_sizes(args.min_bytes, args.max_bytes, args.step_factor))
        backend = args.backend or default_backend(args.world_size)
        print(f"{len(args.collectives)} collectives x {per_collective} sizes on {args.world_size} ranks ({backend})",
              flush=True)

        def done(step: int) -> None:
            if (step + 1) % per_collective == 0:
                print(f"  {args.collectives[step // per_collective]} done", flush=True)

        result = benchmark(args.world_size, backend=backend, on_step=done, timeout_s=args.timeout_s, **settings)
        lead = True
    if lead:
        print(format_table(result))
        if args.json is not None:
            result.save(args.json)
            print(f"wrote {args.json}")
    return 0 if all(row.correct for row in result.rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
