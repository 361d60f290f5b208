"""A request's state as the scheduler and KV cache manager see it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable, Iterable

from course_lib.engine.block_hash import BlockHash, hash_request_blocks
from course_lib.engine.metrics import SpecDecodeStats
from course_lib.engine.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "finished (eos)"
    FINISHED_LENGTH = "finished (length)"


@dataclass(eq=False, slots=True)
class Request:
    """Invariant: ``num_computed_tokens <= num_tokens``; tokens past ``num_computed_tokens`` still
    need a forward pass (the prompt's rest, or the last sampled token).

    ``spec_token_ids`` are unverified drafts that follow the last sampled token (never part of
    ``num_tokens`` or of any block hash); ``spec_probs`` their draft distributions, or None
    for a point-mass proposer. A step computes at most ``num_tokens + len(spec_token_ids)``
    tokens; drafts the target rejects are rolled back out of ``num_computed_tokens``.

    ``eos_token_ids``: the model's end-of-sequence ids, its main one first (any of them stops it);
    ``all_stop_token_ids`` adds ``sampling_params.stop_token_ids`` (what ``min_tokens`` masks).
    ``priority``: lower is served first under ``scheduling_policy="priority"``. ``detokenize``
    (token ids -> text) is needed only for ``stop`` strings. ``max_tokens`` is the output cap:
    ``sampling_params.max_tokens``, or what ``max_model_len`` leaves after the prompt when that is None."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: Iterable[int] | None
    arrival_time: float
    block_size: int
    max_model_len: int
    cache_salt: str | None = None
    priority: int = 0
    detokenize: Callable[[list[int]], str] | None = None
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    block_hashes: list[BlockHash] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    num_preemptions: int = 0
    num_cached_tokens: int = -1  # prefix-cache hit on first scheduling; -1 until then
    num_tokens: int = field(init=False)  # prompt + output, kept by append_output_token
    spec_token_ids: list[int] = field(default_factory=list)
    spec_probs: object = None  # torch.Tensor [len(spec_token_ids), vocab] or None
    spec_stats: SpecDecodeStats | None = None  # set when the engine speculates
    logprobs: list | None = None  # per output token, when sampling_params.logprobs is set
    stop_reason: int | str | None = None  # the stop token id or stop string that finished it
    stop_text_end: int | None = None  # a stop string's offset in the output text: the text ends there
    all_stop_token_ids: frozenset[int] = field(init=False)
    max_tokens: int = field(init=False)
    _text_checked: int = 0  # output characters already searched for stop strings

    def __post_init__(self) -> None:
        self.eos_token_ids = tuple(self.eos_token_ids or ())
        self.all_stop_token_ids = frozenset(self.eos_token_ids) | frozenset(self.sampling_params.stop_token_ids)
        if self.sampling_params.stop and self.detokenize is None:
            raise ValueError("Stop strings need the engine's tokenizer to detokenize the output.")
        if self.sampling_params.logprobs is not None:
            self.logprobs = []
        self.num_tokens = len(self.prompt_token_ids) + len(self.output_token_ids)
        self.max_tokens = self.sampling_params.max_tokens or max(1, self.max_model_len - len(self.prompt_token_ids))
        self.update_block_hashes()

    @property
    def finished(self) -> bool:
        return self.status in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH)

    def token_ids(self, start: int, end: int) -> list[int]:
        """Tokens ``start:end`` of prompt + output, without building the whole list."""
        prompt = len(self.prompt_token_ids)
        if end <= prompt:
            return self.prompt_token_ids[start:end]
        return self.prompt_token_ids[start:prompt] + self.output_token_ids[max(0, start - prompt):end - prompt]

    def update_block_hashes(self) -> None:
        """Hash any block that has become full since the last call (cheap when none has)."""
        done, full = len(self.block_hashes), self.num_tokens // self.block_size
        if full > done:
            parent = self.block_hashes[-1] if self.block_hashes else None
            tokens = self.token_ids(done * self.block_size, full * self.block_size)
            self.block_hashes += hash_request_blocks(tokens, self.block_size, self.cache_salt, done, parent)

    def append_output_token(self, token_id: int, now: float) -> None:
        self.output_token_ids.append(token_id)
        self.num_tokens += 1
        self.token_times.append(now)
        if self.num_tokens % self.block_size == 0:  # a block just became full
            self.update_block_hashes()

    def room(self) -> int:
        """Tokens this request may still emit before ``max_tokens`` or ``max_model_len`` stops it."""
        return min(self.max_tokens - len(self.output_token_ids), self.max_model_len - self.num_tokens)

    def check_stop(self) -> bool:
        """After each new token, in vLLM V1's order: nothing but ``max_model_len`` stops a request
        before ``min_tokens``; then an EOS id (unless ``ignore_eos``; the first is the model's, any
        other is reported as the stop reason, as vLLM moves a generation config's extra EOS ids into
        ``stop_token_ids``), a stop token id, a stop string in the text (past ``min_tokens``), and
        only then ``max_tokens`` / ``max_model_len``: a stop that lands on the last allowed token is
        a stop. True if finished."""
        params, last, count = self.sampling_params, self.output_token_ids[-1], len(self.output_token_ids)
        if count < params.min_tokens:
            return self._finish_if_too_long()
        if not params.ignore_eos and last in self.eos_token_ids:
            self.status = RequestStatus.FINISHED_STOPPED
            self.stop_reason = None if last == self.eos_token_ids[0] else last
            return True
        if last in params.stop_token_ids:
            self.status, self.stop_reason = RequestStatus.FINISHED_STOPPED, last
            return True
        if params.stop and self._find_stop_string():
            self.status = RequestStatus.FINISHED_STOPPED
            return True
        return self._finish_if_too_long()

    def _finish_if_too_long(self) -> bool:
        if len(self.output_token_ids) >= self.max_tokens or self.num_tokens >= self.max_model_len:
            self.status = RequestStatus.FINISHED_LENGTH
            return True
        return False

    def _find_stop_string(self) -> bool:
        """Search the text the newest token added (plus a stop string's length before it) for the
        stop strings, in the order given (the first found wins, as in vLLM); on a hit, record it and
        where the text ends. Trailing U+FFFD (an incomplete UTF-8 character) counts as unread, since
        the next token may complete it without lengthening the text."""
        text = self.detokenize(self.output_token_ids)
        checked, self._text_checked = self._text_checked, len(text.rstrip("\ufffd"))
        if len(self.output_token_ids) <= self.sampling_params.min_tokens:
            return False  # vLLM looks for stop strings only past min_tokens
        for stop in self.sampling_params.stop:
            at = text.find(stop, max(0, checked - len(stop) + 1))
            if at >= 0:
                self.stop_text_end, self.stop_reason = at, stop
                return True
        return False
