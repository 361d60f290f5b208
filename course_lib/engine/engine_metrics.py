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
  * ``vllm:num_preemptions`` (counter): preemptions since start.
Counters only grow, as Prometheus counters do: ``LLM.reset_prefix_cache`` empties the cache,
not the counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from course_lib.engine.kv_cache_manager import KVCacheManager
from course_lib.engine.scheduler import Scheduler


@dataclass(frozen=True)
class Metric:
    """One metric as vLLM's metrics reader gives it: ``kind`` is "gauge" or "counter"."""

    name: str
    kind: str
    value: float


def engine_metrics(scheduler: Scheduler, kv: KVCacheManager) -> list[Metric]:
    stats = kv.prefix_cache_stats
    metrics = [
        Metric("vllm:num_requests_running", "gauge", len(scheduler.running)),
        Metric("vllm:num_requests_waiting", "gauge", len(scheduler.waiting)),
        Metric("vllm:kv_cache_usage_perc", "gauge", kv.block_pool.usage()),
        Metric("vllm:prefix_cache_queries", "counter", stats.queried_tokens),
        Metric("vllm:prefix_cache_hits", "counter", stats.gpu_hit_tokens),
        Metric("vllm:num_preemptions", "counter", scheduler.total_preemptions),
    ]
    if kv.offload is not None:
        metrics.append(Metric("vllm:external_prefix_cache_hits", "counter", stats.cpu_hit_tokens))
    return metrics
