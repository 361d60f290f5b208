"""Engine settings, with vLLM's names. Validation errors say which setting to change."""

from __future__ import annotations

from dataclasses import dataclass

PREEMPTION_MODES = ("recompute", "swap")
POLICIES = ("continuous", "static")


@dataclass(frozen=True)
class SchedulerConfig:
    """Limits of one scheduling step, and what to do when KV blocks run out.

    ``long_prefill_token_threshold`` (0 = off) caps the tokens one request may take per step.
    ``policy="static"`` admits new requests only when the whole running batch has finished.
    """

    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    max_model_len: int = 1024
    long_prefill_token_threshold: int = 0
    preemption_mode: str = "recompute"
    policy: str = "continuous"

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}.")
        if self.long_prefill_token_threshold < 0:
            raise ValueError("long_prefill_token_threshold must be 0 (off) or positive.")
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption_mode must be one of {PREEMPTION_MODES}, got {self.preemption_mode!r}.")
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}.")


@dataclass(frozen=True)
class CacheConfig:
    """The paged KV cache: ``num_gpu_blocks`` blocks of ``block_size`` tokens."""

    block_size: int = 16
    num_gpu_blocks: int = 1024
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.num_gpu_blocks < 1:
            raise ValueError("block_size and num_gpu_blocks must be at least 1.")
