"""Turn logits into tokens, in vLLM V1's order: penalties, then greedy's argmax, or temperature,
min-p, top-k and top-p, then a draw.

``apply_penalties`` changes the logits a request's history makes less (or more) likely; greedy
takes their argmax. ``probabilities`` is the one place where a request's sampling settings shape a
distribution; the sampler draws from it, and the rejection sampler applies it to both the
target's and the draft's logits, so speculation compares the distributions a plain step would
sample from.
"""

from __future__ import annotations

import torch

from course_lib.engine.sampling_params import SamplingParams


def apply_penalties(logits: torch.Tensor, params: SamplingParams, prompt_token_ids: list[int],
                    output_token_ids: list[int], draft_token_ids: list[int] = ()) -> torch.Tensor:
    """Penalised copies of the rows ``logits[i]`` (``[rows, vocab]``). Row ``i`` follows the output
    and the first ``i`` drafts, so the drafts before it count as output (vLLM's rejection sampler).

    Repetition: a token seen in the prompt or that output has its logit divided by
    ``repetition_penalty`` if positive, multiplied if not. Then ``frequency_penalty`` times its count
    in that output, and ``presence_penalty`` if the count is not 0, are subtracted."""
    rows, vocab = logits.shape
    device = logits.device
    dtype = torch.promote_types(logits.dtype, torch.float32)  # float32 at least, as vLLM
    output = torch.tensor(list(output_token_ids), dtype=torch.long)
    counts = torch.bincount(output, minlength=vocab).to(dtype).repeat(rows, 1)
    for i, token in enumerate(draft_token_ids[:rows - 1]):  # row i: the output and drafts[:i]
        counts[i + 1:, token] += 1
    counts = counts.to(device)
    present = counts > 0
    logits = logits.to(dtype)
    if params.repetition_penalty != 1:
        seen = present.clone()
        seen[:, torch.tensor(list(prompt_token_ids), dtype=torch.long, device=device)] = True
        penalty = torch.where(seen, params.repetition_penalty, 1.0).to(dtype)
        logits = torch.where(logits > 0, logits / penalty, logits * penalty)
    return logits - params.frequency_penalty * counts - params.presence_penalty * present.to(dtype)


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution ``sample`` draws from, for logits ``[..., vocab]`` (rows independent), already
    penalised. Not for greedy params (temperature 0 has no distribution; greedy takes the argmax).

    min-p compares each token with the most likely one after temperature, before top-k and top-p."""
    logits = logits.float() / params.temperature
    if params.min_p > 0:
        probs = torch.softmax(logits, dim=-1)
        floor = params.min_p * probs.max(dim=-1, keepdim=True).values
        logits = logits.masked_fill(probs < floor, float("-inf"))
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
    """One token from a ``[vocab]`` logits row (penalised). Greedy breaks ties by the lowest token id."""
    if params.greedy:
        return int(torch.argmax(logits))
    return int(torch.multinomial(probabilities(logits, params).cpu(), 1, generator=generator))
