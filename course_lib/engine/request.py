"""A request's state as the scheduler and KV cache manager see it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

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
    tokens; drafts the target rejects are rolled back out of ``num_computed_tokens``."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None
    arrival_time: float
    block_size: int
    max_model_len: int
    cache_salt: str | None = None
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

    def __post_init__(self) -> None:
        self.num_tokens = len(self.prompt_token_ids) + len(self.output_token_ids)
        self.update_block_hashes()

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
        return min(self.sampling_params.max_tokens - len(self.output_token_ids), self.max_model_len - self.num_tokens)

    def check_stop(self) -> bool:
        """Finish on EOS (unless ``ignore_eos``), at ``max_tokens`` or at ``max_model_len``; True if finished."""
        params = self.sampling_params
        if not params.ignore_eos and self.output_token_ids[-1] == self.eos_token_id:
            self.status = RequestStatus.FINISHED_STOPPED
            return True
        if len(self.output_token_ids) >= params.max_tokens or self.num_tokens >= self.max_model_len:
            self.status = RequestStatus.FINISHED_LENGTH
            return True
        return False
