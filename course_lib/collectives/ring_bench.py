"""The hand-written ring against the backend's own all-reduce: ``python -m course_lib.collectives.ring_bench``.

Both run on the same ranks, message sizes and buffers, interleaved repeat by repeat (the
machine's noise hits both alike). Each time is the slowest rank's median; the table prints
both and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from course_lib.collectives.launch import default_backend, run_on_ranks
from course_lib.collectives.ring import ring_all_reduce
from course_lib.perf.units import format_bytes

SIZES = [4 * 1024 * 4**k for k in range(8)]  # 4 KiB .. 64 MiB


def time_all_reduces(sizes: list[int], repeats: int) -> dict[int, dict[str, float]]:
    """Run on every rank: median seconds of each implementation per message size (bytes)."""
    timings = {}
    on_gpu = "nccl" in dist.get_backend()
    for size in sizes:
        data = torch.ones(size // 4, device=f"cuda:{dist.get_rank()}" if on_gpu else "cpu")
        samples: dict[str, list[float]] = {"backend": [], "ring": []}
        for _ in range(repeats):
            for name, all_reduce in (("backend", dist.all_reduce), ("ring", ring_all_reduce)):
                dist.barrier()
                started = time.perf_counter()
                all_reduce(data)
                if on_gpu:
                    torch.cuda.synchronize()
                samples[name].append(time.perf_counter() - started)
        timings[size] = {name: statistics.median(values) for name, values in samples.items()}
        print(f"{format_bytes(size)} done")
    return timings


def benchmark(world_size: int = 4, sizes: list[int] = SIZES, repeats: int = 5) -> list[dict]:
    """Rows of {size, backend_s, ring_s}: each the slowest rank's median."""
    per_rank = run_on_ranks(time_all_reduces, world_size, sizes, repeats, trace_calls=False, timeout_s=600,
                            on_print=lambda rank, line: print(line, flush=True) if rank == 0 else None)
    return [{"size": size, "backend_s": max(r[size]["backend"] for r in per_rank),
             "ring_s": max(r[size]["ring"] for r in per_rank)} for size in sizes]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    rows = benchmark(args.world_size, SIZES, args.repeats)
    print(f"\nall-reduce of float32 on {args.world_size} ranks, backend {default_backend(args.world_size)}")
    print(f"{'message':>9} {'backend':>10} {'hand ring':>10} {'ring/backend':>13}")
    for row in rows:
        print(f"{format_bytes(row['size']):>9} {1e3 * row['backend_s']:8.2f}ms {1e3 * row['ring_s']:8.2f}ms "
              f"{row['ring_s'] / row['backend_s']:12.2f}x")


if __name__ == "__main__":
    main()
