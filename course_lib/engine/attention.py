"""Paged attention in plain PyTorch: the engine's reference backend (``attention_backend="torch"``).

KV cache of one layer: ``[2, num_blocks, block_size, kv_heads, head_dim]`` (keys, then values).
A request's token at position ``p`` lives in slot ``block_table[p // block_size] * block_size
+ p % block_size``. A step's new tokens from all requests are flattened into one batch;
request ``r`` owns rows ``query_start_loc[r]:query_start_loc[r+1]``, which are the last
positions of its ``seq_lens[r]`` tokens. ``build_metadata`` does the index arithmetic once
per step; every layer then only gathers and attends.

Decoding requests (one new token each) are sorted by context length and attended in small
padded buckets, so a short request never pays for the longest one's padding. Requests with a
few new tokens (a speculative verification: the last token plus k drafts, or a short prefill
chunk) are bucketed the same way, padded to the bucket's longest query with a causal mask.

An fp8 cache (``torch.float8_e4m3fn``, ``LLM(kv_cache_dtype="fp8")``) stores ``x / scale`` rounded
to e4m3 and is read back as ``code * scale`` in the queries' dtype (``course_lib/kv_cache/fp8.py``);
``kv_scales`` is the layer's ``(k_scale, v_scale)``, 1.0 each when not given.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from course_lib.kv_cache.fp8 import dequantize_fp8, is_fp8, quantize_fp8, required_scales

DECODE_BUCKET = 8  # decoding requests per padded attention call
SHORT_QUERY = 8  # requests with 2..SHORT_QUERY new tokens share padded calls too


@dataclass
class DecodeBucket:
    """Decoding requests of similar length: their query rows, block tables (padded) and mask."""

    rows: slice | torch.Tensor  # [B] (a slice when consecutive, as ``prepare`` lays them out)
    block_tables: torch.Tensor  # [B, max_blocks], padded with block 0
    mask: torch.Tensor  # [B, 1, 1, max_blocks * block_size], 0 inside the context, -inf outside


@dataclass
class ShortQueryBucket:
    """Requests with a few new tokens each: query rows ``[B, Q]`` (short ones repeat their last
    row), which of them are real, block tables and a causal mask."""

    rows: torch.Tensor  # [B, Q]
    valid: torch.Tensor  # [B, Q] bool
    block_tables: torch.Tensor  # [B, max_blocks]
    mask: torch.Tensor  # [B, 1, Q, max_blocks * block_size], 0 = may attend, -inf = may not


@dataclass
class PrefillGroup:
    """One request with several new tokens: its rows, its blocks and its causal mask."""

    start: int
    num_queries: int
    block_tables: torch.Tensor  # [1, num_blocks]
    mask: torch.Tensor  # [1, 1, num_queries, num_blocks * block_size], 0 = may attend, -inf = may not


@dataclass
class TorchAttentionMetadata:
    """Where each new token's K/V goes, and which cached tokens each query attends to.
    Every backend's metadata offers the same two methods, which the model's layers call
    (the ``AttentionMetadata`` protocol, ``course_lib/kv_cache/metadata.py``)."""

    slot_mapping: torch.Tensor  # [num_tokens]
    decodes: list[DecodeBucket]
    prefills: list[PrefillGroup]
    short: list[ShortQueryBucket] = field(default_factory=list)

    def write(self, kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              kv_scales: tuple[float, float] | None = None) -> None:
        write_kv(kv_cache, k, v, self.slot_mapping, kv_scales)

    def attend(self, q: torch.Tensor, kv_cache: torch.Tensor, scale: float,
               kv_scales: tuple[float, float] | None = None) -> torch.Tensor:
        return paged_attention(q, kv_cache, self, scale, kv_scales)


def pad_block_tables(tables: list[list[int]], device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """Block tables as one ``[len(tables), longest]`` tensor, padded with block 0 (``[[0]]`` if empty)."""
    width = max((len(t) for t in tables), default=1)
    return torch.tensor([t + [0] * (width - len(t)) for t in tables] or [[0]], dtype=dtype, device=device)


def query_starts(query_lens: list[int]) -> list[int]:
    """Where each request's rows start in the flat batch, and the total at the end."""
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    return starts


def row_index(rows: list[int], device) -> slice | torch.Tensor:
    """``rows`` as an index into the flat batch: a slice when they are one run (as ``prepare``
    lays decodes out), so selecting them is a view in every layer; else an index tensor."""
    if rows == list(range(rows[0], rows[0] + len(rows))):
        return slice(rows[0], rows[-1] + 1)
    return torch.tensor(rows, device=device)


def _additive(allowed: torch.Tensor) -> torch.Tensor:
    """A boolean mask as the float one SDPA adds to the scores (0 or -inf): SDPA would convert a
    boolean mask on every call, that is in every layer; this is once per step."""
    return torch.zeros(allowed.shape, device=allowed.device).masked_fill_(~allowed, float("-inf"))


def build_metadata(slot_mapping: list[int], query_lens: list[int], seq_lens: list[int],
                   block_tables: list[list[int]], block_size: int, device,
                   with_decodes: bool = True) -> TorchAttentionMetadata:
    """Index tensors for one step; ``block_tables[r]`` covers ``seq_lens[r]`` tokens. With
    ``with_decodes=False`` decoding requests get no buckets (another kernel attends them)."""

    starts = query_starts(query_lens)
    decode = sorted((r for r, n in enumerate(query_lens) if n == 1 and with_decodes), key=lambda r: seq_lens[r])
    decodes = []
    for first in range(0, len(decode), DECODE_BUCKET):
        bucket = decode[first:first + DECODE_BUCKET]
        tables = pad_block_tables([block_tables[r] for r in bucket], device)
        lens = torch.tensor([seq_lens[r] for r in bucket], device=device)
        mask = torch.arange(tables.shape[1] * block_size, device=device) < lens[:, None]
        decodes.append(DecodeBucket(row_index([starts[r] for r in bucket], device), tables,
                                    _additive(mask[:, None, None, :])))
    short = sorted((r for r, n in enumerate(query_lens) if 1 < n <= SHORT_QUERY), key=lambda r: seq_lens[r])
    shorts = []
    for first in range(0, len(short), DECODE_BUCKET):
        bucket = short[first:first + DECODE_BUCKET]
        width = max(query_lens[r] for r in bucket)
        offsets = [[min(i, query_lens[r] - 1) for i in range(width)] for r in bucket]
        rows = torch.tensor([[starts[r] + i for i in row] for r, row in zip(bucket, offsets)], device=device)
        query_pos = torch.tensor([[seq_lens[r] - query_lens[r] + i for i in row] for r, row in zip(bucket, offsets)],
                                 device=device)
        valid = torch.tensor([[i < query_lens[r] for i in range(width)] for r in bucket], device=device)
        tables = pad_block_tables([block_tables[r] for r in bucket], device)
        mask = torch.arange(tables.shape[1] * block_size, device=device) <= query_pos[:, :, None]
        shorts.append(ShortQueryBucket(rows, valid, tables, _additive(mask[:, None])))
    prefills = []
    for r, n in enumerate(query_lens):
        if n <= SHORT_QUERY:
            continue
        tables = pad_block_tables([block_tables[r]], device)
        query_pos = torch.arange(seq_lens[r] - n, seq_lens[r], device=device)
        mask = torch.arange(tables.shape[1] * block_size, device=device)[None, :] <= query_pos[:, None]
        prefills.append(PrefillGroup(starts[r], n, tables, _additive(mask[None, None])))
    return TorchAttentionMetadata(
        slot_mapping=torch.tensor(slot_mapping, device=device),
        decodes=decodes,
        prefills=prefills,
        short=shorts,
    )


def write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor,
             kv_scales: tuple[float, float] | None = None) -> None:
    """Store new keys/values ``[N, kv_heads, head_dim]`` at their slots (quantized for an fp8 cache)."""
    if is_fp8(kv_cache):
        k_scale, v_scale = required_scales(kv_scales)
        k, v = quantize_fp8(k, k_scale), quantize_fp8(v, v_scale)
    kv_cache[0].view(-1, *k.shape[1:])[slot_mapping] = k
    kv_cache[1].view(-1, *v.shape[1:])[slot_mapping] = v


def _attend(q, k, v, mask, scale):
    """q [B, Q, h, hd], k/v [B, S, kvh, hd], mask [B, 1, Q, S] -> [B, Q, h, hd]."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=mask.to(q.dtype), scale=scale, enable_gqa=True)
    return out.transpose(1, 2)


def _gather(kv_cache: torch.Tensor, block_tables: torch.Tensor, dtype: torch.dtype,
            kv_scales: tuple[float, float] | None = None):
    """Keys and values ``[B, blocks * block_size, kv_heads, head_dim]`` of whole blocks, in ``dtype``
    (an fp8 cache dequantized). ``index_select`` along the blocks copies each block as one run of
    memory (indexing ``kv_cache[:, tables]`` goes element by element: 1.3-2x slower on a CPU)."""
    blocks = block_tables.flatten()
    shape = (*block_tables.shape[:1], -1, *kv_cache.shape[3:])
    k, v = (kv_cache[i].index_select(0, blocks).view(shape) for i in (0, 1))
    if is_fp8(kv_cache):
        k_scale, v_scale = required_scales(kv_scales)
        k, v = dequantize_fp8(k, k_scale, dtype), dequantize_fp8(v, v_scale, dtype)
    return k, v


def paged_attention(q: torch.Tensor, kv_cache: torch.Tensor, meta: TorchAttentionMetadata, scale: float,
                    kv_scales: tuple[float, float] | None = None) -> torch.Tensor:
    """Causal attention of new queries ``[N, heads, head_dim]`` over each request's cached context."""
    out = torch.empty_like(q)

    def gather(tables):
        return _gather(kv_cache, tables, q.dtype, kv_scales)

    for bucket in meta.decodes:
        k, v = gather(bucket.block_tables)
        # One query per request: the query heads that share a KV head become that head's rows
        # (query head i reads KV head i // group), so SDPA needs no grouped-query expansion.
        grouped = q[bucket.rows].unflatten(1, (k.shape[2], -1))  # [B, kv_heads, group, head_dim]
        attended = F.scaled_dot_product_attention(grouped, k.transpose(1, 2), v.transpose(1, 2),
                                                  attn_mask=bucket.mask.to(q.dtype), scale=scale)
        out[bucket.rows] = attended.flatten(1, 2)
    for bucket in meta.short:
        attended = _attend(q[bucket.rows], *gather(bucket.block_tables), bucket.mask, scale)
        out[bucket.rows[bucket.valid]] = attended[bucket.valid]
    for group in meta.prefills:
        rows = slice(group.start, group.start + group.num_queries)
        out[rows] = _attend(q[rows].unsqueeze(0), *gather(group.block_tables), group.mask, scale)[0]
    return out
