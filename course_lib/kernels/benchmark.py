"""Decode-attention bandwidth on a CUDA GPU: the paged Triton kernel against PyTorch's SDPA.

    python -m course_lib.kernels.benchmark            # writes benchmarks/results/decode_attention_<gpu>.json

For each batch x context it times the paged decode kernel (KV read through block tables,
16-token blocks scattered over the pool) and, as the baseline, ``scaled_dot_product_attention``
on the same KV already gathered contiguous (the best case a non-paged layout gets). Achieved
bandwidth = bytes the kernel must read (K and V of every context token, plus queries) / time.

Beside each measured time a row records the roofline's prediction, ``predicted_ms`` = those
bytes / the peak HBM bandwidth of the matched preset in ``course_lib.perf.hardware``, and
``paged_share_of_peak`` = ``predicted_ms / paged_ms``, then the point's target share from
``TARGETS`` and whether it meets it (``None`` where no target applies or the GPU has no preset).
``targets`` in the JSON sums each target up over its points. Timing needs CUDA; the bookkeeping
(``add_roofline``, ``document``) is plain arithmetic. The JSON lets CPU-only learners replay real
GPU figures.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from course_lib.paths import RESULTS_DIR
from course_lib.perf.attention_roofline import BATCHES, CONTEXTS, SHAPE, decode_attention_bytes
from course_lib.perf.hardware import match_gpu

RESULTS = RESULTS_DIR
# Issue 14's goals on an H100/H200: (name, share of peak HBM bandwidth, the points it covers)
TARGETS: tuple[tuple[str, float, Callable[[int, int], bool]], ...] = (
    ("batch >= 8 at contexts >= 4k", 0.70, lambda batch, context: batch >= 8 and context >= 4096),
    ("batch 1 at 16k context", 0.50, lambda batch, context: batch == 1 and context >= 16384),
)


def measure(batch: int, context: int, heads: int = SHAPE["heads"], kv_heads: int = SHAPE["kv_heads"],
            dim: int = SHAPE["head_dim"], block_size: int = SHAPE["block_size"],
            dtype: torch.dtype = torch.bfloat16) -> dict:
    """One point on the GPU: batch, context, bytes_read, paged_ms, sdpa_ms and both GB/s."""
    import triton.testing

    from course_lib.kernels.paged_attention import paged_decode_attention

    blocks_per_seq = context // block_size
    num_blocks = batch * blocks_per_seq
    k_cache = torch.randn(num_blocks, block_size, kv_heads, dim, device="cuda", dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    tables = torch.randperm(num_blocks, device="cuda", dtype=torch.int32).view(batch, blocks_per_seq)
    lens = torch.full((batch,), context, device="cuda", dtype=torch.int32)
    q = torch.randn(batch, heads, dim, device="cuda", dtype=dtype)
    scale = dim ** -0.5
    paged_ms = triton.testing.do_bench(lambda: paged_decode_attention(q, k_cache, v_cache, tables, lens, scale))
    k = k_cache[tables.long()].flatten(1, 2).transpose(1, 2).contiguous()  # [B, kv_heads, L, D]
    v = v_cache[tables.long()].flatten(1, 2).transpose(1, 2).contiguous()
    sdpa_ms = triton.testing.do_bench(
        lambda: F.scaled_dot_product_attention(q.unsqueeze(2), k, v, scale=scale, enable_gqa=True))
    bytes_read = decode_attention_bytes(batch, context, heads, kv_heads, dim, k_cache.element_size())
    return {"batch": batch, "context": context, "bytes_read": bytes_read, "paged_ms": paged_ms, "sdpa_ms": sdpa_ms,
            "paged_gb_per_s": bytes_read / paged_ms / 1e6, "sdpa_gb_per_s": bytes_read / sdpa_ms / 1e6}


def target_share(batch: int, context: int) -> float | None:
    """The share of peak HBM bandwidth ``TARGETS`` asks of this point, or None."""
    return next((share for _, share, covers in TARGETS if covers(batch, context)), None)


def add_roofline(row: dict, peak: float | None) -> dict:
    """``row`` (batch, context, bytes_read, paged_ms) with predicted_ms, paged_share_of_peak,
    target_share_of_peak and meets_target added; the first two are None when ``peak`` is."""
    predicted_ms = row["bytes_read"] / peak * 1e3 if peak else None
    share = predicted_ms / row["paged_ms"] if peak else None
    target = target_share(row["batch"], row["context"])
    meets = None if target is None or share is None else share >= target
    return {**row, "predicted_ms": predicted_ms, "paged_share_of_peak": share, "target_share_of_peak": target,
            "meets_target": meets}


def describe(row: dict) -> str:
    """One progress line for a row with its roofline fields."""
    share = row["paged_share_of_peak"]
    text = f"{100 * share:.0f}% of peak" if share is not None else "peak unknown"
    if row["meets_target"] is not None:
        text += f", target {100 * row['target_share_of_peak']:.0f}% {'met' if row['meets_target'] else 'missed'}"
    return (f"batch {row['batch']:4} context {row['context']:6}: paged {row['paged_ms']:.3f} ms "
            f"({row['paged_gb_per_s']:.0f} GB/s, {text}); SDPA on contiguous KV {row['sdpa_ms']:.3f} ms")


def sweep(peak: float | None, measure_point: Callable[[int, int], dict] = measure,
          log: Callable[[str], None] = print) -> list[dict]:
    """Every batch x context of the sweep, measured, with its roofline fields; one log line each."""
    rows = []
    for batch in BATCHES:
        for context in CONTEXTS:
            rows.append(add_roofline(measure_point(batch, context), peak))
            log(describe(rows[-1]))
    return rows


def document(device: str, peak: float | None, rows: list[dict]) -> dict:
    """The JSON: device, peak, SHAPE, rows, and per target its points' worst share and whether all meet it."""
    targets = []
    for name, share, covers in TARGETS:
        shares = [r["paged_share_of_peak"] for r in rows if covers(r["batch"], r["context"])]
        worst = min(shares) if shares and None not in shares else None
        targets.append({"name": name, "share_of_peak": share, "points": len(shares), "worst_share_of_peak": worst,
                        "met": None if worst is None else worst >= share})
    return {"device": device, "peak_hbm_bytes_per_s": peak, **SHAPE, "rows": rows, "targets": targets}


def device_label(device: str) -> str:
    """A file-name part for a CUDA device: its preset's name where one matches, else its own name."""
    preset = match_gpu(device)
    return (preset.name if preset else device).replace(" ", "_")


def run() -> dict:
    """Measure the sweep on this process's CUDA device; return ``document``'s JSON."""
    name = torch.cuda.get_device_name()
    preset = match_gpu(name)
    peak = preset.hbm_bandwidth if preset else None
    return document(name, peak, sweep(peak, log=lambda line: print(line, flush=True)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("This benchmark needs a CUDA GPU; on a CPU, replay the committed results in "
                         "benchmarks/results/ (module 01's notebook plots them).")
    result = run()
    out = args.out or RESULTS / f"decode_attention_{device_label(result['device'])}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print("wrote", out)


if __name__ == "__main__":
    main()
