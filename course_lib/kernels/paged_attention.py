"""Paged attention kernels: decode (one query per sequence) and prefill chunks.

Cache layout, per layer: ``k_cache`` and ``v_cache`` are ``[num_blocks, block_size, kv_heads,
head_dim]``; request ``r``'s token at position ``p`` lives in block ``block_tables[r, p //
block_size]`` at offset ``p % block_size``. Each program instance walks one request's block
table a KV block at a time and keeps an online softmax (running max, running sum, rescaled
accumulator), so the context is read exactly once and never materialised contiguously.
``block_size`` and ``head_dim`` must be powers of two.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _fold_block(q, k, v, visible, running_max, running_sum, acc):
    """Fold one KV block into an online softmax: q [rows, DIM], k/v [BLOCK, DIM], visible [rows, BLOCK].
    Returns the new running max, running sum and value accumulator (all per query row)."""
    scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2)  # [rows, BLOCK]
    scores = tl.where(visible, scores, float("-inf"))
    new_max = tl.maximum(running_max, tl.max(scores, axis=1))
    new_max = tl.where(new_max == float("-inf"), 0.0, new_max)  # rows that have seen no key yet
    weights = tl.exp(scores - new_max[:, None])
    rescale = tl.exp(running_max - new_max)
    running_sum = running_sum * rescale + tl.sum(weights, axis=1)
    acc = acc * rescale[:, None] + tl.sum(weights[:, :, None] * v[None, :, :], axis=1)
    return new_max, running_sum, acc


@triton.jit
def _decode_kernel(q_ptr, k_ptr, v_ptr, out_ptr, tables_ptr, lens_ptr, scale,
                   stride_qb, stride_qh, stride_kb, stride_ks, stride_kh, stride_tb,
                   GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK: tl.constexpr, DIM: tl.constexpr):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    rows = tl.arange(0, GROUP_PAD)  # the query heads that share this KV head
    row_ok = rows < GROUP
    dims = tl.arange(0, DIM)
    offs = tl.arange(0, BLOCK)
    heads = kv_head * GROUP + rows
    q = tl.load(q_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :], mask=row_ok[:, None], other=0.0)
    q = q.to(tl.float32) * scale
    length = tl.load(lens_ptr + seq)
    running_max = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    running_sum = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, DIM], tl.float32)
    for start in range(0, length, BLOCK):
        block = tl.load(tables_ptr + seq * stride_tb + start // BLOCK).to(tl.int64)  # large pools overflow int32
        tok_ok = start + offs < length
        kv_offsets = block * stride_kb + offs[:, None] * stride_ks + kv_head * stride_kh + dims[None, :]
        k = tl.load(k_ptr + kv_offsets, mask=tok_ok[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_ptr + kv_offsets, mask=tok_ok[:, None], other=0.0).to(tl.float32)
        running_max, running_sum, acc = _fold_block(q, k, v, tok_ok[None, :], running_max, running_sum, acc)
    out = acc / running_sum[:, None]
    tl.store(out_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def _check(q: torch.Tensor, k_cache: torch.Tensor) -> tuple[int, int, int]:
    block_size, kv_heads, dim = k_cache.shape[1:]
    heads = q.shape[1]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads are not a multiple of {kv_heads} KV heads.")
    for name, value in (("block_size", block_size), ("head_dim", dim)):
        if value & (value - 1):
            raise ValueError(f"{name}={value} must be a power of two for the Triton kernels.")
    return block_size, kv_heads, dim


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """q ``[B, heads, head_dim]`` (one query per sequence) over ``seq_lens[b]`` cached tokens -> ``[B, heads, head_dim]``."""
    block_size, kv_heads, dim = _check(q, k_cache)
    q = q.contiguous()
    out = torch.empty_like(q)
    group = q.shape[1] // kv_heads
    tables = block_tables.to(torch.int32).contiguous()
    _decode_kernel[(q.shape[0], kv_heads)](
        q, k_cache, v_cache, out, tables, seq_lens.to(torch.int32).contiguous(), scale,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), tables.stride(0),
        GROUP=group, GROUP_PAD=triton.next_power_of_2(group), BLOCK=block_size, DIM=dim,
    )
    return out


def paged_decode_attention_ref(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """Plain-PyTorch reference: gather each sequence's context, then softmax attention."""
    heads, kv_heads = q.shape[1], k_cache.shape[2]
    block_size = k_cache.shape[1]
    out = torch.empty_like(q)
    for b, length in enumerate(seq_lens.tolist()):
        pos = torch.arange(length, device=q.device)
        blocks = block_tables[b, pos // block_size].long()
        k = k_cache[blocks, pos % block_size].float().repeat_interleave(heads // kv_heads, dim=1)  # [L, H, D]
        v = v_cache[blocks, pos % block_size].float().repeat_interleave(heads // kv_heads, dim=1)
        weights = torch.softmax(torch.einsum("hd,lhd->hl", q[b].float() * scale, k), dim=-1)
        out[b] = torch.einsum("hl,lhd->hd", weights, v).to(q.dtype)
    return out


@triton.jit
def _prefill_kernel(q_ptr, k_ptr, v_ptr, out_ptr, tables_ptr, starts_ptr, lens_ptr, scale,
                    stride_qn, stride_qh, stride_kb, stride_ks, stride_kh, stride_tb,
                    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK: tl.constexpr, DIM: tl.constexpr):
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
                mask=row_ok[:, None], other=0.0).to(tl.float32) * scale
    running_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    running_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DIM], tl.float32)
    last = tl.minimum(length, length - num_queries + (tile + 1) * BLOCK_M)  # keys this tile can see
    for start in range(0, last, BLOCK):
        block = tl.load(tables_ptr + req * stride_tb + start // BLOCK).to(tl.int64)
        key_pos = start + offs
        kv_offsets = block * stride_kb + offs[:, None] * stride_ks + kv_head * stride_kh + dims[None, :]
        k = tl.load(k_ptr + kv_offsets, mask=(key_pos < length)[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_ptr + kv_offsets, mask=(key_pos < length)[:, None], other=0.0).to(tl.float32)
        visible = (key_pos[None, :] <= query_pos[:, None]) & (key_pos[None, :] < length)
        running_max, running_sum, acc = _fold_block(q, k, v, visible, running_max, running_sum, acc)
    out = acc / running_sum[:, None]
    tl.store(out_ptr + (q_start + rows[:, None]) * stride_qn + head * stride_qh + dims[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                            scale: float, block_m: int = 16) -> torch.Tensor:
    """Flat queries ``[N, heads, head_dim]``: request ``r`` owns rows ``query_start_loc[r]:[r+1]``,
    the last positions of its ``seq_lens[r]`` tokens, and attends causally to its cached context."""
    block_size, kv_heads, dim = _check(q, k_cache)
    q = q.contiguous()
    out = torch.empty_like(q)
    starts = query_start_loc.to(torch.int32).contiguous()
    longest = int((starts[1:] - starts[:-1]).max())
    tables = block_tables.to(torch.int32).contiguous()
    grid = (len(seq_lens), q.shape[1], triton.cdiv(longest, block_m))
    _prefill_kernel[grid](
        q, k_cache, v_cache, out, tables, starts, seq_lens.to(torch.int32).contiguous(), scale,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), tables.stride(0),
        GROUP=q.shape[1] // kv_heads, BLOCK_M=block_m, BLOCK=block_size, DIM=dim,
    )
    return out


def paged_prefill_attention_ref(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale, block_m=16):
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
        k = k_cache[blocks, pos % block_size].float().repeat_interleave(heads // kv_heads, dim=1)
        v = v_cache[blocks, pos % block_size].float().repeat_interleave(heads // kv_heads, dim=1)
        scores = torch.einsum("nhd,lhd->hnl", q[rows].float() * scale, k)
        visible = pos[None, :] <= torch.arange(length - n, length, device=q.device)[:, None]
        weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        out[rows] = torch.einsum("hnl,lhd->nhd", weights, v).to(q.dtype)
    return out
