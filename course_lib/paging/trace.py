"""Request traces: prompt and output lengths as a chat service sees them."""

from __future__ import annotations

import random
from dataclasses import dataclass

from course_lib.checks import require_positive

MAX_TOKENS_CHOICES = (256, 512, 1024, 2048)
"""Output caps clients commonly send; reserve-for-max must reserve for them."""


@dataclass(frozen=True)
class TraceRequest:
    """One request. Invariant: ``prompt_len + output_len <= prompt_len + max_tokens``."""

    req_id: str
    prompt_len: int
    output_len: int
    max_tokens: int

    @property
    def final_len(self) -> int:
        """Tokens the request holds when it finishes."""
        return self.prompt_len + self.output_len


def sample_chat_trace(num_requests: int, max_model_len: int = 2048, seed: int = 0) -> list[TraceRequest]:
    """Draw a reproducible chat-like trace: long-tailed (log-normal) prompt and output lengths.

    Medians are about 400 prompt and 180 output tokens, with a heavy tail, as in public
    chat logs; every request fits in ``max_model_len``.
    """
    require_positive("num_requests", num_requests)
    if max_model_len < 64:
        raise ValueError(f"max_model_len={max_model_len} is too short for a chat trace; use 64 or more.")
    rng = random.Random(seed)
    trace = []
    for i in range(num_requests):
        prompt = min(max_model_len // 2, max(8, round(rng.lognormvariate(6.0, 0.8))))
        max_tokens = min(rng.choice(MAX_TOKENS_CHOICES), max_model_len - prompt)
        output = min(max_tokens, max(1, round(rng.lognormvariate(5.2, 0.9))))
        trace.append(TraceRequest(f"r{i}", prompt, output, max_tokens))
    return trace
