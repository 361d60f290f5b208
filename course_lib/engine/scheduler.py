"""The V1-style scheduler: every step is a token budget split as ``{request_id: num_tokens}``.

Each step (vLLM V1 rules):
  1. running requests first, in order: each asks for all its uncomputed tokens (one while
     decoding, the prompt's rest while prefilling), capped by ``long_prefill_token_threshold``
     and by what is left of ``max_num_batched_tokens``: chunked prefill falls out of the budget;
  2. if its KV blocks do not fit, a running request is preempted (its blocks freed and its
     progress dropped, or its KV swapped to CPU) and goes back to the waiting queue, until the
     blocks fit or the request itself was the one preempted. The victim is the **last** running
     request, which goes to the **front** of the queue; under the ``priority`` policy it is the
     running request with the largest ``(priority, arrival_time)`` (lowest priority, latest
     arrival), even one already scheduled this step (its tokens are then handed back to the
     budget), and it waits in priority order;
  3. then, only if nothing was preempted this step, waiting requests are admitted in queue order
     (arrival, or ``(priority, arrival_time)``), with their prefix-cache hits, until one does not
     fit (head-of-line), the budget is spent or ``max_num_seqs`` requests run. Admission never
     preempts, under any policy: a high-priority arrival waits for a free slot and free blocks,
     and a long prefill already running keeps taking its budget share (vLLM V1 does the same).
     The ``static`` policy admits only into an empty batch.

Speculative decoding: a decoding request carrying k drafts asks for 1 + k tokens (fewer drafts
when the budget, ``max_tokens`` or ``max_model_len`` leave less room), and its KV slots cover the
drafts too. ``update_from_output`` takes back the rejected drafts: computed tokens drop to the
verified ones and blocks past them return to the pool, so a request never holds more blocks
than its verified tokens need, and only verified full blocks are ever hashed. As in vLLM, drafts
are charged in queue order like any other tokens: under a small budget an early request's drafts
can take the tokens a later running request needed, so speculation can then take more steps.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from course_lib.engine.config import SchedulerConfig
from course_lib.engine.kv_cache_manager import KVCacheManager
from course_lib.engine.metrics import SpecDecodeStats
from course_lib.engine.request import Request, RequestStatus
from course_lib.engine.request_queue import waiting_queue


@dataclass
class SchedulerOutput:
    """One step's plan. ``swap_out``/``swap_in`` are (source block, destination block) copies
    the model runner performs before the forward pass, as are the KV offload tier's
    ``kv_offload`` (GPU block, CPU block) and ``kv_reload`` (CPU block, GPU block) copies."""

    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    preempted: list[str] = field(default_factory=list)
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    prefix_hit_tokens: int = 0
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)  # drafts sent for verification
    kv_offload: list[tuple[int, int]] = field(default_factory=list)
    kv_reload: list[tuple[int, int]] = field(default_factory=list)


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv_cache_manager: KVCacheManager, num_cpu_blocks: int = 0) -> None:
        self.config = config
        self.kv = kv_cache_manager
        self.waiting = waiting_queue(config.policy)
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.free_cpu_blocks: deque[int] = deque(range(num_cpu_blocks))
        self.swapped: dict[str, list[int]] = {}  # request id -> CPU blocks holding its KV
        self.total_preemptions = 0
        self.spec_decode_totals: SpecDecodeStats | None = None  # every request's, counted per step

    def draft_room(self, request: Request) -> int:
        """How many drafts one step can verify for ``request``: its room to emit tokens minus the one
        the target always adds, and never more than the budget (or the per-request prefill cap)
        leaves beside that token. 0 means: do not propose."""
        cap = self.config.max_num_batched_tokens - 1
        if self.config.long_prefill_token_threshold:
            cap = min(cap, self.config.long_prefill_token_threshold - 1)
        return max(0, min(request.room() - 1, cap))

    def draft_candidates(self, sampled: dict) -> list[tuple[Request, int]]:
        """The running requests a proposer drafts for after a step, with their ``draft_room``: those
        that got tokens in it (``sampled``), are decoding (only their last token is uncomputed) and
        have room for at least one draft."""
        return [(r, room) for r in self.running
                if r.request_id in sampled and r.num_tokens - r.num_computed_tokens == 1
                and (room := self.draft_room(r)) > 0]

    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self.waiting.add(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def _tokens_wanted(self, request: Request, budget: int, cached: int = 0) -> int:
        wanted = request.num_tokens - request.num_computed_tokens - cached
        if request.spec_token_ids:  # only a decoding request has drafts: 1 + k, if the room allows k
            wanted += min(len(request.spec_token_ids), request.room() - 1)
        if self.config.long_prefill_token_threshold:
            wanted = min(wanted, self.config.long_prefill_token_threshold)
        return min(wanted, budget)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            tokens = self._tokens_wanted(request, budget)
            while self.kv.allocate_slots(request, tokens) is None:
                victim = self._pick_victim()
                if victim.request_id in out.num_scheduled_tokens:  # priority: scheduled earlier this step
                    budget += out.num_scheduled_tokens.pop(victim.request_id)
                    out.spec_token_ids.pop(victim.request_id, None)
                    index -= 1
                self._preempt(victim, out)
                if victim is request:
                    break
            if request.status is not RequestStatus.RUNNING:
                break
            out.num_scheduled_tokens[request.request_id] = tokens
            num_drafts = tokens - (request.num_tokens - request.num_computed_tokens)
            if num_drafts > 0:
                out.spec_token_ids[request.request_id] = request.spec_token_ids[:num_drafts]
            budget -= tokens
            index += 1
        if not out.preempted and not (self.config.policy == "static" and self.running):
            self._admit_waiting(out, budget)
        out.kv_offload, out.kv_reload = self.kv.take_transfers()  # evictions and CPU-tier hits of this step
        return out

    def _pick_victim(self) -> Request:
        """Remove and return the running request to preempt (see the module docstring)."""
        if self.config.policy != "priority":
            return self.running.pop()
        victim = max(self.running, key=lambda r: (r.priority, r.arrival_time))
        self.running.remove(victim)
        return victim

    def _admit_waiting(self, out: SchedulerOutput, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting.peek()
            hits, hit_tokens = [], 0
            if request.request_id not in self.swapped and request.num_computed_tokens == 0:
                hits, hit_tokens = self.kv.get_computed_blocks(request)
            tokens = self._tokens_wanted(request, budget, cached=hit_tokens)
            if self.kv.allocate_slots(request, tokens, hits) is None:
                break  # head-of-line: later requests wait behind this one
            request.num_computed_tokens += hit_tokens
            self.waiting.pop()
            self.running.append(request)
            request.status = RequestStatus.RUNNING
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = hit_tokens
            self._swap_in(request, out)
            out.num_scheduled_tokens[request.request_id] = tokens
            out.prefix_hit_tokens += hit_tokens
            budget -= tokens

    def _preempt(self, request: Request, out: SchedulerOutput) -> None:
        blocks = self.kv.block_ids(request.request_id)[: -(-request.num_computed_tokens // self.kv.block_size)]
        self.kv.free(request)  # while num_computed_tokens still says which blocks hold written KV
        if self.config.preemption_mode == "swap" and 0 < len(blocks) <= len(self.free_cpu_blocks):
            cpu = [self.free_cpu_blocks.popleft() for _ in blocks]
            out.swap_out += list(zip(blocks, cpu))
            self.swapped[request.request_id] = cpu
        else:
            request.num_computed_tokens = 0
        request.spec_token_ids, request.spec_probs = [], None  # proposed again once it runs
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1
        self.total_preemptions += 1
        self.waiting.prepend(request)
        out.preempted.append(request.request_id)

    def _swap_in(self, request: Request, out: SchedulerOutput) -> None:
        cpu = self.swapped.pop(request.request_id, None)
        if cpu:
            out.swap_in += list(zip(cpu, self.kv.block_ids(request.request_id)))
            self.free_cpu_blocks.extend(cpu)

    def update_from_output(self, out: SchedulerOutput, sampled: dict[str, int | list[int]],
                           now: float, logprobs: dict[str, list] | None = None) -> list[Request]:
        """Advance computed tokens, append sampled tokens (one, or a verified run of drafts plus
        one) and their ``logprobs`` entries (for requests that asked), roll back rejected drafts,
        and retire finished requests. A stop condition or ``max_tokens`` inside a run truncates it."""
        finished, logprobs = [], logprobs or {}
        for request_id, tokens in out.num_scheduled_tokens.items():
            request = self.requests[request_id]
            request.num_computed_tokens += tokens
            if request_id not in sampled:
                continue  # a prefill chunk that has not reached the last prompt token yet
            new = sampled[request_id]
            new = [new] if isinstance(new, int) else new
            num_drafts = len(out.spec_token_ids.get(request_id, ()))
            request.num_computed_tokens -= num_drafts - (len(new) - 1)  # rejected drafts were not computed
            request.spec_token_ids, request.spec_probs = [], None
            decoding, emitted, done = bool(request.output_token_ids), 0, False
            entries = logprobs.get(request_id)
            for token in new:
                request.append_output_token(token, now)
                if entries is not None:
                    request.logprobs.append(entries[emitted])
                emitted += 1
                if request.check_stop():
                    done = True
                    break
            if request.spec_stats is not None and decoding:
                request.spec_stats.record(num_drafts, len(new) - 1, emitted)
                if self.spec_decode_totals is None:
                    self.spec_decode_totals = SpecDecodeStats(request.spec_stats.num_speculative_tokens)
                self.spec_decode_totals.record(num_drafts, len(new) - 1, emitted)
            if done:
                self.kv.free(request)
                self.running.remove(request)
                del self.requests[request_id]
                finished.append(request)
            elif num_drafts:
                self.kv.rollback(request)
        return finished
