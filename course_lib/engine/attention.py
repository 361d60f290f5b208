"""Paged attention in plain PyTorch: the reference backend (Triton kernels plug in beside it).

KV cache of one layer: ``[2, num_blocks, block_size, kv_heads, head_dim]`` (keys, then values).
A request's token at position ``p`` lives in slot ``block_table[p // block_size] * block_size
+ p % block_size``. A step's new tokens from all requests are flattened into one batch;
request ``r`` owns rows ``query_start_loc[r]:query_start_loc[r+1]``, which are the last
positions of its ``seq_lens[r]`` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class AttentionMetadata:
    """Where each new token's K/V goes, and which cached tokens each request attends to."""

    slot_mapping: torch.Tensor  # [num_tokens] slot index for each new token
    query_start_loc: list[int]  # [num_requests + 1] row offsets of each request's new tokens
    seq_lens: list[int]  # [num_requests] tokens in context after this step (cached + new)
    block_tables: torch.Tensor  # [num_requests, max_blocks] physical block ids, padded with 0
    block_size: int

    def query_len(self, r: int) -> int:
        return self.query_start_loc[r + 1] - self.query_start_loc[r]


def write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store new keys/values ``[N, kv_heads, head_dim]`` at their slots."""
    kv_cache[0].view(-1, *k.shape[1:])[slot_mapping] = k
    kv_cache[1].view(-1, *v.shape[1:])[slot_mapping] = v


def _slots(block_tables: torch.Tensor, length: int, block_size: int) -> torch.Tensor:
    """Slot ids ``[R, length]`` of positions 0..length-1 for each row of ``block_tables``."""
    pos = torch.arange(length, device=block_tables.device)
    return block_tables[:, pos // block_size] * block_size + pos % block_size


def _attend(q, k, v, mask, scale):
    """q [B, Q, h, hd], k/v [B, S, kvh, hd], mask [B, Q, S] (True = may attend) -> [B, Q, h, hd]."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=mask.unsqueeze(1), scale=scale, enable_gqa=True)
    return out.transpose(1, 2)


def paged_attention(q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """Causal attention of new queries ``[N, heads, head_dim]`` over each request's cached context.

    Decoding requests (one new token) are attended in one padded batch; requests with
    several new tokens (prefill chunks, speculative drafts) one at a time.
    """
    keys = kv_cache[0].flatten(0, 1)
    values = kv_cache[1].flatten(0, 1)
    out = torch.empty_like(q)
    num_requests = len(meta.seq_lens)
    decode = [r for r in range(num_requests) if meta.query_len(r) == 1]
    if decode:
        rows = torch.tensor([meta.query_start_loc[r] for r in decode], device=q.device)
        lens = torch.tensor([meta.seq_lens[r] for r in decode], device=q.device)
        slots = _slots(meta.block_tables[decode], int(lens.max()), meta.block_size)
        mask = (torch.arange(slots.shape[1], device=q.device) < lens[:, None]).unsqueeze(1)
        out[rows] = _attend(q[rows].unsqueeze(1), keys[slots], values[slots], mask, scale).squeeze(1)
    for r in range(num_requests):
        n = meta.query_len(r)
        if n == 1:
            continue
        start, length = meta.query_start_loc[r], meta.seq_lens[r]
        slots = _slots(meta.block_tables[r:r + 1], length, meta.block_size)
        query_pos = torch.arange(length - n, length, device=q.device)
        mask = (torch.arange(length, device=q.device)[None, :] <= query_pos[:, None]).unsqueeze(0)
        out[start:start + n] = _attend(q[start:start + n].unsqueeze(0), keys[slots], values[slots], mask, scale)[0]
    return out
