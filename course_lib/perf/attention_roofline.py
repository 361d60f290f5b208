"""What the roofline predicts for the paged decode-attention sweep, before anyone measures it.

The sweep is ``python -m course_lib.kernels.benchmark``'s: batch x context for a
Llama-3-8B-like layer (32 query heads, 8 KV heads, head dim 128, bf16, 16-token blocks).
One decode step of attention reads every context token's K and V once, plus the queries, and
writes the outputs; it does 4 FLOPs per (query head, context token, dimension):

    bytes = 2 x batch x context x KV heads x head_dim x e + 2 x batch x heads x head_dim x e
    FLOPs = 4 x batch x heads x context x head_dim        (e = bytes per element)

That is 2 x heads / (KV heads x e) FLOPs per byte, 4 for this bf16 shape, far left of every
GPU's ridge point (hundreds of FLOPs per byte), so the time is the bytes over the bandwidth the
kernel can draw, plus a fixed launch cost:

    time = launch + max(FLOPs / peak FLOP/s, bytes / (peak HBM x min(1, programs / SMs)))

The kernel runs one program per (sequence, KV head); with fewer programs than SMs the others
sit idle, and the model assumes a program streams at most one SM's share of the peak. This
is a prediction from three numbers per GPU, not a measurement: real kernels also lose to
tail effects, uneven block lengths and cache misses.
"""

from __future__ import annotations

from course_lib.perf.hardware import GPU

BATCHES = (1, 8, 32, 64, 128)
CONTEXTS = (512, 1024, 4096, 16384)
SHAPE = {"heads": 32, "kv_heads": 8, "head_dim": 128, "block_size": 16, "dtype": "bfloat16"}
ELEMENT_BYTES = 2  # of SHAPE's dtype
LAUNCH_S = 5e-6  # launch and drain of one small CUDA kernel: a few microseconds


def decode_attention_bytes(batch: int, context: int, heads: int, kv_heads: int, head_dim: int,
                           element_bytes: int) -> int:
    """Bytes one decode-attention call must move: K and V of the context, queries in, outputs out."""
    return 2 * batch * context * kv_heads * head_dim * element_bytes + 2 * batch * heads * head_dim * element_bytes


def predicted_decode_seconds(gpu: GPU, batch: int, context: int, heads: int = 32, kv_heads: int = 8,
                             head_dim: int = 128, element_bytes: int = 2, launch_s: float = LAUNCH_S) -> float:
    """The module docstring's model of one paged decode-attention call on ``gpu``."""
    moved = decode_attention_bytes(batch, context, heads, kv_heads, head_dim, element_bytes)
    flops = 4 * batch * heads * context * head_dim
    active = min(1.0, batch * kv_heads / gpu.sm_count)
    return launch_s + max(flops / gpu.bf16_flops, moved / (gpu.hbm_bandwidth * active))


def predicted_decode_sweep(gpu: GPU) -> dict:
    """The benchmark's sweep as the model predicts it, in the benchmark's JSON layout
    (``rows`` of batch, context, ``paged_ms`` and ``paged_gb_per_s``), marked ``predicted``."""
    element_bytes = ELEMENT_BYTES
    rows = []
    for batch in BATCHES:
        for context in CONTEXTS:
            seconds = predicted_decode_seconds(gpu, batch, context, SHAPE["heads"], SHAPE["kv_heads"],
                                               SHAPE["head_dim"], element_bytes)
            moved = decode_attention_bytes(batch, context, SHAPE["heads"], SHAPE["kv_heads"], SHAPE["head_dim"],
                                           element_bytes)
            rows.append({"batch": batch, "context": context, "paged_ms": seconds * 1e3,
                         "paged_gb_per_s": moved / seconds / 1e9})
    return {"device": gpu.name, "peak_hbm_bytes_per_s": gpu.hbm_bandwidth, "predicted": True, **SHAPE,
            "rows": rows}
