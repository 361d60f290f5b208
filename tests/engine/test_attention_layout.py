"""The torch backend's decode buckets: row slices when prepare lays decodes out shortest first,
index tensors otherwise; both give each request's own causal attention."""

import random

import torch
import torch.nn.functional as F

from course_lib.engine.attention import build_metadata, paged_attention

BLOCK, HEADS, KV_HEADS, DIM = 4, 6, 2, 8


def _reference(q, kv_cache, query_lens, seq_lens, tables, scale):
    """Each request on its own: gather its tokens, attend causally with repeated KV heads."""
    out, row = [], 0
    for n, length, table in zip(query_lens, seq_lens, tables):
        slots = [table[p // BLOCK] * BLOCK + p % BLOCK for p in range(length)]
        k = kv_cache[0].flatten(0, 1)[slots].repeat_interleave(HEADS // KV_HEADS, 1).transpose(0, 1)
        v = kv_cache[1].flatten(0, 1)[slots].repeat_interleave(HEADS // KV_HEADS, 1).transpose(0, 1)
        allowed = torch.arange(length)[None, :] <= torch.arange(length - n, length)[:, None]
        out.append(F.scaled_dot_product_attention(q[row:row + n].transpose(0, 1), k, v, attn_mask=allowed,
                                                  scale=scale).transpose(0, 1))
        row += n
    return torch.cat(out)


def test_decode_buckets_are_slices_when_sorted_and_attend_like_each_request_alone():
    rng = random.Random(0)
    torch.manual_seed(0)
    kv_cache = torch.randn(2, 200, BLOCK, KV_HEADS, DIM, dtype=torch.float64)
    seq_lens = sorted(rng.randint(1, 40) for _ in range(19)) + [30, 25, 9]  # 19 decodes, then 3 with more tokens
    query_lens = [1] * 19 + [12, 3, 9]
    free = list(range(200))
    rng.shuffle(free)
    tables = [[free.pop() for _ in range(-(-n // BLOCK))] for n in seq_lens]
    for order in ("sorted", "shuffled"):
        index = list(range(len(seq_lens)))
        if order == "shuffled":
            rng.shuffle(index)
        q_lens, s_lens, tabs = ([xs[i] for i in index] for xs in (query_lens, seq_lens, tables))
        slots = [t[p // BLOCK] * BLOCK + p % BLOCK for n, s, t in zip(q_lens, s_lens, tabs) for p in range(s - n, s)]
        meta = build_metadata(slots, q_lens, s_lens, tabs, BLOCK, "cpu")
        assert all(isinstance(b.rows, slice) for b in meta.decodes) == (order == "sorted")
        q = torch.randn(sum(q_lens), HEADS, DIM, dtype=torch.float64)
        expected = _reference(q, kv_cache, q_lens, s_lens, tabs, 0.3)
        torch.testing.assert_close(paged_attention(q, kv_cache, meta, 0.3), expected)
