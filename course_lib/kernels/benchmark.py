"""Decode-attention bandwidth on a CUDA GPU: the paged Triton kernel against PyTorch's SDPA.

    python -m course_lib.kernels.benchmark            # writes benchmarks/results/decode_attention_<gpu>.json

For each batch x context it times the paged decode kernel (KV read through block tables,
16-token blocks scattered over the pool) and, as the baseline, ``scaled_dot_product_attention``
on the same KV already gathered contiguous (the best case a non-paged layout gets). Achieved
bandwidth = bytes the kernel must read (K and V of every context token, plus queries) / time,
reported as a share of the GPU's peak HBM bandwidth from ``course_lib.perf.hardware``.
The JSON lets CPU-only learners replay real GPU figures.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from course_lib.paths import REPO_ROOT
from course_lib.perf.attention_roofline import BATCHES, CONTEXTS, SHAPE, decode_attention_bytes
from course_lib.perf.hardware import match_gpu

RESULTS = REPO_ROOT / "benchmarks" / "results"


def measure(batch: int, context: int, heads: int = SHAPE["heads"], kv_heads: int = SHAPE["kv_heads"],
            dim: int = SHAPE["head_dim"], block_size: int = SHAPE["block_size"],
            dtype: torch.dtype = torch.bfloat16) -> dict:
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
    return {"batch": batch, "context": context, "paged_ms": paged_ms, "sdpa_ms": sdpa_ms,
            "paged_gb_per_s": bytes_read / paged_ms / 1e6, "sdpa_gb_per_s": bytes_read / sdpa_ms / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("This benchmark needs a CUDA GPU; on a CPU, replay the committed results in "
                         "benchmarks/results/ (module 01's notebook plots them).")
    name = torch.cuda.get_device_name()
    preset = match_gpu(name)
    peak = preset.hbm_bandwidth if preset else None
    rows = []
    for batch in BATCHES:
        for context in CONTEXTS:
            row = measure(batch, context)
            if peak:
                row["paged_share_of_peak"] = row["paged_gb_per_s"] * 1e9 / peak
            rows.append(row)
            share = f"{100 * row['paged_share_of_peak']:.0f}% of peak" if peak else "peak unknown"
            print(f"batch {batch:4} context {context:6}: paged {row['paged_ms']:.3f} ms "
                  f"({row['paged_gb_per_s']:.0f} GB/s, {share}); SDPA on contiguous KV {row['sdpa_ms']:.3f} ms",
                  flush=True)
    out = args.out or RESULTS / f"decode_attention_{(preset.name if preset else name).replace(' ', '_')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": name, "peak_hbm_bytes_per_s": peak, **SHAPE, "rows": rows}, indent=2))
    print("wrote", out)


if __name__ == "__main__":
    main()
