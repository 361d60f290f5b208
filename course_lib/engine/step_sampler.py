"""One step's logits rows -> each request's new tokens (and, when asked, their log-probabilities).

Row order is ``ModelInput.sampling`` order: one row per request, or ``j + 1`` rows for a request
verifying ``j`` drafts (row ``i`` predicts its ``i``-th new token). Per request:
  * ``min_tokens``: while fewer than ``min_tokens`` tokens would precede a row's token, the EOS
    ids and ``stop_token_ids`` get logit -inf in that row (vLLM's min-tokens logits processor);
  * penalties (``sampler.apply_penalties``), row ``i`` counting the drafts before it as output;
  * greedy rows take the argmax (ties to the lowest id), all in one batched call; sampled rows
    draw from ``sampler.probabilities``; rows with drafts go through the rejection sampler;
  * ``logprobs=k`` (-1: all): for each emitted token, the log-softmax of the row's *raw* logits (before the
    min-tokens mask, penalties, temperature and filters: vLLM's default ``raw_logprobs``) for the sampled
    token and the k most likely ones, with their 1-based ranks.
"""

from __future__ import annotations

import torch

from course_lib.engine.outputs import Logprob
from course_lib.engine.rejection_sampler import rejection_sample
from course_lib.engine.sampler import apply_penalties, sample

TokenLogprobs = dict[int, Logprob]  # one generated token's entry: sampled token first, then the top k


def _mask_stop_tokens(logits: torch.Tensor, step, drafts_of: list[list[int]], first_rows: list[int]) -> torch.Tensor:
    """``logits`` with stop ids at -inf in every row that comes before a request's ``min_tokens``."""
    masked = None
    for request, first, drafts in zip(step.sampling, first_rows, drafts_of):
        short = request.sampling_params.min_tokens - len(request.output_token_ids)
        if short <= 0 or not request.all_stop_token_ids:
            continue
        masked = logits.clone() if masked is None else masked
        rows = torch.arange(first, first + min(short, len(drafts) + 1), device=logits.device)
        ids = torch.tensor(sorted(request.all_stop_token_ids), device=logits.device)
        masked[rows[:, None], ids] = float("-inf")
    return logits if masked is None else masked


def _penalize(logits: torch.Tensor, step, drafts_of: list[list[int]], first_rows: list[int]) -> torch.Tensor:
    """``logits`` with each penalised request's rows (its token and its drafts') penalised."""
    penalised = None
    for request, first, drafts in zip(step.sampling, first_rows, drafts_of):
        params = request.sampling_params
        if not params.has_penalties:
            continue
        if penalised is None:  # a copy in float32 at least, as vLLM penalises
            penalised = logits.to(torch.promote_types(logits.dtype, torch.float32), copy=True)
        rows = slice(first, first + len(drafts) + 1)
        penalised[rows] = apply_penalties(logits[rows], params, request.prompt_token_ids,
                                          request.output_token_ids, drafts)
    return logits if penalised is None else penalised


def token_logprobs(raw_logits: torch.Tensor, token_ids: list[int], k: int) -> list[TokenLogprobs]:
    """For rows ``raw_logits[i]`` and the tokens emitted from them: the sampled token's and the top
    ``k`` tokens' log-probabilities and ranks (``decoded_token`` is filled in by ``LLM``)."""
    logprobs = torch.log_softmax(raw_logits[:len(token_ids)].float(), dim=-1).cpu()
    k = logprobs.shape[-1] if k == -1 else k  # -1: the whole vocabulary
    top = torch.topk(logprobs, k, dim=-1) if k else None
    entries = []
    for i, token in enumerate(token_ids):
        row = logprobs[i]
        chosen = float(row[token])
        entry = {token: Logprob(chosen, 1 + int((row > row[token]).sum()))}
        if top is not None:
            for rank, (value, other) in enumerate(zip(top.values[i].tolist(), top.indices[i].tolist()), 1):
                entry.setdefault(other, Logprob(value, rank))
        entries.append(entry)
    return entries


def sample_step(logits: torch.Tensor, step, generators: dict[str, torch.Generator]) -> tuple[dict[str, int | list[int]], dict[str, list[TokenLogprobs]]]:
    """Sample for every request of ``step`` (a ``model_runner.ModelInput``) that reached its end:
    one token, or (with drafts) the verified run of drafts plus one. Returns the tokens per
    request id, and the log-probabilities per emitted token for requests that asked for them."""
    drafts_of = step.drafts or [[]] * len(step.sampling)
    first_rows, row = [], 0
    for drafts in drafts_of:
        first_rows.append(row)
        row += len(drafts) + 1
    processed = _penalize(_mask_stop_tokens(logits, step, drafts_of, first_rows), step, drafts_of, first_rows)
    greedy_rows = processed.argmax(-1).tolist() if any(r.sampling_params.greedy for r in step.sampling) else None
    sampled, logprobs = {}, {}
    for request, drafts, first in zip(step.sampling, drafts_of, first_rows):
        params = request.sampling_params
        rows = processed[first:first + len(drafts) + 1]
        if not drafts:
            tokens = greedy_rows[first] if params.greedy else sample(rows[0], params, generators.get(request.request_id))
        else:
            probs = None if request.spec_probs is None else request.spec_probs[:len(drafts)]
            tokens, _ = rejection_sample(rows, drafts, probs, params, generators.get(request.request_id))
        sampled[request.request_id] = tokens
        if params.logprobs is not None:
            emitted = [tokens] if isinstance(tokens, int) else tokens
            logprobs[request.request_id] = token_logprobs(logits[first:first + len(emitted)], emitted,
                                                          params.logprobs)
    return sampled, logprobs
