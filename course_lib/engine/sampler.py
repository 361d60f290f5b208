"""Turn logits into tokens: greedy, or temperature with top-k and top-p filtering."""

from __future__ import annotations

import torch

from course_lib.engine.sampling_params import SamplingParams


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """One token from a ``[vocab]`` logits row. Greedy breaks ties by the lowest token id."""
    if params.greedy:
        return int(torch.argmax(logits))
    logits = logits.float() / params.temperature
    if params.top_k > 0:
        kth = torch.topk(logits, min(params.top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_probs, 0) - sorted_probs < params.top_p  # always keeps the top token
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs * keep)
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))
