"""The step trace: what the scheduler did in each step, for lessons to draw."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class StepRecord:
    """One engine step. ``scheduled`` maps request id to tokens computed in this step."""

    step: int
    scheduled: dict[str, int]
    waiting: list[str]
    running: list[str]
    blocks_used: int
    blocks_free: int
    prefix_hit_tokens: int
    preempted: list[str]
    wall_time_s: float
    model_time_s: float  # forward pass and sampling; the rest of the wall time is bookkeeping
    kv_offload_blocks: int = 0  # blocks copied GPU -> CPU offload tier in this step
    kv_reload_blocks: int = 0  # blocks copied CPU offload tier -> GPU in this step

    @property
    def overhead_time_s(self) -> float:
        """Scheduling, KV-cache management and input preparation."""
        return self.wall_time_s - self.model_time_s

    @property
    def num_tokens(self) -> int:
        return sum(self.scheduled.values())


@dataclass
class SpecDecodeStats:
    """Speculative-decoding counts, for one request or summed over many (``merge``).

    A *verification step* is a target step that checked at least one draft for the request; it
    emits the accepted drafts plus one token of the target's (a correction or the bonus), so
    ``mean_tokens_per_step = (accepted + steps) / steps``. Acceptance counts what the rejection
    sampler accepted, before a stop token or ``max_tokens`` truncated the run.
    """

    num_speculative_tokens: int
    num_proposed_tokens: int = 0  # drafts the proposer returned (some may be cut by budget or preemption)
    num_drafts: int = 0  # verification steps
    num_draft_tokens: int = 0  # drafts verified
    num_accepted_tokens: int = 0
    num_reached_tokens: int = 0  # drafts actually tested: up to and including the first rejected one
    num_decode_steps: int = 0  # target steps that gave the request tokens after its first one, drafts or not
    num_decode_tokens: int = 0  # tokens those steps emitted
    draft_tokens_per_pos: list[int] = field(default_factory=list)
    accepted_tokens_per_pos: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        k = self.num_speculative_tokens
        self.draft_tokens_per_pos = self.draft_tokens_per_pos or [0] * k
        self.accepted_tokens_per_pos = self.accepted_tokens_per_pos or [0] * k

    def record(self, num_drafts: int, num_accepted: int, num_emitted: int) -> None:
        """One target step for a decoding request: drafts checked, drafts accepted, tokens kept."""
        self.num_decode_steps += 1
        self.num_decode_tokens += num_emitted
        if not num_drafts:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
        self.num_reached_tokens += min(num_accepted + 1, num_drafts)
        for pos in range(num_drafts):
            self.draft_tokens_per_pos[pos] += 1
            self.accepted_tokens_per_pos[pos] += pos < num_accepted

    def merge(self, other: "SpecDecodeStats") -> None:
        for name in ("num_proposed_tokens", "num_drafts", "num_draft_tokens", "num_accepted_tokens",
                     "num_reached_tokens", "num_decode_steps", "num_decode_tokens"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for pos in range(self.num_speculative_tokens):
            self.draft_tokens_per_pos[pos] += other.draft_tokens_per_pos[pos]
            self.accepted_tokens_per_pos[pos] += other.accepted_tokens_per_pos[pos]

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts / verified drafts (0 when none was verified)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def conditional_acceptance_rate(self) -> float:
        """P(a draft is accepted | every draft before it was): the ``a`` of the i.i.d. model."""
        return self.num_accepted_tokens / self.num_reached_tokens if self.num_reached_tokens else 0.0

    @property
    def acceptance_rate_per_pos(self) -> list[float]:
        """Per position i = 1..k, the share of verification steps whose draft i was accepted (vLLM's
        definition: accepted at i / steps). Accepting draft i needs drafts 1..i-1 accepted too, so
        it never rises with i; a step that sent fewer than i drafts counts as not accepted at i."""
        return [a / self.num_drafts if self.num_drafts else 0.0 for a in self.accepted_tokens_per_pos]

    @property
    def mean_tokens_per_step(self) -> float:
        """Tokens per verification step: accepted drafts + 1 (1.0 when nothing was verified)."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def tokens_per_decode_step(self) -> float:
        """Tokens per decode step counting steps without drafts too (the speed-up's upper bound)."""
        return self.num_decode_tokens / self.num_decode_steps if self.num_decode_steps else 1.0

    def predicted_tokens_per_step(self, k: int | None = None) -> float:
        """(1 - a^(k+1)) / (1 - a) with ``a = conditional_acceptance_rate``: i.i.d. acceptance and k
        drafts in every step (steps with fewer drafts make the measurement fall short of it)."""
        k = self.num_speculative_tokens if k is None else k
        a = self.conditional_acceptance_rate
        return float(k + 1) if a >= 1 else (1 - a ** (k + 1)) / (1 - a)
