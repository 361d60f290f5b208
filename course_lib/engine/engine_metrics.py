"""The engine's statistics under vLLM's metric names and meanings (what ``LLM.get_metrics`` returns).

  * ``vllm:num_requests_running`` / ``vllm:num_requests_waiting`` (gauges): requests in the
    running batch, and queued (new or preempted);
  * ``vllm:kv_cache_usage_perc`` (gauge, a fraction 0..1 despite the name, as in vLLM): KV blocks
    some request holds; free blocks that still cache a prefix count as free;
  * ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits`` (counters, in tokens): prompt
    tokens looked up in the GPU prefix cache and those found; hits / queries is the hit rate vLLM
    logs. A request that waits is looked up again at every admission attempt, and counted again;
    a preempted request's lookups are left out (vLLM counts them apart, as "preempted");
  * ``vllm:external_prefix_cache_hits`` (counter, tokens; only with a KV offload tier): tokens
    reloaded from the CPU tier, counted once per reload;
  * ``vllm:num_preemptions`` (counter): preemptions since start;
  * with a ``speculative_config`` only (vLLM registers them only then), counted at every step
    for every decoding request the step checked drafts for: ``vllm:spec_decode_num_drafts``
    (counter: such request-steps), ``vllm:spec_decode_num_draft_tokens`` (counter: drafts
    checked), ``vllm:spec_decode_num_accepted_tokens`` (counter: drafts the rejection sampler
    accepted, before a stop truncated them) and ``vllm:spec_decode_num_accepted_tokens_per_pos``
    (a ``Vector`` of ``num_speculative_tokens`` counts: steps whose draft i was accepted). vLLM's
    readings: acceptance rate = accepted / draft tokens, mean acceptance length = 1 + accepted /
    drafts, acceptance at position i = per_pos[i] / drafts.
Counters only grow, as Prometheus counters do: ``LLM.reset_prefix_cache`` empties the cache,
not the counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from course_lib.engine.kv_cache_manager import KVCacheManager
from course_lib.engine.metrics import SpecDecodeStats
from course_lib.engine.scheduler import Scheduler


@dataclass(frozen=True)
class Metric:
    """One metric as vLLM's metrics reader gives it: ``kind`` is "gauge", "counter" or "vector";
    the subclasses ``Gauge``, ``Counter`` and ``Vector`` let vLLM's ``isinstance`` checks run."""

    name: str
    kind: str
    value: float


class Gauge(Metric):
    """A value that goes up and down (vLLM's ``vllm.v1.metrics.reader.Gauge``)."""


class Counter(Metric):
    """A count that only grows (vLLM's ``vllm.v1.metrics.reader.Counter``)."""


@dataclass(frozen=True)
class Vector(Metric):
    """Counts that only grow, one per position (vLLM's ``Vector``): read ``values``; ``value`` is
    their sum, so code that reads every metric's ``value`` still works."""

    values: list[int] = field(default_factory=list)


def _vector(name: str, values: list[int]) -> Vector:
    return Vector(name, "vector", sum(values), list(values))


def engine_metrics(scheduler: Scheduler, kv: KVCacheManager, num_speculative_tokens: int = 0) -> list[Metric]:
    """The metrics; ``num_speculative_tokens`` > 0 (the engine speculates) adds the spec_decode ones."""
    stats = kv.prefix_cache_stats
    metrics = [
        Gauge("vllm:num_requests_running", "gauge", len(scheduler.running)),
        Gauge("vllm:num_requests_waiting", "gauge", len(scheduler.waiting)),
        Gauge("vllm:kv_cache_usage_perc", "gauge", kv.block_pool.usage()),
        Counter("vllm:prefix_cache_queries", "counter", stats.queried_tokens),
        Counter("vllm:prefix_cache_hits", "counter", stats.gpu_hit_tokens),
        Counter("vllm:num_preemptions", "counter", scheduler.total_preemptions),
    ]
    if kv.offload is not None:
        metrics.append(Counter("vllm:external_prefix_cache_hits", "counter", stats.cpu_hit_tokens))
    if num_speculative_tokens:
        spec = scheduler.spec_decode_totals or SpecDecodeStats(num_speculative_tokens)
        metrics += [
            Counter("vllm:spec_decode_num_drafts", "counter", spec.num_drafts),
            Counter("vllm:spec_decode_num_draft_tokens", "counter", spec.num_draft_tokens),
            Counter("vllm:spec_decode_num_accepted_tokens", "counter", spec.num_accepted_tokens),
            _vector("vllm:spec_decode_num_accepted_tokens_per_pos", spec.accepted_tokens_per_pos),
        ]
    return metrics
