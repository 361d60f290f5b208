"""Disaggregated prefill and decode in simulated mode, against the same GPUs colocated.

Every GPU is one ``SimulatedEngine``: the real scheduler and KV cache manager on a roofline clock.

Colocated: each of N GPUs prefills and decodes its share of the requests together, as simulated
mode does; a long prompt's chunks share steps with (and slow) that GPU's decodes.

Disaggregated: a prefill pool runs each request with ``max_tokens=1`` (the prefill produces the
first token), then a KV connector ships the prompt's KV to a decode GPU over the prefill GPU's
link: ``bytes / link bandwidth``, one transfer at a time per link. Layer-by-layer pipelining
overlaps the transfer with the prefill so only the last layer's share is exposed
(``perf.serving.kv_transfer``). The decode GPU's scheduler admits the request, prompt already
computed, once its whole context fits in the KV cache; the first token reaches the user then,
so TTFT = prefill + transfer + any wait for decode room. A request of one output token needs no
decode. Assumptions: the KV waits (on the prefill GPU or in a staging buffer) without holding
decode blocks; the prefill GPU frees its blocks when its prefill ends; decode GPUs' receiving
links are not a bottleneck; a request preempted on a decode GPU recomputes there, as vLLM's does.

Requests go to GPUs round-robin (by arrival; to decode GPUs by KV arrival) or, with
``routing="fewest_tokens"``, to the GPU given the fewest prompt + output tokens so far.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from course_lib.checks import require_positive
from course_lib.cycle_collector import cycle_collector_paused
from course_lib.engine.request import Request
from course_lib.engine.simulated import SimulatedEngine, percentile
from course_lib.perf.hardware import GPU, get_gpu
from course_lib.perf.models import ModelSpec, get_model
from course_lib.perf.serving import kv_transfer
from course_lib.perf.units import plural
from course_lib.perf.workloads import WorkloadRequest, document_among_chats, document_stream

ROUTINGS = ("round_robin", "fewest_tokens")


@dataclass(frozen=True)
class RequestTimeline:
    """One request end to end: when its tokens reached the user, and where it ran."""

    index: int  # position in the workload
    tag: str
    arrival_s: float
    token_times: tuple[float, ...]  # when each output token was delivered
    prefill_gpu: int  # the GPU that prefilled it (colocated: the only GPU it used)
    decode_gpu: int | None = None
    kv_ready_s: float | None = None  # when its KV had reached the decode GPU
    transfer_s: float = 0.0  # transfer time exposed after the prefill (link queueing included)

    @property
    def ttft_s(self) -> float:
        return self.token_times[0] - self.arrival_s

    @property
    def itl_s(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]


@dataclass
class ClusterReport:
    """Timelines of every request on one layout of GPUs, and the figures a lesson compares."""

    layout: str
    num_gpus: int
    requests: list[RequestTimeline]
    preemptions: int = 0
    busy_s: list[float] = field(default_factory=list)  # per GPU: seconds spent in steps (prefill GPUs first)

    @property
    def utilization(self) -> float:
        """Share of the GPUs' time spent computing, from the clock's start to the last token."""
        return sum(self.busy_s) / (self.num_gpus * self.duration_s) if self.duration_s else 0.0

    def ttft(self, tag: str | None = None) -> list[float]:
        return [r.ttft_s for r in self.requests if tag in (None, r.tag)]

    def itl(self, tag: str | None = None) -> list[float]:
        return [gap for r in self.requests if tag in (None, r.tag) for gap in r.itl_s]

    @property
    def duration_s(self) -> float:
        """From the clock's start (0) to the last token delivered."""
        return max((r.token_times[-1] for r in self.requests), default=0.0)

    @property
    def output_tokens(self) -> int:
        return sum(len(r.token_times) for r in self.requests)

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.duration_s if self.duration_s else 0.0

    @property
    def requests_per_s(self) -> float:
        return len(self.requests) / self.duration_s if self.duration_s else 0.0

    def latency(self, tag: str | None = None) -> dict[str, float]:
        """TTFT and ITL percentiles in ms, with ITL's tail (p99.9 and the worst gap)."""
        ttft, itl = self.ttft(tag), self.itl(tag)
        out = {f"ttft_p{q}_ms": 1000 * percentile(ttft, q) for q in (50, 90, 99)}
        out.update({f"itl_p{q}_ms": 1000 * percentile(itl, q) for q in (50, 90, 99, 99.9)})
        out["itl_max_ms"] = 1000 * max(itl, default=0.0)
        return out

    def summary(self, tag: str | None = None) -> dict[str, float]:
        """Latency of the requests tagged ``tag`` (all with None); the rest is the whole workload's."""
        return {**self.latency(tag), "finish_s": self.duration_s, "output_tokens_per_s": self.output_tokens_per_s,
                "requests_per_s": self.requests_per_s, "gpu_utilization": self.utilization}

    @property
    def last_to_finish(self) -> RequestTimeline:
        """The request whose last token came last: the one that sets ``duration_s``."""
        return max(self.requests, key=lambda r: (r.token_times[-1], -r.index))


class _Instance(SimulatedEngine):
    """A simulated GPU that keeps its finished requests for the cluster's bookkeeping."""

    def _report(self, steps, finished, tags):
        self.finished, self.trace = finished, steps
        return super()._report(steps, finished, tags)


class _DecodeInstance(_Instance):
    """Requests arrive with their prompt's KV computed elsewhere and their first token sampled."""

    def _add(self, request_id: str, item: WorkloadRequest) -> None:
        super()._add(request_id, item)
        request: Request = self.scheduler.requests[request_id]
        request.append_output_token(self._next_tokens(request, 0)[0], item.arrival_time)
        request.num_computed_tokens = len(request.prompt_token_ids)


def _first_scheduled(steps) -> dict[str, float]:
    """Request id -> the start of the first step that scheduled it."""
    first = {}
    for step in steps:
        for request_id in step.scheduled:
            first.setdefault(request_id, step.time_s - step.duration_s)
    return first


def _busy(engines: list[_Instance]) -> list[float]:
    return [sum(step.duration_s for step in engine.trace) for engine in engines]


def _route(items: list[WorkloadRequest], num_gpus: int, routing: str) -> list[int]:
    if routing not in ROUTINGS:
        raise ValueError(f"routing must be one of {ROUTINGS}, got {routing!r}.")
    if routing == "round_robin":
        return [i % num_gpus for i in range(len(items))]
    load, out = [0] * num_gpus, []
    for item in items:
        gpu = min(range(num_gpus), key=lambda g: (load[g], g))
        load[gpu] += len(item.prompt_token_ids) + item.output_len
        out.append(gpu)
    return out


def _run_pool(engines: list[_Instance], items: list[WorkloadRequest], gpus: list[int]) -> list[list[int]]:
    """Run each engine on its share; answer, per engine, the item indices in its local order."""
    shares = [[i for i, g in enumerate(gpus) if g == e] for e in range(len(engines))]
    for engine, share in zip(engines, shares):
        engine.run([items[i] for i in share])
    return shares


def _check_fits(engine: _Instance, item: WorkloadRequest, what: str) -> None:
    capacity = engine.kv.block_pool.num_blocks * engine.block_size
    if len(item.prompt_token_ids) + item.output_len > capacity:
        raise ValueError(f"A request of {len(item.prompt_token_ids)} prompt + {item.output_len} output tokens can "
                         f"never fit a {what} GPU's KV cache ({capacity} tokens); give that pool more KV blocks "
                         f"or shorten the workload's requests.")


class ColocatedCluster:
    """``num_gpus`` GPUs, each prefilling and decoding its share. ``settings`` go to every ``SimulatedEngine``."""

    def __init__(self, model: ModelSpec, gpu: GPU, num_gpus: int, routing: str = "round_robin", **settings) -> None:
        require_positive("num_gpus", num_gpus)
        self.model, self.gpu, self.num_gpus, self.routing, self.settings = model, gpu, num_gpus, routing, settings

    def run(self, workload: list[WorkloadRequest]) -> ClusterReport:
        engines = [_Instance(self.model, self.gpu, **self.settings) for _ in range(self.num_gpus)]
        for item in workload:
            _check_fits(engines[0], item, "colocated")
        shares = _run_pool(engines, workload, _route(workload, self.num_gpus, self.routing))
        timelines = []
        for g, (engine, share) in enumerate(zip(engines, shares)):
            for request in engine.finished:
                index = share[int(request.request_id)]
                item = workload[index]
                timelines.append(RequestTimeline(index, item.tag, item.arrival_time, tuple(request.token_times), g))
        return ClusterReport(f"colocated, {plural(self.num_gpus, 'GPU')}", self.num_gpus, sorted(timelines, key=lambda t: t.index),
                             sum(e.scheduler.total_preemptions for e in engines), _busy(engines))


class DisaggregatedCluster:
    """A prefill pool and a decode pool joined by a KV connector (see the module docstring).

    ``link_bandwidth`` (bytes/s per prefill GPU) defaults to the GPU's network bandwidth.
    ``settings`` go to every ``SimulatedEngine``; ``prefill_settings`` and ``decode_settings``
    override them for one pool (each pool tuned on its own: a big token budget for prefill, a
    KV cache of ``num_gpu_blocks`` for decode).
    """

    def __init__(self, model: ModelSpec, gpu: GPU, num_prefill: int = 1, num_decode: int = 1, *,
                 link_bandwidth: float | None = None, pipelined: bool = True, routing: str = "round_robin",
                 prefill_settings: dict | None = None, decode_settings: dict | None = None, **settings) -> None:
        require_positive("num_prefill", num_prefill)
        require_positive("num_decode", num_decode)
        self.link_bandwidth = gpu.network_bandwidth if link_bandwidth is None else link_bandwidth
        require_positive("link_bandwidth", self.link_bandwidth)
        self.model, self.gpu, self.num_prefill, self.num_decode = model, gpu, num_prefill, num_decode
        self.pipelined, self.routing, self.settings = pipelined, routing, settings
        self.prefill_settings = {**settings, **(prefill_settings or {})}
        self.decode_settings = {**settings, **(decode_settings or {})}

    def run(self, workload: list[WorkloadRequest]) -> ClusterReport:
        with cycle_collector_paused():
            return self._run(workload)

    def _run(self, workload: list[WorkloadRequest]) -> ClusterReport:
        prefills = [_Instance(self.model, self.gpu, **self.prefill_settings) for _ in range(self.num_prefill)]
        decodes = [_DecodeInstance(self.model, self.gpu, **self.decode_settings) for _ in range(self.num_decode)]
        for item in workload:
            _check_fits(prefills[0], replace(item, output_len=1, output_token_ids=None), "prefill")
            if item.output_len > 1:
                _check_fits(decodes[0], item, "decode")
        firsts = [replace(item, output_len=1, output_token_ids=item.output_token_ids and item.output_token_ids[:1])
                  for item in workload]
        shares = _run_pool(prefills, firsts, _route(firsts, self.num_prefill, self.routing))
        done, handoffs = {}, []  # handoffs: (KV ready, index, prefill GPU, exposed transfer)
        for g, (engine, share) in enumerate(zip(prefills, shares)):
            started, link_free = _first_scheduled(engine.trace), 0.0
            for request in sorted(engine.finished, key=lambda r: (r.token_times[0], int(r.request_id))):
                index, end = share[int(request.request_id)], request.token_times[0]
                item = workload[index]
                if item.output_len == 1:
                    done[index] = RequestTimeline(index, item.tag, item.arrival_time, (end,), g)
                    continue
                move = kv_transfer(self.model, len(item.prompt_token_ids), self.link_bandwidth,
                                   self.prefill_settings.get("dtype", "bf16"), self.pipelined,
                                   end - started[request.request_id])
                ready = (max(end + move.exposed_s, link_free + move.time_s) if self.pipelined
                         else max(end, link_free) + move.time_s)
                link_free = ready
                handoffs.append((ready, index, g, ready - end))
        handoffs.sort()
        moved = [replace(workload[index], arrival_time=ready) for ready, index, _, _ in handoffs]
        shares = _run_pool(decodes, moved, _route(moved, self.num_decode, self.routing))
        for d, (engine, share) in enumerate(zip(decodes, shares)):
            admitted = _first_scheduled(engine.trace)
            for request in engine.finished:
                ready, index, g, exposed = handoffs[share[int(request.request_id)]]
                item = workload[index]
                times = (admitted[request.request_id],) + tuple(request.token_times[1:])
                done[index] = RequestTimeline(index, item.tag, item.arrival_time, times, g, d, ready, exposed)
        return ClusterReport(f"disaggregated, {plural(self.num_prefill, 'prefill GPU')} + "
                             f"{plural(self.num_decode, 'decode GPU')}",
                             self.num_prefill + self.num_decode, [done[i] for i in sorted(done)],
                             sum(e.scheduler.total_preemptions for e in prefills + decodes), _busy(prefills + decodes))


def long_prompts_among_chats(document_tokens: int = 16000, num_documents: int = 4, num_chat_users: int = 32,
                             chat_output_len: int = 1000, follow_up_rate_per_s: float = 4.0, duration_s: float = 6.0,
                             seed: int = 0) -> list[WorkloadRequest]:
    """Chat users decode long answers (``document_among_chats``'s chats and follow-up turns) while
    ``num_documents`` documents of ``document_tokens`` tokens arrive, one a second from 1 s, each
    answered in 200 tokens. Invariant: only the documents' prompts depend on ``document_tokens``;
    the chats, the follow-ups and every arrival time are the same at every length, so two lengths
    are compared on the same requests."""
    require_positive("num_documents", num_documents)
    require_positive("document_tokens", document_tokens)
    # document_among_chats draws its follow-ups after its document's tokens: a 1-token document
    # there keeps them the same whatever the length, and the documents come from their own stream
    chats = [r for r in document_among_chats(num_chat_users, 1, 1.0, follow_up_rate_per_s, duration_s,
                                             chat_output_len, seed) if r.tag != "document"]
    documents = [replace(d, arrival_time=1.0 + i) for i, d in enumerate(
        document_stream(num_documents, 1.0, (document_tokens,) * 2, (200, 200), seed + 1))]
    return sorted(chats + documents, key=lambda r: r.arrival_time)


@dataclass
class DisaggregationComparison:
    """The same workload on the same number of GPUs, colocated and disaggregated."""

    colocated: ClusterReport
    disaggregated: ClusterReport
    wall_s: float = field(default=0.0)  # how long the two simulations took on this CPU

    def table(self, tag: str | None = None) -> dict[str, tuple[float, float]]:
        """metric -> (colocated, disaggregated), for one tag or all requests."""
        a, b = self.colocated.summary(tag), self.disaggregated.summary(tag)
        return {name: (a[name], b[name]) for name in a}

    def __str__(self) -> str:
        rows = [f"{'':22}{'colocated':>12}{'disaggregated':>15}"]
        rows += [f"{name:22}{a:12.1f}{b:15.1f}" for name, (a, b) in self.table().items()]
        return "\n".join([f"{self.colocated.layout} vs {self.disaggregated.layout}"] + rows)


def compare_disaggregation(model: ModelSpec | str = "Llama-3.1-8B", gpu: GPU | str = "H100-80GB", *,
                           document_tokens: int = 16000, num_prefill: int = 2, num_decode: int = 2,
                           workload: list[WorkloadRequest] | None = None, link_bandwidth: float | None = None,
                           pipelined: bool = True, routing: str = "round_robin", max_num_batched_tokens: int = 2048,
                           prefill_max_num_batched_tokens: int | None = None, **settings) -> DisaggregationComparison:
    """Serve ``workload`` (default: ``long_prompts_among_chats(document_tokens)``) on
    ``num_prefill + num_decode`` colocated GPUs and on the two pools, with the same engine
    settings everywhere (``prefill_max_num_batched_tokens`` gives the prefill pool its own budget);
    ``max_model_len`` defaults to the longest request's context."""
    model = get_model(model) if isinstance(model, str) else model
    gpu = get_gpu(gpu) if isinstance(gpu, str) else gpu
    for name, value in (("document_tokens", document_tokens), ("num_prefill", num_prefill), ("num_decode", num_decode)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number of at least 1, got {value!r}.")
    started = time.perf_counter()
    workload = long_prompts_among_chats(document_tokens) if workload is None else workload
    longest = max(len(r.prompt_token_ids) + r.output_len for r in workload)
    settings = {"max_model_len": max(longest, 1024), "max_num_batched_tokens": max_num_batched_tokens, **settings}
    colocated = ColocatedCluster(model, gpu, num_prefill + num_decode, routing, **settings).run(workload)
    disaggregated = DisaggregatedCluster(model, gpu, num_prefill, num_decode, link_bandwidth=link_bandwidth,
                                         pipelined=pipelined, routing=routing, **settings,
                                         prefill_settings=prefill_max_num_batched_tokens and
                                         {"max_num_batched_tokens": prefill_max_num_batched_tokens}).run(workload)
    return DisaggregationComparison(colocated, disaggregated, time.perf_counter() - started)
