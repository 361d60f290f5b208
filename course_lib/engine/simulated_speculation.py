"""Speculative decoding in simulated mode: acceptance rate and k as parameters, costs from the roofline.

``SimulatedEngine(..., speculation=SimulatedSpeculation(k, a, draft_model))`` proposes up to k
drafts for every decoding request after each step, as the real engine does, and the real
scheduler charges them (1 + k tokens, KV slots, rollback). Nothing is sampled: each draft
passes with probability ``a``, independently, until the first rejection, so a verification
yields 1 + a + ... + a^k tokens on average. The clock pays
  * the target's verification step: ``step_cost`` of 1 + k new tokens per decoding request,
    which is nearly free while the step is memory-bound and costs k + 1 times a decode once the
    batch is big enough to be compute-bound;
  * the draft model's k forward passes, one token each for every proposing request, one after
    another, at ``draft_efficiency`` (its own fixed cost per pass, e.g. its own layers'
    all-reduces; the target's when None); ``draft_model=None`` is a proposer that costs
    nothing, like n-gram lookup.
A step's tokens reach the user when its verification ends, before the drafts for the next step
(as in the course's engine; vLLM V1 emits them after drafting, so TTFT here is optimistic by one
round of draft passes).

Left out: the draft model's catch-up on accepted tokens, kernel launch and sampling costs that
grow with k, acceptance that varies by position and request, and the draft model's weights
and KV cache, which on a real GPU would shrink the target's KV cache.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from course_lib.checks import require_probability
from course_lib.perf.hardware import GPU
from course_lib.perf.models import ModelSpec
from course_lib.perf.roofline import Efficiency, step_cost


@dataclass(frozen=True)
class SimulatedSpeculation:
    """k drafts per decoding request, each accepted with probability ``acceptance_rate``."""

    num_speculative_tokens: int
    acceptance_rate: float
    draft_model: ModelSpec | None = None  # None: free drafts (n-gram prompt lookup)
    draft_efficiency: Efficiency | None = None  # the draft's passes; None: the target engine's
    seed: int = 0

    def __post_init__(self) -> None:
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"num_speculative_tokens is how many drafts a step verifies: a whole number of at "
                             f"least 1, got {k!r}.")
        require_probability("acceptance_rate", self.acceptance_rate)

    def draft_time_s(self, gpu: GPU, drafts: list[tuple[int, int]], dtype: str, efficiency: Efficiency) -> float:
        """Seconds the draft model takes to propose ``(context_len, num_drafts)`` for each request:
        pass i feeds one token to every request that wants more than i drafts. ``efficiency`` is
        the target engine's, used unless ``draft_efficiency`` is set."""
        if self.draft_model is None or not drafts:
            return 0.0
        efficiency = self.draft_efficiency or efficiency
        total = 0.0
        for i in range(max(n for _, n in drafts)):
            batch = [(context + i, 1) for context, n in drafts if n > i]
            total += step_cost(self.draft_model, gpu, batch, dtype, efficiency).time_s
        return total

    def num_accepted(self, rng: random.Random, num_drafts: int) -> int:
        """Drafts accepted before the first rejection."""
        accepted = 0
        while accepted < num_drafts and rng.random() < self.acceptance_rate:
            accepted += 1
        return accepted

