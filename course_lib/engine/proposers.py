"""Draft proposers for speculative decoding: n-gram prompt lookup, and a small draft model.

Both run after a step, for each running request that is decoding, and return up to
``max_drafts`` tokens to follow its last sampled token. The target verifies them in the next
step (``rejection_sampler.py``); a proposer never changes what is emitted, only how fast.

* ``NgramProposer``: no model. Take the request's last ``n`` tokens, ``n`` from
  ``prompt_lookup_max`` down to ``prompt_lookup_min``; find their earliest occurrence in the
  request (prompt and output) that ends before the last token; propose the tokens that followed
  it. The longest n-gram that occurs wins, then the earliest occurrence, as in vLLM's
  ``NgramProposer``. No match, no drafts.
  Its drafts are a point mass (``probs`` None): the rejection sampler uses ``q(x) = 1``.
* ``DraftModelProposer``: a small model with the target's vocabulary, run for k steps. Its KV
  is **paged in the engine's pool** (``kv_budget.py``): one tensor per draft layer with the
  target's ``num_blocks`` and ``block_size``, addressed through the request's own block table, so
  block ``b`` holds both models' K/V for the same positions and every byte of it was budgeted
  with the target's. Before drafting ``j`` tokens it asks the KV cache manager for the slots its
  lookahead writes (positions up to ``num_tokens + j - 2``, all of which the next step's
  verification needs too); where the pool has no room it drafts fewer, or none. Preemption,
  abort and finishing free those blocks with the request's. It knows which positions of the
  request hold its KV for verified tokens; after a step it feeds only what is new (the accepted
  drafts and the target's token; the whole prompt after a preemption or for a new request, which
  rewrites the same values into any block shared through the prefix cache), then one token per
  further draft. Drafts are sampled from the draft's distribution under the request's sampling
  settings (argmax when greedy); ``probs`` holds them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from course_lib.engine.attention import build_metadata
from course_lib.engine.kv_cache_manager import KVCacheManager
from course_lib.engine.request import Request
from course_lib.engine.sampler import probabilities
from course_lib.models.llama import LlamaForCausalLM


@dataclass
class Draft:
    token_ids: list[int]
    probs: torch.Tensor | None = None  # [len(token_ids), vocab] draft distributions; None: point mass


def ngram_lookup(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Up to ``k`` tokens that followed the earliest occurrence of the last ``n`` tokens (one that
    ends before the last token), trying ``n = max_n .. min_n``; ``[]`` when no suffix occurs
    earlier. vLLM's choice: the longest n-gram, and the earliest of its occurrences."""
    length = len(tokens)
    if k < 1 or length < 2:
        return []
    array = np.asarray(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(array[:length - 1], n)  # starts 0 .. length-1-n
        hits = np.flatnonzero((windows == array[length - n:]).all(axis=1))
        if len(hits):
            start = int(hits[0]) + n
            return tokens[start:start + k]
    return []


class NgramProposer:
    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int) -> None:
        self.k, self.min_n, self.max_n = num_speculative_tokens, prompt_lookup_min, prompt_lookup_max

    def propose(self, requests: list[Request], max_drafts: list[int],
                generators: dict[str, torch.Generator]) -> list[Draft]:
        return [Draft(ngram_lookup(r.token_ids(0, r.num_tokens), min(self.k, m), self.min_n, self.max_n))
                for r, m in zip(requests, max_drafts)]

    def release(self, live_request_ids: set[str]) -> None:
        """Nothing to free: the n-gram proposer keeps no state."""


class DraftModelProposer:
    def __init__(self, model: LlamaForCausalLM, num_speculative_tokens: int, kv_cache_manager: KVCacheManager,
                 num_blocks: int) -> None:
        self.model, self.k, self.kv = model, num_speculative_tokens, kv_cache_manager
        c = model.config
        param = next(model.parameters())
        self.block_size = kv_cache_manager.block_size
        shape = (2, num_blocks, self.block_size, c.num_key_value_heads, c.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=param.dtype, device=param.device)
                          for _ in range(c.num_hidden_layers)]
        self.device = param.device
        self.num_valid: dict[str, int] = {}  # leading positions whose draft KV holds the request's tokens
        self.pending: dict[str, list[int]] = {}  # drafts cached right after those positions

    def release(self, live_request_ids: set[str]) -> None:
        """Forget what the draft computed for requests that no longer run (finished, preempted or
        aborted): their blocks went back to the pool with the target's."""
        for request_id in [r for r in self.num_valid if r not in live_request_ids]:
            del self.num_valid[request_id]
            self.pending.pop(request_id, None)

    def _reserve(self, request: Request, drafts: int) -> int:
        """Take the blocks that ``drafts`` drafts' lookahead writes into, or as many drafts as the
        pool has room for (0: none)."""
        for count in range(drafts, 0, -1):
            if self.kv.allocate_slots(request, count) is not None:
                return count
        return 0

    def _valid_prefix(self, request: Request) -> int:
        """Leading positions whose draft KV holds the request's true tokens (cached drafts it accepted
        count); all of them lie below ``num_computed_tokens``, in blocks the request still holds."""
        valid = self.num_valid.get(request.request_id, 0)
        pending = self.pending.pop(request.request_id, [])
        truth = request.token_ids(valid, min(valid + len(pending), request.num_tokens))
        for draft, token in zip(pending, truth):
            if draft != token:
                break
            valid += 1
        return min(valid, request.num_tokens - 1)  # the last token is always fed: its logits make draft 1

    def _forward(self, chunks: list[tuple[list[int], list[int], int]]) -> torch.Tensor:
        """Run the draft on ``(block table, tokens, first position)`` chunks; logits at each chunk's
        last token."""
        ids, positions, slots, query_lens, seq_lens, tables, last_rows = [], [], [], [], [], [], []
        size = self.block_size
        for table, tokens, first in chunks:
            ids += tokens
            positions += range(first, first + len(tokens))
            slots += [table[p // size] * size + p % size for p in range(first, first + len(tokens))]
            query_lens.append(len(tokens))
            seq_lens.append(first + len(tokens))
            tables.append(table)
            last_rows.append(len(ids) - 1)
        device = self.device
        metadata = build_metadata(slots, query_lens, seq_lens, tables, size, device)
        return self.model(torch.tensor(ids, device=device), torch.tensor(positions, device=device),
                          self.kv_caches, metadata, torch.tensor(last_rows, device=device))

    def _pick(self, logits: torch.Tensor, requests: list[Request], generators) -> tuple[list[int], list]:
        """One draft token per request (argmax when greedy, else sampled from the processed q)."""
        tokens, dists = logits.argmax(-1).tolist(), []
        for i, request in enumerate(requests):
            params = request.sampling_params
            if params.greedy:
                dists.append(None)
                continue
            q = probabilities(logits[i], params).double().cpu()
            q = q / q.sum()
            tokens[i] = int(torch.multinomial(q, 1, generator=generators.get(request.request_id)))
            dists.append(q)
        return tokens, dists

    @torch.inference_mode()
    def propose(self, requests: list[Request], max_drafts: list[int],
                generators: dict[str, torch.Generator]) -> list[Draft]:
        drafts = [Draft([]) for _ in requests]
        active = []
        for index, (request, room) in enumerate(zip(requests, max_drafts)):
            count = self._reserve(request, min(self.k, room))
            if count:
                active.append((index, request, count))
            else:  # no drafts now: the blocks holding its cached drafts may be rolled back before it drafts again
                self.pending.pop(request.request_id, None)
        if not active:
            return drafts
        chunks = []
        for _, request, _ in active:
            valid = self._valid_prefix(request)
            chunks.append((self.kv.block_ids(request.request_id), request.token_ids(valid, request.num_tokens), valid))
            self.num_valid[request.request_id] = request.num_tokens
        dists: list[list] = [[] for _ in active]
        logits = self._forward(chunks)
        for step in range(max(m for _, _, m in active)):
            live = [a for a, (_, _, m) in enumerate(active) if m > step]
            tokens, step_dists = self._pick(logits, [active[a][1] for a in live], generators)
            for a, token, dist in zip(live, tokens, step_dists):
                drafts[active[a][0]].token_ids.append(token)
                dists[a].append(dist)
            more = [(a, t) for a, t in zip(live, tokens) if active[a][2] > step + 1]
            if not more:
                break
            logits = self._forward([(chunks[a][0], [t], active[a][1].num_tokens + step) for a, t in more])
        for a, (index, request, _) in enumerate(active):
            self.pending[request.request_id] = drafts[index].token_ids[:-1]  # their KV is in its blocks
            if dists[a] and dists[a][0] is not None:
                drafts[index].probs = torch.stack(dists[a])
        return drafts
