"""How to sample a request's output (the fields and defaults of vLLM's ``SamplingParams``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    """``temperature=0`` means greedy. ``top_k <= 0`` and ``top_p=1`` disable those filters.
    ``n`` samples share the prompt's KV blocks. ``seed`` makes sampling reproducible."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 16
    ignore_eos: bool = False
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}.")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}; ask for one or more tokens.")
        if self.temperature < 0:
            raise ValueError(f"temperature must be 0 (greedy) or more, got {self.temperature}.")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
