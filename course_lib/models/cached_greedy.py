"""Batched greedy decoding with a dense KV cache: equal-length prompts, one token per row per step.

``greedy_batch`` runs the prompts once, then one new token per row per step through the model's
paged-path ``forward`` with :class:`DenseKVCache` as its attention metadata, so each step costs one
token per row instead of re-running the whole sequence (``models/generate.py``'s reference does
that). The accuracy gate (``quant/gate.py``) decodes hundreds of tokens per scheme with it.

``DenseKVCache`` keeps each layer's keys and values as ``[2, B, max_len, kv_heads, head_dim]`` in
the model's dtype. With a layer's ``kv_scales`` set, K and V are rounded through float8 e4m3 on
write (``fake_quantize_fp8``), exactly as ``forward_dense`` rounds them, so an fp8 KV cache is
measured the same way by both paths.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from course_lib.kv_cache.fp8 import fake_quantize_fp8
from course_lib.models.llama import LlamaForCausalLM


class DenseKVCache:
    """Attention metadata (``kv_cache/metadata.py``) for ``rows`` sequences that all hold ``start``
    cached tokens and bring ``length`` new ones each, laid out row after row in the flat batch.

    Invariant: every row's positions ``0 .. start - 1`` are already written, so a query at position
    ``start + i`` attends to ``0 .. start + i``."""

    def __init__(self, rows: int, start: int, length: int) -> None:
        self.rows, self.start, self.length = rows, start, length

    def write(self, kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              kv_scales: tuple[float, float] | None = None) -> None:
        if kv_scales is not None:
            k, v = fake_quantize_fp8(k, kv_scales[0]), fake_quantize_fp8(v, kv_scales[1])
        end = self.start + self.length
        kv_cache[0, :, self.start:end] = k.unflatten(0, (self.rows, self.length))
        kv_cache[1, :, self.start:end] = v.unflatten(0, (self.rows, self.length))

    def attend(self, q: torch.Tensor, kv_cache: torch.Tensor, scale: float,
               kv_scales: tuple[float, float] | None = None) -> torch.Tensor:
        end = self.start + self.length
        q = q.unflatten(0, (self.rows, self.length)).transpose(1, 2)  # [B, heads, T, hd]
        k, v = (kv_cache[i, :, :end].transpose(1, 2) for i in (0, 1))  # [B, kv_heads, end, hd]
        if self.length == 1:  # one new token sees every cached one
            mask = None
        else:  # query i (position start + i) sees keys 0 .. start + i
            mask = torch.ones(self.length, end, dtype=torch.bool, device=q.device).tril(self.start)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
        return out.transpose(1, 2).flatten(0, 1)  # [B * T, heads, hd]


@torch.inference_mode()
def greedy_batch(model: LlamaForCausalLM, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy continuations of equal-length prompts ``[B, P]`` -> ``[B, new_tokens]`` (no EOS stop);
    the same tokens as ``greedy_reference`` on each row, up to floating-point near-ties."""
    rows, length = prompts.shape
    attn = model.model.layers[0].self_attn
    dtype = model.model.embed_tokens.weight.dtype
    caches = [torch.empty(2, rows, length + new_tokens, attn.num_kv_heads, attn.head_dim, dtype=dtype,
                          device=prompts.device) for _ in model.model.layers]
    step_ids, start, out = prompts, 0, []
    for _ in range(new_tokens):
        width = step_ids.shape[1]
        positions = torch.arange(start, start + width, device=prompts.device).repeat(rows)
        last = torch.arange(rows, device=prompts.device) * width + width - 1
        logits = model.forward(step_ids.flatten(), positions, caches, DenseKVCache(rows, start, width), last)
        step_ids = logits.argmax(-1, keepdim=True)
        out.append(step_ids)
        start += width
    return torch.cat(out, dim=1)
