"""The two calls a model's attention layer makes on a paged KV cache, whatever backend serves it.

Each engine backend (``engine/attention.py``, ``engine/triton_attention.py``,
``engine/cpu_attention.py``) builds one metadata object per step, holding that step's slot
mapping and block tables. A layer then calls ``write`` with its new keys and values and
``attend`` with its queries; it never learns which backend, kernel or layout answered. The model
depends on this protocol only, so the model does not import the engine that runs it.
"""

from __future__ import annotations

from typing import Protocol

import torch


class AttentionMetadata(Protocol):
    """One step's view of the paged KV cache, as a layer uses it.

    Invariant: ``write`` for a step's new tokens comes before ``attend`` in the same layer, so
    every query sees its own token's K/V. ``kv_scales`` is the layer's ``(k_scale, v_scale)``
    for an fp8 cache (``kv_cache/fp8.py``), ignored for any other dtype.
    """

    def write(self, kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              kv_scales: tuple[float, float] | None = None) -> None:
        """Store new keys and values ``[N, kv_heads, head_dim]`` in their slots of ``kv_cache``."""

    def attend(self, q: torch.Tensor, kv_cache: torch.Tensor, scale: float,
               kv_scales: tuple[float, float] | None = None) -> torch.Tensor:
        """Causal attention of queries ``[N, heads, head_dim]`` over each request's cached tokens."""
