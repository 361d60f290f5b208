"""Paged attention in plain PyTorch: the reference backend (Triton kernels plug in beside it).

KV cache of one layer: ``[2, num_blocks, block_size, kv_heads, head_dim]`` (keys, then values).
A request's token at position ``p`` lives in slot ``block_table[p // block_size] * block_size
+ p % block_size``. A step's new tokens from all requests are flattened into one batch;
request ``r`` owns rows ``query_start_loc[r]:query_start_loc[r+1]``, which are the last
positions of its ``seq_lens[r]`` tokens. ``build_metadata`` does the index arithmetic once
per step; every layer then only gathers and attends.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class PrefillGroup:
    """One request with several new tokens: its rows, the slots of its whole context, its causal mask."""

    start: int
    num_queries: int
    slots: torch.Tensor  # [seq_len]
    mask: torch.Tensor  # [1, 1, num_queries, seq_len], True = may attend


@dataclass
class AttentionMetadata:
    """Where each new token's K/V goes, and which cached tokens each query attends to.

    Decoding requests (one new token each) are attended together as one padded batch.
    """

    slot_mapping: torch.Tensor  # [num_tokens]
    decode_rows: torch.Tensor  # [D] row of each decoding request's query
    decode_slots: torch.Tensor  # [D, max_len] slots of each decoding request's context (padded)
    decode_mask: torch.Tensor  # [D, 1, 1, max_len] True where the slot is inside the context
    prefills: list[PrefillGroup]


def build_metadata(slot_mapping: list[int], query_lens: list[int], seq_lens: list[int],
                   block_tables: list[list[int]], block_size: int, device) -> AttentionMetadata:
    """Index tensors for one step; ``block_tables[r]`` covers ``seq_lens[r]`` tokens."""

    def slots_of(tables: list[list[int]], length: int) -> torch.Tensor:
        width = max(len(t) for t in tables)
        table = torch.tensor([t + [0] * (width - len(t)) for t in tables], device=device)
        pos = torch.arange(length, device=device)
        return table[:, pos // block_size] * block_size + pos % block_size

    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    decode = [r for r, n in enumerate(query_lens) if n == 1]
    if decode:
        lens = torch.tensor([seq_lens[r] for r in decode], device=device)
        decode_slots = slots_of([block_tables[r] for r in decode], int(lens.max()))
        decode_mask = (torch.arange(decode_slots.shape[1], device=device) < lens[:, None])[:, None, None, :]
    else:
        decode_slots = torch.zeros(0, 0, dtype=torch.long, device=device)
        decode_mask = torch.zeros(0, 1, 1, 0, dtype=torch.bool, device=device)
    prefills = []
    for r, n in enumerate(query_lens):
        if n == 1:
            continue
        length = seq_lens[r]
        query_pos = torch.arange(length - n, length, device=device)
        mask = torch.arange(length, device=device)[None, :] <= query_pos[:, None]
        prefills.append(PrefillGroup(starts[r], n, slots_of([block_tables[r]], length)[0], mask[None, None]))
    return AttentionMetadata(
        slot_mapping=torch.tensor(slot_mapping, device=device),
        decode_rows=torch.tensor([starts[r] for r in decode], device=device, dtype=torch.long),
        decode_slots=decode_slots,
        decode_mask=decode_mask,
        prefills=prefills,
    )


def write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store new keys/values ``[N, kv_heads, head_dim]`` at their slots."""
    kv_cache[0].view(-1, *k.shape[1:])[slot_mapping] = k
    kv_cache[1].view(-1, *v.shape[1:])[slot_mapping] = v


def _attend(q, k, v, mask, scale):
    """q [B, Q, h, hd], k/v [B, S, kvh, hd], mask [B, 1, Q, S] -> [B, Q, h, hd]."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=mask, scale=scale, enable_gqa=True)
    return out.transpose(1, 2)


def paged_attention(q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """Causal attention of new queries ``[N, heads, head_dim]`` over each request's cached context."""
    keys = kv_cache[0].flatten(0, 1)
    values = kv_cache[1].flatten(0, 1)
    out = torch.empty_like(q)
    if len(meta.decode_rows):
        rows = meta.decode_rows
        attended = _attend(q[rows].unsqueeze(1), keys[meta.decode_slots], values[meta.decode_slots],
                           meta.decode_mask, scale)
        out[rows] = attended.squeeze(1)
    for group in meta.prefills:
        rows = slice(group.start, group.start + group.num_queries)
        out[rows] = _attend(q[rows].unsqueeze(0), keys[group.slots].unsqueeze(0), values[group.slots].unsqueeze(0),
                            group.mask, scale)[0]
    return out
