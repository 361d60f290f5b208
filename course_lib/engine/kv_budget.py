"""What one paged KV block holds, and how many blocks a memory budget buys.

As in vLLM V1, a draft model's attention layers are KV layers of the same pool: they share the
target's block tables, so block ``b`` holds the target's K/V *and* the draft's for the same
``block_size`` positions, each model's in its own per-layer tensors. A block's bytes are therefore
``block_size x (target bytes per token + draft bytes per token)``, and a fixed budget buys fewer
blocks when a draft model runs. Nothing about the draft's KV lives outside the pool.

``KVCacheBytes`` is what ``LLM.kv_cache_bytes`` reports: the block count and each model's share.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from course_lib.models.llama import LlamaConfig
from course_lib.perf.kv import kv_bytes_per_token


def token_bytes(config: LlamaConfig, kv_dtype: torch.dtype) -> int:
    """KV bytes one token takes in every layer of a model (K and V, all KV heads), in ``kv_dtype``."""
    return int(kv_bytes_per_token(config.num_hidden_layers, config.num_key_value_heads, config.head_dim,
                                  kv_dtype.itemsize))


@dataclass(frozen=True)
class KVCacheBytes:
    """The paged KV pool: ``num_blocks`` blocks of ``block_size`` tokens; per token the target
    stores ``target_token_bytes`` and a draft model ``draft_token_bytes`` (0 without one).
    Byte totals are over all tensor-parallel ranks together."""

    num_blocks: int
    block_size: int
    target_token_bytes: int
    draft_token_bytes: int = 0

    @property
    def block_bytes(self) -> int:
        """One block, both models' layers."""
        return self.block_size * (self.target_token_bytes + self.draft_token_bytes)

    @property
    def target_bytes(self) -> int:
        return self.num_blocks * self.block_size * self.target_token_bytes

    @property
    def draft_bytes(self) -> int:
        return self.num_blocks * self.block_size * self.draft_token_bytes

    @property
    def total_bytes(self) -> int:
        return self.num_blocks * self.block_bytes


def blocks_for_budget(budget_bytes: float, block_size: int, target_token_bytes: int,
                      draft_token_bytes: int = 0) -> int:
    """How many whole blocks holding both models' KV fit in ``budget_bytes`` (0 when none do)."""
    block_bytes = KVCacheBytes(0, block_size, target_token_bytes, draft_token_bytes).block_bytes
    return max(0, int(budget_bytes // block_bytes))
