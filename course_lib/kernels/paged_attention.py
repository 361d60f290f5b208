"""Paged attention kernels: decode (one query per sequence) and prefill chunks.

Cache layout, per layer: ``k_cache`` and ``v_cache`` are ``[num_blocks, block_size, kv_heads,
head_dim]``; request ``r``'s token at position ``p`` lives in block ``block_tables[r, p //
block_size]`` at offset ``p % block_size``. Each program instance walks one request's block
table a KV block at a time and keeps an online softmax (running max, running sum, rescaled
accumulator), so the context is read exactly once and never materialised contiguously.
``block_size`` and ``head_dim`` must be powers of two.

An fp8 cache (``torch.float8_e4m3fn``, ``kv_cache_dtype="fp8"``) is read as its raw bytes and
decoded in registers (``_e4m3_to_f32``, exact integer bit operations, so it compiles for sm_80,
which has no fp8 conversions, as for sm_89 and later), times ``k_scale`` / ``v_scale``, cast to the
queries' dtype: the values the PyTorch backend's dequantize gives, and from there the same kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from course_lib.perf.attention_roofline import choose_num_partitions, partition_plan
from course_lib.kv_cache.fp8 import dequantize_fp8, is_fp8


@triton.jit
def _e4m3_to_f32(byte):
    """float8 e4m3fn codes (uint8) -> float32, exactly. Normal codes are rebuilt bit by bit (the
    exponent's bias 7 becomes float32's 127, the 3 mantissa bits the top 3 of 23); subnormals
    (exponent 0) are m * 2^-9. The NaN codes (0x7F, 0xFF) never occur: writes saturate at +-448."""
    bits = byte.to(tl.uint32)
    sign = (bits & 0x80) << 24
    exponent = (bits >> 3) & 0xF
    mantissa = bits & 0x7
    normal = (sign | ((exponent + 120) << 23) | (mantissa << 20)).to(tl.float32, bitcast=True)
    subnormal = mantissa.to(tl.float32) * 0.001953125
    subnormal = tl.where(sign != 0, -subnormal, subnormal)
    return tl.where(exponent == 0, subnormal, normal)


@triton.jit
def _load_kv(ptr, offsets, mask, kv_scale, OUT_TYPE: tl.constexpr, FP8: tl.constexpr):
    """A K or V tile from the cache: as stored, or (``FP8``) bytes decoded, scaled and cast to
    ``OUT_TYPE``; masked entries are 0."""
    if FP8:
        codes = tl.load(ptr + offsets, mask=mask, other=0)
        return (_e4m3_to_f32(codes) * kv_scale).to(OUT_TYPE)
    else:
        return tl.load(ptr + offsets, mask=mask, other=0.0)


@triton.jit
def _fold_block(q, k, v, visible, running_max, running_sum, acc, USE_DOT: tl.constexpr = False,
                PRECISION: tl.constexpr = "tf32x3"):
    """Fold one KV block into an online softmax: q [rows, DIM] (already scaled), k/v [BLOCK, DIM],
    visible [rows, BLOCK]. Returns the new running max, running sum and value accumulator (all per
    query row, float32). With ``USE_DOT`` (rows, BLOCK and DIM all 16 or more) both products run
    on tensor cores: q, k and v in the cache's dtype, the softmax weights cast to it for P x V,
    float32 accumulation (as FlashAttention does); otherwise broadcast multiply-adds in float32,
    which materialise a [rows, BLOCK, DIM] tile and suit only small tiles. ``PRECISION`` is tl.dot's
    for float32 inputs: "tf32x3" (three TF32 tensor-core products, about float32's accuracy;
    Triton's default, TF32, would round the inputs to 10 mantissa bits, and "ieee" spills on
    sm_100); fp16 and bf16 inputs ignore it."""
    if USE_DOT:
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # [rows, BLOCK], float32
    else:
        scores = tl.sum(q.to(tl.float32)[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)
    scores = tl.where(visible, scores, float("-inf"))
    new_max = tl.maximum(running_max, tl.max(scores, axis=1))
    new_max = tl.where(new_max == float("-inf"), 0.0, new_max)  # rows that have seen no key yet
    weights = tl.exp(scores - new_max[:, None])
    rescale = tl.exp(running_max - new_max)
    running_sum = running_sum * rescale + tl.sum(weights, axis=1)
    if USE_DOT:
        acc = acc * rescale[:, None] + tl.dot(weights.to(v.dtype), v, input_precision=PRECISION)
    else:
        acc = acc * rescale[:, None] + tl.sum(weights[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
    return new_max, running_sum, acc


@triton.jit
def _decode_kernel(q_ptr, k_ptr, v_ptr, out_ptr, part_max_ptr, part_sum_ptr, tables_ptr, lens_ptr, scale,
                   partition_tokens, stride_qb, stride_qh, stride_kb, stride_ks, stride_kh, stride_tb,
                   stride_ob, stride_oh, stride_op, stride_mb, stride_mh, k_scale, v_scale,
                   GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK: tl.constexpr, DIM: tl.constexpr,
                   SPLIT: tl.constexpr, FP8: tl.constexpr = False):
    """One program per (sequence, KV head, partition of ``partition_tokens`` context tokens, a
    multiple of BLOCK). Without ``SPLIT`` there is one partition and the program writes the
    normalised output; with it, the partition's softmax state (max and sum per query head, and the
    unnormalised accumulator), which ``_reduce_partitions_kernel`` combines. A partition past the
    sequence's end stores max -inf, sum 0 and a zero accumulator."""
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    rows = tl.arange(0, GROUP_PAD)  # the query heads that share this KV head
    row_ok = rows < GROUP
    dims = tl.arange(0, DIM)
    offs = tl.arange(0, BLOCK)
    heads = kv_head * GROUP + rows
    q = tl.load(q_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :], mask=row_ok[:, None], other=0.0)
    q = q.to(tl.float32) * scale
    length = tl.load(lens_ptr + seq)
    first = part * partition_tokens
    last = tl.minimum(length, first + partition_tokens)
    running_max = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    running_sum = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, DIM], tl.float32)
    for start in range(first, last, BLOCK):
        block = tl.load(tables_ptr + seq * stride_tb + start // BLOCK).to(tl.int64)  # large pools overflow int32
        tok_ok = start + offs < last
        kv_offsets = block * stride_kb + offs[:, None] * stride_ks + kv_head * stride_kh + dims[None, :]
        k = _load_kv(k_ptr, kv_offsets, tok_ok[:, None], k_scale, q_ptr.dtype.element_ty, FP8)
        v = _load_kv(v_ptr, kv_offsets, tok_ok[:, None], v_scale, q_ptr.dtype.element_ty, FP8)
        running_max, running_sum, acc = _fold_block(q, k, v, tok_ok[None, :], running_max, running_sum, acc)
    if SPLIT:
        tl.store(out_ptr + seq * stride_ob + heads[:, None] * stride_oh + part * stride_op + dims[None, :], acc,
                 mask=row_ok[:, None])
        state = seq * stride_mb + heads * stride_mh + part
        tl.store(part_max_ptr + state, running_max, mask=row_ok)
        tl.store(part_sum_ptr + state, running_sum, mask=row_ok)
    else:
        tl.store(out_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :],
                 (acc / running_sum[:, None]).to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _reduce_partitions_kernel(part_out_ptr, part_max_ptr, part_sum_ptr, out_ptr, num_partitions,
                              stride_pb, stride_ph, stride_pp, stride_mb, stride_mh, stride_qb, stride_qh,
                              PARTS: tl.constexpr, DIM: tl.constexpr):
    """One program per (sequence, query head): rescale every partition's state to the largest
    max and combine, out = sum_i e^(m_i - m) acc_i / sum_i e^(m_i - m) s_i. Partitions past the
    sequence's end (max -inf) weigh 0; the first partition is never empty."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    parts = tl.arange(0, PARTS)
    part_ok = parts < num_partitions
    dims = tl.arange(0, DIM)
    state = seq * stride_mb + head * stride_mh + parts
    maxes = tl.load(part_max_ptr + state, mask=part_ok, other=float("-inf"))
    sums = tl.load(part_sum_ptr + state, mask=part_ok, other=0.0)
    weights = tl.exp(maxes - tl.max(maxes, axis=0))
    accs = tl.load(part_out_ptr + seq * stride_pb + head * stride_ph + parts[:, None] * stride_pp + dims[None, :],
                   mask=part_ok[:, None], other=0.0)
    out = tl.sum(weights[:, None] * accs, axis=0) / tl.sum(weights * sums, axis=0)
    tl.store(out_ptr + seq * stride_qb + head * stride_qh + dims, out.to(out_ptr.dtype.element_ty))


def _check(q: torch.Tensor, k_cache: torch.Tensor) -> tuple[int, int, int]:
    block_size, kv_heads, dim = k_cache.shape[1:]
    heads = q.shape[1]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads are not a multiple of {kv_heads} KV heads.")
    for name, value in (("block_size", block_size), ("head_dim", dim)):
        if value & (value - 1):
            raise ValueError(f"{name}={value} must be a power of two for the Triton kernels.")
    return block_size, kv_heads, dim


TILE_PER_WARP = 1024  # fp32 elements of the [heads, BLOCK, DIM] product tile per warp: 32 per thread


def decode_constants(group: int, block_size: int, head_dim: int, split: bool = False, fp8: bool = False) -> dict:
    """The decode kernel's constexprs for ``group`` query heads per KV head, and its warps: the
    broadcast products hold a [GROUP_PAD, BLOCK, DIM] float32 tile across the program's threads,
    so warps grow with the tile (4 to 16, ``TILE_PER_WARP`` elements each), keeping every thread's
    share of it within its registers. ``kernels.resources`` checks this, without spills, at
    16-token blocks (vLLM's default); bigger blocks with GQA 8 at head_dim 128 would spill.
    ``fp8``: the cache holds e4m3 bytes (see the module docstring)."""
    group_pad = triton.next_power_of_2(group)
    warps = group_pad * block_size * head_dim // TILE_PER_WARP
    return dict(GROUP=group, GROUP_PAD=group_pad, BLOCK=block_size, DIM=head_dim, SPLIT=split, FP8=fp8,
                num_warps=min(16, max(4, triton.next_power_of_2(warps))))


def _cache_bytes(k_cache: torch.Tensor, v_cache: torch.Tensor):
    """The caches as the kernels read them, and whether they are fp8 (then viewed as uint8 bytes)."""
    if is_fp8(k_cache) != is_fp8(v_cache):
        raise ValueError(f"k_cache is {k_cache.dtype} and v_cache {v_cache.dtype}: both fp8 or neither.")
    if is_fp8(k_cache):
        return k_cache.view(torch.uint8), v_cache.view(torch.uint8), True
    return k_cache, v_cache, False


def reduce_constants(num_partitions: int, head_dim: int) -> dict:
    """The reduction's constexprs: a tile of ``num_partitions`` rounded up to a power of two."""
    return dict(PARTS=triton.next_power_of_2(num_partitions), DIM=head_dim)


def _sm_count(device: torch.device) -> int:
    """The device's SM count; on a CPU (the interpreter) the H100's 132, so choices match a GPU's."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                           num_partitions: int | None = None, max_seq_len: int | None = None,
                           k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """q ``[B, heads, head_dim]`` (one query per sequence) over ``seq_lens[b]`` cached tokens -> ``[B, heads, head_dim]``.

    Each sequence's context is split into ``num_partitions`` pieces (default:
    ``choose_num_partitions`` for this device and the longest sequence) processed by separate
    programs and combined by a second kernel; 1 runs the single-pass kernel. Pass ``max_seq_len``
    (the longest of ``seq_lens``) when the caller knows it: reading it from a GPU tensor waits for
    the GPU on every call. An fp8 cache is read with ``k_scale`` / ``v_scale`` (ignored otherwise)."""
    block_size, kv_heads, dim = _check(q, k_cache)
    k_cache, v_cache, fp8 = _cache_bytes(k_cache, v_cache)
    q = q.contiguous()
    out = torch.empty_like(q)
    batch, heads = q.shape[:2]
    group = heads // kv_heads
    tables = block_tables.to(torch.int32).contiguous()
    lens = seq_lens.to(torch.int32).contiguous()
    longest = max_seq_len if max_seq_len is not None else (int(lens.max()) if batch else 0)
    parts = num_partitions or choose_num_partitions(batch, kv_heads, longest, _sm_count(q.device))
    parts, partition_tokens = partition_plan(longest, block_size, parts)
    strides = (q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), tables.stride(0))
    if parts == 1:
        _decode_kernel[(batch, kv_heads, 1)](q, k_cache, v_cache, out, out, out, tables, lens, scale,
                                             max(longest, 1), *strides, 0, 0, 0, 0, 0, k_scale, v_scale,
                                             **decode_constants(group, block_size, dim, fp8=fp8))
        return out
    part_out = torch.empty(batch, heads, parts, dim, dtype=torch.float32, device=q.device)
    part_max = torch.empty(batch, heads, parts, dtype=torch.float32, device=q.device)
    part_sum = torch.empty_like(part_max)
    _decode_kernel[(batch, kv_heads, parts)](q, k_cache, v_cache, part_out, part_max, part_sum, tables, lens, scale,
                                             partition_tokens, *strides, *part_out.stride()[:3],
                                             *part_max.stride()[:2], k_scale, v_scale,
                                             **decode_constants(group, block_size, dim, True, fp8))
    _reduce_partitions_kernel[(batch, heads)](part_out, part_max, part_sum, out, parts, *part_out.stride()[:3],
                                              *part_max.stride()[:2], q.stride(0), q.stride(1),
                                              **reduce_constants(parts, dim))
    return out


def _context(cache: torch.Tensor, blocks: torch.Tensor, offsets: torch.Tensor, kv_scale: float,
             dtype: torch.dtype) -> torch.Tensor:
    """Cached rows in float32 (an fp8 cache dequantized to ``dtype`` first, as the kernels do)."""
    rows = cache[blocks, offsets]
    return (dequantize_fp8(rows, kv_scale, dtype) if is_fp8(cache) else rows).float()


def paged_decode_attention_ref(q, k_cache, v_cache, block_tables, seq_lens, scale, k_scale=1.0, v_scale=1.0):
    """Plain-PyTorch reference: gather each sequence's context, then softmax attention."""
    heads, kv_heads = q.shape[1], k_cache.shape[2]
    block_size = k_cache.shape[1]
    out = torch.empty_like(q)
    for b, length in enumerate(seq_lens.tolist()):
        pos = torch.arange(length, device=q.device)
        blocks = block_tables[b, pos // block_size].long()
        k = _context(k_cache, blocks, pos % block_size, k_scale, q.dtype).repeat_interleave(heads // kv_heads, dim=1)
        v = _context(v_cache, blocks, pos % block_size, v_scale, q.dtype).repeat_interleave(heads // kv_heads, dim=1)
        weights = torch.softmax(torch.einsum("hd,lhd->hl", q[b].float() * scale, k), dim=-1)  # k: [L, H, D]
        out[b] = torch.einsum("hl,lhd->hd", weights, v).to(q.dtype)
    return out


@triton.jit
def _prefill_kernel(q_ptr, k_ptr, v_ptr, out_ptr, tables_ptr, starts_ptr, lens_ptr, scale,
                    stride_qn, stride_qh, stride_kb, stride_ks, stride_kh, stride_tb, k_scale, v_scale,
                    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK: tl.constexpr, DIM: tl.constexpr,
                    USE_DOT: tl.constexpr, PRECISION: tl.constexpr, FP8: tl.constexpr = False):
    req = tl.program_id(0)
    head = tl.program_id(1)
    tile = tl.program_id(2)
    q_start = tl.load(starts_ptr + req)
    num_queries = tl.load(starts_ptr + req + 1) - q_start
    if tile * BLOCK_M >= num_queries:
        return
    length = tl.load(lens_ptr + req)
    kv_head = head // GROUP
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < num_queries
    query_pos = length - num_queries + rows  # each query sees keys up to its own position
    dims = tl.arange(0, DIM)
    offs = tl.arange(0, BLOCK)
    q = tl.load(q_ptr + (q_start + rows[:, None]) * stride_qn + head * stride_qh + dims[None, :],
                mask=row_ok[:, None], other=0.0)
    if USE_DOT:  # scaled once, back in the cache's dtype for the tensor cores
        q = (q.to(tl.float32) * scale).to(q.dtype)
    else:
        q = q.to(tl.float32) * scale
    running_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    running_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DIM], tl.float32)
    last = tl.minimum(length, length - num_queries + (tile + 1) * BLOCK_M)  # keys this tile can see
    for start in range(0, last, BLOCK):
        block = tl.load(tables_ptr + req * stride_tb + start // BLOCK).to(tl.int64)
        key_pos = start + offs
        kv_offsets = block * stride_kb + offs[:, None] * stride_ks + kv_head * stride_kh + dims[None, :]
        k = _load_kv(k_ptr, kv_offsets, (key_pos < length)[:, None], k_scale, q_ptr.dtype.element_ty, FP8)
        v = _load_kv(v_ptr, kv_offsets, (key_pos < length)[:, None], v_scale, q_ptr.dtype.element_ty, FP8)
        visible = (key_pos[None, :] <= query_pos[:, None]) & (key_pos[None, :] < length)
        running_max, running_sum, acc = _fold_block(q, k, v, visible, running_max, running_sum, acc, USE_DOT,
                                                    PRECISION)
    out = acc / running_sum[:, None]
    tl.store(out_ptr + (q_start + rows[:, None]) * stride_qn + head * stride_qh + dims[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def prefill_constants(group: int, block_size: int, head_dim: int, block_m: int = 16,
                      dtype: torch.dtype | None = None, fp8: bool = False) -> dict:
    """The prefill kernel's constexprs: ``block_m`` queries per program, and tensor cores (``tl.dot``)
    when every side of both products is 16 or more. Triton's interpreter (a CPU without a GPU)
    multiplies bfloat16's raw bits in ``tl.dot``, so there bfloat16 takes the broadcast path.
    float32 products keep about float32's accuracy (``PRECISION`` "tf32x3"), not TF32's.
    ``fp8``: the cache holds e4m3 bytes, decoded to the queries' dtype before the products."""
    interpreted_bf16 = dtype == torch.bfloat16 and isinstance(_prefill_kernel, InterpretedFunction)
    return dict(GROUP=group, BLOCK_M=block_m, BLOCK=block_size, DIM=head_dim,
                USE_DOT=min(block_m, block_size, head_dim) >= 16 and not interpreted_bf16, PRECISION="tf32x3",
                FP8=fp8)


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                            scale: float, block_m: int = 16, max_query_len: int | None = None,
                            k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """Flat queries ``[N, heads, head_dim]``: request ``r`` owns rows ``query_start_loc[r]:[r+1]``,
    the last positions of its ``seq_lens[r]`` tokens, and attends causally to its cached context.
    An fp8 cache is read with ``k_scale`` / ``v_scale`` (ignored otherwise)."""
    block_size, kv_heads, dim = _check(q, k_cache)
    k_cache, v_cache, fp8 = _cache_bytes(k_cache, v_cache)
    q = q.contiguous()
    out = torch.empty_like(q)
    starts = query_start_loc.to(torch.int32).contiguous()
    longest = max_query_len if max_query_len is not None else int((starts[1:] - starts[:-1]).max())
    tables = block_tables.to(torch.int32).contiguous()
    grid = (len(seq_lens), q.shape[1], triton.cdiv(longest, block_m))
    _prefill_kernel[grid](
        q, k_cache, v_cache, out, tables, starts, seq_lens.to(torch.int32).contiguous(), scale,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), tables.stride(0),
        k_scale, v_scale, **prefill_constants(q.shape[1] // kv_heads, block_size, dim, block_m, q.dtype, fp8),
    )
    return out


def paged_prefill_attention_ref(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale, block_m=16,
                                k_scale=1.0, v_scale=1.0):
    """Plain-PyTorch reference of ``paged_prefill_attention`` (``block_m`` is ignored)."""
    heads, kv_heads = q.shape[1], k_cache.shape[2]
    block_size = k_cache.shape[1]
    out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    for r, length in enumerate(seq_lens.tolist()):
        rows = slice(starts[r], starts[r + 1])
        n = starts[r + 1] - starts[r]
        pos = torch.arange(length, device=q.device)
        blocks = block_tables[r, pos // block_size].long()
        k = _context(k_cache, blocks, pos % block_size, k_scale, q.dtype).repeat_interleave(heads // kv_heads, dim=1)
        v = _context(v_cache, blocks, pos % block_size, v_scale, q.dtype).repeat_interleave(heads // kv_heads, dim=1)
        scores = torch.einsum("nhd,lhd->hnl", q[rows].float() * scale, k)
        visible = pos[None, :] <= torch.arange(length - n, length, device=q.device)[:, None]
        weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        out[rows] = torch.einsum("hnl,lhd->nhd", weights, v).to(q.dtype)
    return out
