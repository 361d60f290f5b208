"""What ``LLM.generate`` returns: text, token ids and per-request timing (vLLM's output shapes)."""

from __future__ import annotations

from dataclasses import dataclass

from course_lib.engine.metrics import SpecDecodeStats


@dataclass(frozen=True)
class Logprob:
    """One token's log-probability under the model's raw logits, its rank among all tokens
    (1 = most likely) and its text (vLLM's ``Logprob``)."""

    logprob: float
    rank: int
    decoded_token: str | None = None


@dataclass(frozen=True)
class CompletionOutput:
    """``finish_reason`` is "stop" (an EOS id, a stop token or a stop string) or "length"
    (``max_tokens`` or ``max_model_len``); ``stop_reason`` names what stopped it: None for EOS or
    length, the token id from ``stop_token_ids``, or the stop string. ``logprobs`` (when asked)
    has one ``{token id: Logprob}`` per generated token, the sampled token first."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str
    stop_reason: int | str | None = None
    logprobs: list[dict[int, Logprob]] | None = None
    cumulative_logprob: float | None = None


@dataclass(frozen=True)
class RequestMetrics:
    """Wall-clock times in seconds: arrival, then one entry per generated token (tokens verified
    in one step share its time). ``spec_decode_stats``: drafts and acceptance, when speculating."""

    arrival_time: float
    token_times: list[float]
    spec_decode_stats: SpecDecodeStats | None = None

    @property
    def first_token_time(self) -> float:
        return self.token_times[0]

    @property
    def ttft(self) -> float:
        """Time to first token."""
        return self.token_times[0] - self.arrival_time

    @property
    def itl(self) -> list[float]:
        """Inter-token latencies: the gaps between consecutive tokens."""
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]


@dataclass(frozen=True)
class RequestOutput:
    """vLLM's ``RequestOutput``: ``finished`` is True once every completion has finished (always, on
    what ``LLM.generate`` returns)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    metrics: list[RequestMetrics]  # one per completion
    num_cached_tokens: int  # prompt tokens served from the prefix cache (first completion)
    finished: bool
