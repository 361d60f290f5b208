"""Turn logits into tokens: greedy, or temperature with top-k and top-p filtering.

``probabilities`` is the one place where a request's sampling settings shape a distribution;
the sampler draws from it, and the rejection sampler applies it to both the target's and the
draft's logits, so speculation compares the distributions a plain step would sample from.
"""

from __future__ import annotations

import torch

from course_lib.engine.sampling_params import SamplingParams


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution ``sample`` draws from, for logits ``[..., vocab]`` (rows independent).
    Not for greedy params (temperature 0 has no distribution; greedy takes the argmax)."""
    logits = logits.float() / params.temperature
    if params.top_k > 0:
        kth = torch.topk(logits, min(params.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        keep = torch.cumsum(sorted_probs, -1) - sorted_probs < params.top_p  # always keeps the top token
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs * keep)
    return probs


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """One token from a ``[vocab]`` logits row. Greedy breaks ties by the lowest token id."""
    if params.greedy:
        return int(torch.argmax(logits))
    return int(torch.multinomial(probabilities(logits, params).cpu(), 1, generator=generator))
