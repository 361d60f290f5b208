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

The kernel runs one program per (sequence, KV head, partition of the context). With fewer
(sequence, KV head) pairs than it takes to fill the GPU, the context is split
(``choose_num_partitions``, flash-decoding as in vLLM's PagedAttention v2) and a second small
kernel combines the partitions: one more launch, and each partition's float32 state written
and read back. The model assumes a program streams at most one SM's share of the peak, so with
fewer programs than SMs the rest sit idle. This is a prediction from three numbers per GPU, not
a measurement: real kernels also lose to tail effects, uneven block lengths and cache misses.
"""

from __future__ import annotations

from course_lib.perf.hardware import GPU

BATCHES = (1, 8, 32, 64, 128)
CONTEXTS = (512, 1024, 4096, 16384)
SHAPE = {"heads": 32, "kv_heads": 8, "head_dim": 128, "block_size": 16, "dtype": "bfloat16"}
ELEMENT_BYTES = 2  # of SHAPE's dtype
LAUNCH_S = 5e-6  # launch and drain of one small CUDA kernel: a few microseconds
MIN_PARTITION_TOKENS = 256  # below this a partition's program is too short to pay for the reduction
PROGRAMS_PER_SM = 2  # enough programs in flight to hide memory latency
MAX_PARTITIONS = 64  # the reduction holds every partition's state in one tile (checked at this size)


def choose_num_partitions(batch: int, kv_heads: int, max_len: int, sm_count: int) -> int:
    """How many pieces the decode kernel splits each sequence's context into: 1 when batch x KV
    heads programs already fill ``PROGRAMS_PER_SM`` per SM; otherwise enough to fill them, but never
    partitions shorter than ``MIN_PARTITION_TOKENS`` tokens, and never more than ``MAX_PARTITIONS``."""
    wanted = -(-PROGRAMS_PER_SM * sm_count // (batch * kv_heads))
    return max(1, min(wanted, max_len // MIN_PARTITION_TOKENS, MAX_PARTITIONS))


def partition_plan(longest: int, block_size: int, parts: int) -> tuple[int, int]:
    """(partitions, tokens per partition) for splitting contexts of up to ``longest`` tokens into
    about ``parts`` pieces of whole blocks; recounted so that no partition lies wholly past
    ``longest`` (1 partition when there is nothing to split)."""
    blocks_per_part = max(1, -(-longest // (parts * block_size)))
    tokens = blocks_per_part * block_size
    return max(1, -(-longest // tokens)), tokens


def decode_attention_bytes(batch: int, context: int, heads: int, kv_heads: int, head_dim: int,
                           element_bytes: int) -> int:
    """Bytes one decode-attention call must move: K and V of the context, queries in, outputs out."""
    return 2 * batch * context * kv_heads * head_dim * element_bytes + 2 * batch * heads * head_dim * element_bytes


def predicted_decode_seconds(gpu: GPU, batch: int, context: int, heads: int = 32, kv_heads: int = 8,
                             head_dim: int = 128, element_bytes: int = 2, launch_s: float = LAUNCH_S,
                             block_size: int = SHAPE["block_size"]) -> float:
    """The module docstring's model of one paged decode-attention call on ``gpu``."""
    parts, _ = partition_plan(context, block_size, choose_num_partitions(batch, kv_heads, context, gpu.sm_count))
    moved = decode_attention_bytes(batch, context, heads, kv_heads, head_dim, element_bytes)
    if parts > 1:  # each partition's accumulator, max and sum in float32, written then read back
        moved += 2 * batch * heads * parts * (head_dim + 2) * 4
    flops = 4 * batch * heads * context * head_dim
    active = min(1.0, batch * kv_heads * parts / gpu.sm_count)
    launches = 2 if parts > 1 else 1
    return launches * launch_s + max(flops / gpu.bf16_flops, moved / (gpu.hbm_bandwidth * active))


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
