"""Rejection sampling for speculative decoding (Leviathan et al. 2023; vLLM's rejection sampler).

The target scored the last verified token and ``j`` drafts in one pass, so it has ``j + 1``
distributions ``p_0 .. p_j``. Draft ``x_i`` came from the draft's ``q_i``. Walk the drafts in
order: accept ``x_i`` with probability ``min(1, p_i(x_i) / q_i(x_i))``; at the first rejection
emit a token from ``max(0, p_i - q_i)`` normalised and stop; if all ``j`` pass, emit a bonus
token from ``p_j``. Each emitted token is then distributed exactly as ``p``: speculation never
changes what the engine samples, only how many target steps it takes.

``p`` and ``q`` both go through the request's temperature, min-p, top-k and top-p
(``sampler.probabilities``); the target's rows come already penalised, row ``i`` counting drafts
``x_0 .. x_{i-1}`` as output (``step_sampler``), as vLLM's rejection sampler does.
A proposer without a distribution (n-gram) is a point mass, ``q_i(x_i) = 1``: accept with
probability ``p_i(x_i)``, and on rejection sample ``p_i`` with ``x_i`` removed. Greedy requests
need no randomness: accept while the draft equals the target's argmax, then emit the argmax.
"""

from __future__ import annotations

import torch

from course_lib.engine.sampler import probabilities
from course_lib.engine.sampling_params import SamplingParams


def _normalised(probs: torch.Tensor) -> torch.Tensor:
    return probs / probs.sum(-1, keepdim=True)


def _draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def rejection_sample(target_logits: torch.Tensor, draft_token_ids: list[int], draft_probs: torch.Tensor | None,
                     params: SamplingParams, generator: torch.Generator | None = None) -> tuple[list[int], int]:
    """Tokens to emit (1 to ``j + 1``) and how many drafts were accepted.

    ``target_logits``: ``[j + 1, vocab]``; ``draft_probs``: ``[j, vocab]`` already processed by
    the same settings, or None for a point-mass proposer.
    """
    j = len(draft_token_ids)
    if params.greedy:
        best = target_logits.argmax(-1).tolist()
        accepted = 0
        while accepted < j and draft_token_ids[accepted] == best[accepted]:
            accepted += 1
        return draft_token_ids[:accepted] + [best[accepted]], accepted
    p = _normalised(probabilities(target_logits, params).double().cpu())
    q = None if draft_probs is None else draft_probs.double().cpu()
    uniforms = torch.rand(j, generator=generator, dtype=torch.float64)
    for i, x in enumerate(draft_token_ids):
        q_x = 1.0 if q is None else float(q[i, x])
        if uniforms[i] * q_x < p[i, x]:  # u < p/q, without dividing by a q of 0
            continue
        if q is None:
            residual = p[i].clone()
            residual[x] = 0
        else:
            residual = (p[i] - q[i]).clamp_min(0)
        if float(residual.sum()) <= 0:  # p == q up to rounding: rejection had probability ~0
            residual = p[i]
        return draft_token_ids[:i] + [_draw(residual, generator)], i
    return draft_token_ids + [_draw(p[j], generator)], j
