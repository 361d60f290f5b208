"""Engine settings, with vLLM's names. Validation errors say which setting to change."""

from __future__ import annotations

from dataclasses import dataclass

PREEMPTION_MODES = ("recompute", "swap")
POLICIES = ("continuous", "fcfs", "static", "priority")  # "fcfs" is vLLM's name for "continuous"


@dataclass(frozen=True)
class SchedulerConfig:
    """Limits of one scheduling step, and what to do when KV blocks run out.

    ``long_prefill_token_threshold`` (0 = off) caps the tokens one request may take per step.
    ``policy``: "continuous" (or vLLM's "fcfs") admits in arrival order whenever there is room;
    "priority" orders the waiting queue and preemption by each request's ``priority`` (lower
    first), as vLLM's ``scheduling_policy="priority"``; "static" admits new requests only when
    the whole running batch has finished.
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


SPEC_METHODS = ("ngram", "draft_model")
_SPEC_KEYS = ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "model")


@dataclass(frozen=True)
class SpeculativeConfig:
    """vLLM's ``speculative_config``: who proposes drafts and how many per step.

    ``method="ngram"`` looks the last ``prompt_lookup_max`` .. ``prompt_lookup_min`` tokens up
    earlier in the request (both default to 5 when neither is given, and to each other when one
    is); ``method="draft_model"`` runs ``model`` (a shipped name, a folder or a model object with
    the target's vocabulary; an object is moved to the engine's device and dtype in place). ``num_speculative_tokens`` (k) drafts cost k extra budget tokens.
    """

    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    model: object = None

    def __post_init__(self) -> None:
        if self.method not in SPEC_METHODS:
            raise ValueError(f"speculative_config method must be one of {SPEC_METHODS}, got {self.method!r}.")
        k = self.num_speculative_tokens
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"speculative_config num_speculative_tokens must be a positive int, got {k!r}; "
                             "use 1 to 8 drafts per step (or drop speculative_config to turn speculation off).")
        if self.method == "ngram":
            if self.model is not None:
                raise ValueError("speculative_config method='ngram' takes no 'model'; drop it, or use "
                                 "method='draft_model'.")
            low, high = self.prompt_lookup_min, self.prompt_lookup_max
            if low is None and high is None:
                low = high = 5
            low, high = (high if low is None else low), (low if high is None else high)
            if not (isinstance(low, int) and isinstance(high, int)) or low < 1 or high < low:
                raise ValueError(f"speculative_config needs 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                                 f"{self.prompt_lookup_min!r} and {self.prompt_lookup_max!r}.")
            object.__setattr__(self, "prompt_lookup_min", low)
            object.__setattr__(self, "prompt_lookup_max", high)
        else:
            if self.model is None:
                raise ValueError("speculative_config method='draft_model' needs 'model': a shipped draft such as "
                                 "'tiny-llama-draft', a checkpoint folder, or a model object.")
            if self.prompt_lookup_min is not None or self.prompt_lookup_max is not None:
                raise ValueError("prompt_lookup_min/prompt_lookup_max belong to method='ngram'; drop them for "
                                 "method='draft_model'.")

    @classmethod
    def from_dict(cls, settings: "dict | SpeculativeConfig") -> "SpeculativeConfig":
        """Validate a user's dict; a ``model`` without ``method`` means ``draft_model`` (as in vLLM)."""
        if isinstance(settings, cls):
            return settings
        if not isinstance(settings, dict):
            raise TypeError(f"speculative_config must be a dict, got {type(settings).__name__}.")
        unknown = sorted(set(settings) - set(_SPEC_KEYS))
        if unknown:
            raise ValueError(f"speculative_config has unknown keys {unknown}; the known keys are {list(_SPEC_KEYS)}.")
        settings = dict(settings)
        if "method" not in settings:
            if settings.get("model") is None:
                raise ValueError("speculative_config needs 'method' ('ngram' or 'draft_model').")
            settings["method"] = "draft_model"
        if "num_speculative_tokens" not in settings:
            raise ValueError("speculative_config needs 'num_speculative_tokens', the drafts per step (e.g. 4).")
        return cls(**settings)
