"""The communication roofline: does the interconnect keep up with the math?

Compare t_comm (alpha-beta over the link that paces the collective) with t_compute (FLOPs over
peak x efficiency, or bytes over HBM bandwidth when that is slower). Whether communication
can hide behind compute, or adds to it, depends on where it sits in the step:

  DDP training    gradients (2 bytes per parameter, bf16) are ring all-reduced in buckets while
                  backward runs. Only the backward pass can hide them (see ``DDPStep``).
  tensor parallel two all-reduces per layer (after attention, after the MLP) of tokens x hidden
                  x 2 bytes. The next matmul needs the sum, so they add to the step time.
  pipeline        activations (tokens x hidden x 2 bytes) cross each stage boundary once per
                  pass; a single batch leaves every stage but one idle at any time.

A ring over GPUs of one node runs on NVLink; one that spans nodes is paced by InfiniBand at
every step (``course_lib.perf.topology``). H100 nodes of 8: NVLink 4 inside, InfiniBand NDR
(one 400 Gb/s NIC per GPU) between.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from course_lib.checks import require_positive
from course_lib.perf.hardware import get_gpu, tensor_parallel_group
from course_lib.perf.models import ModelSpec, get_model
from course_lib.perf.roofline import Efficiency, step_cost
from course_lib.perf.topology import Cluster, cluster_of, flat_ring_time, hierarchical_time
from course_lib.perf.units import MiB

DDP_BUCKET_BYTES = 25 * MiB
"""torch DDP's default bucket size (``bucket_cap_mb=25``): each bucket is one all-reduce."""

DDP_GPU_COUNTS = (8, 16, 32, 64, 128, 256, 512)
BF16_BYTES = 2
TP_ALL_REDUCES = ("flat ring", "hierarchical")


def _require_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number of at least 1, got {value!r}.")


def _require_share(name: str, value: float) -> None:
    require_positive(name, value)
    if value > 1:
        raise ValueError(f"{name} is a share of the GPU's peak and must be at most 1, got {value!r}.")


@dataclass(frozen=True)
class DDPStep:
    """One data-parallel training step, seen from one of ``num_gpus`` GPUs.

    Compute is 6 x parameters x tokens FLOPs: 2 forward, 4 backward, so backward is 2/3 of it.
    Overlap can only use the backward pass: a bucket is all-reduced once backward has produced
    its gradients, and the optimizer step (so the next forward) waits for every bucket. Hence
    the verdict ``hidden`` is comm_s <= backward_s, and with perfect overlap (even the last
    bucket hidden: optimistic by one bucket) step_s = forward_s + max(backward_s, comm_s).
    """

    num_gpus: int
    link: str  # the link that paces the gradient ring
    tokens_per_gpu: int
    compute_s: float
    comm_s: float  # every bucket's ring all-reduce, one after another
    latency_s: float  # comm_s's alpha part: buckets x 2(N-1) alpha
    num_buckets: int
    one_node_step_s: float  # the same step on one full node: the reference for scaling

    @property
    def backward_s(self) -> float:
        return self.compute_s * 2 / 3

    @property
    def forward_s(self) -> float:
        return self.compute_s - self.backward_s

    @property
    def hidden(self) -> bool:
        """Whether the gradient all-reduce fits inside the backward pass."""
        return self.comm_s <= self.backward_s

    @property
    def step_s(self) -> float:
        return _overlapped_step_s(self.compute_s, self.comm_s)

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_gpu / self.step_s

    @property
    def scaling_efficiency(self) -> float:
        """Per-GPU throughput over one full node's."""
        return self.one_node_step_s / self.step_s


def _overlapped_step_s(compute_s: float, comm_s: float) -> float:
    """Forward, then backward with the gradient all-reduce running beside it."""
    return compute_s / 3 + max(compute_s * 2 / 3, comm_s)


def _gradient_all_reduce(cluster: Cluster, grad_bytes: float, bucket_bytes: float) -> tuple[float, float, int]:
    """(seconds, alpha part, buckets) for all-reducing ``grad_bytes`` in buckets, one ring each."""
    buckets = math.ceil(grad_bytes / bucket_bytes)
    last = grad_bytes - (buckets - 1) * bucket_bytes
    total = (buckets - 1) * flat_ring_time(cluster, bucket_bytes) + flat_ring_time(cluster, last)
    return total, buckets * flat_ring_time(cluster, 0), buckets


def ddp_step(num_gpus: int, model: str = "Llama-3.2-1B", gpu: str = "H100-80GB", tokens_per_gpu: int = 4096,
             compute_efficiency: float = 0.5, bucket_bytes: float = DDP_BUCKET_BYTES,
             gpus_per_node: int = 8) -> DDPStep:
    """One DDP step of ``model`` on ``num_gpus`` GPUs (one partly filled node, or whole nodes).

    The default model is small enough for plain DDP (weights, gradients and Adam states, 16
    bytes per parameter, fit on every GPU). The ratio comm/compute barely depends on the model:
    both grow with the parameter count; it is set by tokens per GPU, bucket count and link.
    """
    _require_count("tokens_per_gpu", tokens_per_gpu)
    _require_share("compute_efficiency", compute_efficiency)
    require_positive("bucket_bytes", bucket_bytes)
    spec, chip = get_model(model), get_gpu(gpu)
    compute_s = 6 * spec.active_params * tokens_per_gpu / (chip.bf16_flops * compute_efficiency)
    grad_bytes = BF16_BYTES * spec.num_params
    cluster = cluster_of(num_gpus, gpus_per_node)
    comm_s, latency_s, buckets = _gradient_all_reduce(cluster, grad_bytes, bucket_bytes)
    one_node_comm_s, _, _ = _gradient_all_reduce(cluster_of(gpus_per_node, gpus_per_node), grad_bytes, bucket_bytes)
    return DDPStep(num_gpus, cluster.ring_link.name, tokens_per_gpu, compute_s, comm_s, latency_s, buckets,
                   _overlapped_step_s(compute_s, one_node_comm_s))


def ddp_sweep(gpu_counts: tuple[int, ...] = DDP_GPU_COUNTS, **kwargs) -> list[DDPStep]:
    """``ddp_step`` at each GPU count (same keyword arguments), for the "throughput per GPU
    collapses from 8 to 512 GPUs" diagnosis: from 8 to 16 the ring leaves NVLink for InfiniBand
    (9x less bandwidth per GPU); beyond, its 2(N-1) alpha per bucket grows linearly with N.
    That latency term is the flat ring's: at this scale NCCL turns to trees (log N hops)."""
    return [ddp_step(n, **kwargs) for n in gpu_counts]


def _requests(phase: str, num_tokens: int, context_tokens: int) -> list[tuple[int, int]]:
    """Decode: ``num_tokens`` sequences of one new token each; prefill: one chunk of
    ``num_tokens``. Either way after ``context_tokens`` already in the KV cache."""
    _require_count("num_tokens", num_tokens)
    if isinstance(context_tokens, bool) or not isinstance(context_tokens, int) or context_tokens < 0:
        raise ValueError(f"context_tokens must be a whole number, 0 or more, got {context_tokens!r}.")
    if phase == "decode":
        return [(context_tokens, 1)] * num_tokens
    if phase == "prefill":
        return [(context_tokens, num_tokens)]
    raise ValueError(f"phase must be 'decode' or 'prefill', got {phase!r}.")


def _sharded(spec: ModelSpec, tp: int) -> ModelSpec:
    """``spec`` as tensor parallelism over ``tp`` GPUs sees it: every GPU keeps at least one KV
    head, so beyond tp = KV heads they are replicated (as vLLM does) and KV bytes stop shrinking."""
    if spec.num_heads % tp or (tp > spec.num_kv_heads and tp % spec.num_kv_heads):
        raise ValueError(f"tensor parallel size {tp} must divide {spec.name}'s {spec.num_heads} attention heads "
                         f"(and be a multiple of its {spec.num_kv_heads} KV heads when larger).")
    return replace(spec, num_kv_heads=tp) if tp > spec.num_kv_heads else spec


def _compute_s(spec: ModelSpec, gpu: str, tp: int, requests: list[tuple[int, int]], efficiency: Efficiency) -> float:
    """One pass of ``spec`` on a TP group: the slower of its roofs (per-step overhead left out)."""
    cost = step_cost(_sharded(spec, tp), tensor_parallel_group(get_gpu(gpu), tp), requests, efficiency=efficiency)
    return max(cost.compute_s, cost.memory_s)


def _tp_all_reduce_s(spec: ModelSpec, tp: int, num_tokens: int, gpus_per_node: int, all_reduce: str) -> float:
    """One all-reduce of the activations (tokens x hidden, bf16) over a TP group of ``tp`` GPUs,
    by a flat ring or hierarchically (the two agree inside one node)."""
    cluster, num_bytes = cluster_of(tp, gpus_per_node), num_tokens * spec.hidden_size * BF16_BYTES
    if all_reduce == "flat ring":
        return flat_ring_time(cluster, num_bytes)
    if all_reduce == "hierarchical":
        return hierarchical_time(cluster, num_bytes).total_s
    raise ValueError(f"all_reduce must be one of {TP_ALL_REDUCES}, got {all_reduce!r}.")


@dataclass(frozen=True)
class TPLayer:
    """One transformer layer under tensor parallelism: its shard's compute, then (on the
    critical path, not overlapped) its two all-reduces."""

    tp: int
    num_tokens: int
    link: str
    compute_s: float
    all_reduce_s: float  # both all-reduces

    @property
    def layer_s(self) -> float:
        return self.compute_s + self.all_reduce_s

    @property
    def comm_share(self) -> float:
        return self.all_reduce_s / self.layer_s


def tp_layer(tp: int, num_tokens: int, phase: str = "decode", context_tokens: int = 1024,
             model: str = "Llama-3.1-70B", gpu: str = "H100-80GB", gpus_per_node: int = 8,
             efficiency: Efficiency = Efficiency(), all_reduce: str = "flat ring") -> TPLayer:
    """A layer's compute (the roofline of ``course_lib.perf.roofline``: FLOPs or weight and KV
    bytes, whichever is slower, divided over the layers) and its two all-reduces, for a TP group
    inside one node (NVLink) or spanning whole nodes (paced by InfiniBand)."""
    spec = get_model(model)
    compute_s = _compute_s(spec, gpu, tp, _requests(phase, num_tokens, context_tokens), efficiency) / spec.num_layers
    return TPLayer(tp, num_tokens, cluster_of(tp, gpus_per_node).ring_link.name, compute_s,
                   2 * _tp_all_reduce_s(spec, tp, num_tokens, gpus_per_node, all_reduce))


@dataclass(frozen=True)
class ParallelLayout:
    """One placement of the model (TP x PP, times DP replicas) and one batch's pass through it.

    ``latency_s`` is what one batch waits: every stage in turn, with its TP all-reduces and
    the activation sends between stages (the sampled token ids that return to the first stage, a
    few bytes, are left out). With a single batch in flight each stage works 1/pp of
    the time (``busy_share_one_batch``); ``tokens_per_s`` assumes pp x dp batches in flight
    (micro-batches filling the pipeline, one per replica), every GPU busy.
    """

    name: str
    tp: int
    pp: int
    dp: int
    phase: str
    num_tokens: int  # one batch's tokens (decode: its sequences)
    tp_link: str
    pp_link: str  # the slowest link between stages; "" without pipeline stages
    compute_s: float  # summed over the stages
    tp_comm_s: float  # 2 all-reduces per layer, every layer
    pp_comm_s: float  # activations across the pp - 1 stage boundaries

    @property
    def latency_s(self) -> float:
        return self.compute_s + self.tp_comm_s + self.pp_comm_s

    @property
    def batches_in_flight(self) -> int:
        return self.pp * self.dp

    @property
    def tokens_per_s(self) -> float:
        return self.batches_in_flight * self.num_tokens / self.latency_s

    @property
    def busy_share_one_batch(self) -> float:
        return 1 / self.pp


def _layout_name(tp: int, pp: int, dp: int) -> str:
    """'TP=8 x PP=2' and the like: the sizes above 1."""
    parts = [f"{kind}={size}" for kind, size in (("TP", tp), ("PP", pp), ("DP", dp)) if size > 1]
    return " x ".join(parts) or "TP=1"


def parallel_layout(tp: int, pp: int = 1, dp: int = 1, phase: str = "decode", num_tokens: int = 64,
                    context_tokens: int = 1024, model: str = "Llama-3.1-70B", gpu: str = "H100-80GB",
                    gpus_per_node: int = 8, efficiency: Efficiency = Efficiency(),
                    all_reduce: str = "flat ring") -> ParallelLayout:
    """One batch of ``num_tokens`` through ``model`` laid out as TP x PP (x DP replicas) on H100
    nodes. Stage s holds layers [s L/pp, (s+1) L/pp) on GPUs [s tp, (s+1) tp) of its replica."""
    for name, value in (("tp", tp), ("pp", pp), ("dp", dp)):
        _require_count(name, value)
    spec, chip = get_model(model), get_gpu(gpu)
    if spec.num_layers % pp:
        raise ValueError(f"pp={pp} must divide {spec.name}'s {spec.num_layers} layers into equal stages.")
    if spec.num_params * BF16_BYTES / (tp * pp) > chip.memory_bytes:
        raise ValueError(f"{spec.name}'s bf16 weights do not fit on {tp * pp} {chip.name}: raise tp x pp.")
    stage = replace(spec, num_layers=spec.num_layers // pp, num_params=spec.num_params / pp)
    requests = _requests(phase, num_tokens, context_tokens)
    compute_s = pp * _compute_s(stage, gpu, tp, requests, efficiency)
    tp_comm_s = 2 * spec.num_layers * _tp_all_reduce_s(spec, tp, num_tokens, gpus_per_node, all_reduce)
    node = cluster_of(gpus_per_node, gpus_per_node)
    crosses = [s * tp // gpus_per_node != (s + 1) * tp // gpus_per_node for s in range(pp - 1)]
    links = [node.across_nodes if crossing else node.in_node for crossing in crosses]
    slowest = max(links, key=lambda link: link.beta).name if links else ""
    activation_bytes = num_tokens * spec.hidden_size * BF16_BYTES
    return ParallelLayout(_layout_name(tp, pp, dp), tp, pp, dp, phase, num_tokens,
                          cluster_of(tp, gpus_per_node).ring_link.name, slowest,
                          compute_s, tp_comm_s, sum(link.time(activation_bytes) for link in links))


def two_node_layouts(decode_tokens: int = 64, prefill_tokens: int = 2048, context_tokens: int = 1024,
                     model: str = "Llama-3.1-70B", gpu: str = "H100-80GB", gpus_per_node: int = 8,
                     efficiency: Efficiency = Efficiency(), all_reduce: str = "flat ring") -> list[ParallelLayout]:
    """The spot-the-bug: ``tensor_parallel_size=16`` across two nodes, against the fix (TP = GPUs
    per node, PP = nodes) and two single-node TP replicas, for a decode step (sequences with
    ``context_tokens`` cached) and a first prefill chunk.

    With the default flat ring, each of TP=16's 2 x layers all-reduces pays 2 x 15 InfiniBand
    hops. ``all_reduce="hierarchical"`` shows how much of that a two-level all-reduce wins
    back: on these presets TP=16's latency then comes close to TP=8 x PP=2's, or below it,
    though it still serves one batch where the fix keeps two in flight."""
    shapes = [(2 * gpus_per_node, 1, 1), (gpus_per_node, 2, 1), (gpus_per_node, 1, 2)]
    return [parallel_layout(tp, pp, dp, phase, tokens, context, model, gpu, gpus_per_node, efficiency, all_reduce)
            for phase, tokens, context in (("decode", decode_tokens, context_tokens), ("prefill", prefill_tokens, 0))
            for tp, pp, dp in shapes]
