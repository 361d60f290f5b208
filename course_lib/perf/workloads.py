"""Request streams for the simulated engine: arrivals over time, prompt and output lengths.

Prompts are token ids, so shared system prompts really share a prefix (and prefix caching
really hits). All generators are reproducible from their seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from course_lib.checks import require_positive


@dataclass(frozen=True)
class WorkloadRequest:
    """One request: when it arrives (s), its prompt (token ids), how many tokens it will generate,
    and optionally which ones (so a later turn that quotes them can hit the prefix cache).
    ``priority`` (lower first) matters only to an engine with ``scheduling_policy="priority"``."""

    arrival_time: float
    prompt_token_ids: tuple[int, ...]
    output_len: int
    tag: str = "chat"
    output_token_ids: tuple[int, ...] | None = None
    priority: int = 0

    def __post_init__(self) -> None:
        if self.output_token_ids is not None and len(self.output_token_ids) != self.output_len:
            raise ValueError(f"output_token_ids has {len(self.output_token_ids)} tokens but output_len is "
                             f"{self.output_len}; make them agree.")


def _tokens(rng: random.Random, count: int) -> tuple[int, ...]:
    return tuple(rng.randrange(1000, 30000) for _ in range(count))


def poisson(num_requests: int, rate_per_s: float, mean_prompt: int = 512, mean_output: int = 128,
            system_prompt_len: int = 0, seed: int = 0) -> list[WorkloadRequest]:
    """Poisson arrivals at ``rate_per_s``; exponential prompt and output lengths; an optional
    system prompt of ``system_prompt_len`` tokens shared by every request."""
    require_positive("num_requests", num_requests)
    require_positive("rate_per_s", rate_per_s)
    rng = random.Random(seed)
    system = _tokens(rng, system_prompt_len)
    now, out = 0.0, []
    for _ in range(num_requests):
        now += rng.expovariate(rate_per_s)
        prompt = system + _tokens(rng, max(1, round(rng.expovariate(1 / mean_prompt))))
        out.append(WorkloadRequest(now, prompt, max(1, round(rng.expovariate(1 / mean_output)))))
    return out


def document_stream(num_requests: int = 30, rate_per_s: float = 1.0, prompt_len: tuple[int, int] = (4000, 7000),
                    output_len: tuple[int, int] = (500, 1000), seed: int = 0) -> list[WorkloadRequest]:
    """Long prompts (documents to summarise, retrieved passages) arriving as a Poisson stream at
    ``rate_per_s``, each with a medium-length answer. Prompt and output lengths are uniform over the
    inclusive ranges, so no request's context exceeds ``prompt_len[1] + output_len[1]``. Tag: 'document'."""
    require_positive("num_requests", num_requests)
    require_positive("rate_per_s", rate_per_s)
    for name, (low, high) in (("prompt_len", prompt_len), ("output_len", output_len)):
        if not 1 <= low <= high:
            raise ValueError(f"{name} must be a (shortest, longest) pair with 1 <= shortest <= longest, "
                             f"got {(low, high)!r}.")
    rng = random.Random(seed)
    now, out = 0.0, []
    for _ in range(num_requests):
        now += rng.expovariate(rate_per_s)
        out.append(WorkloadRequest(now, _tokens(rng, rng.randint(*prompt_len)), rng.randint(*output_len), "document"))
    return out


def burst(num_requests: int, prompt_len: int = 512, output_len: int = 128, at: float = 0.0,
          seed: int = 0) -> list[WorkloadRequest]:
    """``num_requests`` identical-shape requests arriving together."""
    rng = random.Random(seed)
    return [WorkloadRequest(at, _tokens(rng, prompt_len), output_len) for _ in range(num_requests)]


def document_among_chats(num_chat_users: int = 32, document_tokens: int = 16000, document_at: float = 2.0,
                         follow_up_rate_per_s: float = 4.0, duration_s: float = 10.0, chat_output_len: int = 2000,
                         seed: int = 0) -> list[WorkloadRequest]:
    """Module 03's stutter scenario: chat users are decoding long answers when a 16,000-token document
    arrives, while short follow-up turns keep coming (tags: 'chat', 'document', 'follow-up')."""
    rng = random.Random(seed)
    out = [WorkloadRequest(0.0, _tokens(rng, rng.randint(200, 600)), chat_output_len, "chat")
           for _ in range(num_chat_users)]
    out.append(WorkloadRequest(document_at, _tokens(rng, document_tokens), 200, "document"))
    now = 0.0
    while True:
        now += rng.expovariate(follow_up_rate_per_s)
        if now > duration_s:
            break
        out.append(WorkloadRequest(now, _tokens(rng, rng.randint(50, 200)), rng.randint(30, 120), "follow-up"))
    return sorted(out, key=lambda r: r.arrival_time)


def agent_sessions(num_sessions: int = 16, turns: int = 6, system_prompt_len: int = 1024,
                   tool_result_len: tuple[int, int] = (100, 600), output_len: tuple[int, int] = (30, 200),
                   think_time_s: float = 2.0, session_rate_per_s: float = 2.0, seed: int = 0) -> list[WorkloadRequest]:
    """Multi-turn agent sessions: every turn's prompt is the previous turn's prompt, the model's
    previous answer and a new tool result, behind a system prompt all sessions share. Turns of
    one session arrive ``think_time_s`` (exponential) apart; sessions start as a Poisson stream.
    Tags are 'turn 1', 'turn 2', ..."""
    require_positive("num_sessions", num_sessions)
    require_positive("turns", turns)
    rng = random.Random(seed)
    system = _tokens(rng, system_prompt_len)
    out, start = [], 0.0
    for _ in range(num_sessions):
        start += rng.expovariate(session_rate_per_s)
        now, context = start, system
        for turn in range(1, turns + 1):
            prompt = context + _tokens(rng, rng.randint(*tool_result_len))
            answer = _tokens(rng, rng.randint(*output_len))
            out.append(WorkloadRequest(now, prompt, len(answer), f"turn {turn}", answer))
            context = prompt + answer
            now += rng.expovariate(1 / think_time_s)
    return sorted(out, key=lambda r: r.arrival_time)


def straggler_batches(num_batches: int = 8, batch_size: int = 8, short_output: int = 50, long_output: int = 2000,
                      prompt_len: int = 128, seed: int = 0) -> list[WorkloadRequest]:
    """Static batching's worst case (module 02), repeated: in every group of ``batch_size`` requests,
    all but one stop after ``short_output`` tokens and one runs to ``long_output``. All arrive at once."""
    rng = random.Random(seed)
    return [WorkloadRequest(0.0, _tokens(rng, prompt_len), long_output if i % batch_size == 0 else short_output)
            for i in range(num_batches * batch_size)]
