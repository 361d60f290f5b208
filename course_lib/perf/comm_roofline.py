"""The communication roofline: does the interconnect keep up with the math?

Compare t_comm (alpha-beta over the link that paces the collective) with t_compute (FLOPs over
peak x efficiency, or bytes over HBM bandwidth when that is slower). Whether communication
can hide behind compute, or adds to it, depends on where it sits in the step:

  DDP training    gradients are all-reduced in buckets while backward runs, 2 bytes per
                  parameter by default (bf16 gradients: a bf16 model, or DDP's
                  bf16_compress_hook; plain DDP under autocast all-reduces fp32 gradients, pass
                  ``grad_bytes_per_param=4``). Only backward can hide them (see ``DDPStep``).
  tensor parallel two all-reduces per layer (after attention, after the MLP) of tokens x hidden
                  x 2 bytes. The next matmul needs the sum, so they add to the step time.
  pipeline        activations (tokens x hidden x 2 bytes) cross each stage boundary once per
                  micro-batch, 1/TP from each TP rank, all-gathered on the receiving side (as
                  vLLM does); micro-batches keep every stage busy.

All-reduces are NCCL's rings by default (``course_lib.perf.topology``): inside one node they run
on NVLink; across M nodes their latency is NCCL's own count, 2(M-1) InfiniBand hops and the
rest NVLink ones (no barrier between steps), and the bytes go through all of a node's NICs
(``nics_per_node``, one per GPU by default). H100 nodes of 8: NVLink 4
inside (450 GB/s each way), InfiniBand NDR between (400 Gb/s = 50 GB/s per NIC).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from course_lib.checks import require_count, require_fraction, require_positive
from course_lib.perf.hardware import get_gpu, tensor_parallel_group
from course_lib.perf.models import ModelSpec, get_model
from course_lib.perf.roofline import Efficiency, step_cost
from course_lib.perf.topology import (
    ALL_REDUCES,
    Cluster,
    all_reduce_latency,
    all_reduce_time,
    cluster_of,
    h100_cluster,
    nccl_ring_all_gather_time,
)
from course_lib.perf.units import MiB

DDP_BUCKET_BYTES = 25 * MiB
"""torch DDP's default bucket size (``bucket_cap_mb=25``): each bucket is one all-reduce."""

DDP_GPU_COUNTS = (8, 16, 32, 64, 128, 256, 512)
BF16_BYTES = 2
TP_ALL_REDUCES = ALL_REDUCES
"""The all-reduces a TP group (or DDP's gradients) can use, NCCL's rings first."""


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
    link: str  # the slowest link the all-reduce crosses: NVLink in a node, else InfiniBand
    tokens_per_gpu: int
    compute_s: float
    comm_s: float  # every bucket's all-reduce, one after another
    latency_s: float  # comm_s's alpha part for ``all_reduce``: buckets x its time for 0 bytes
    # (NCCL's rings: 2(N-M) alpha_n + 2(M-1) alpha_x; tree: 2(L-1) alpha_n + 2 log2 M alpha_x)
    num_buckets: int
    one_node_step_s: float  # the same step on one full node: the reference for scaling
    all_reduce: str  # one of ALL_REDUCES
    grad_bytes: float  # all-reduced per step: parameters x grad_bytes_per_param

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


def _gradient_all_reduce(cluster: Cluster, grad_bytes: float, bucket_bytes: float,
                         all_reduce: str) -> tuple[float, float, int]:
    """(seconds, alpha part, buckets) for all-reducing ``grad_bytes`` in buckets, one all-reduce each."""
    buckets = math.ceil(grad_bytes / bucket_bytes)
    last = grad_bytes - (buckets - 1) * bucket_bytes
    total = ((buckets - 1) * all_reduce_time(cluster, bucket_bytes, all_reduce)
             + all_reduce_time(cluster, last, all_reduce))
    return total, buckets * all_reduce_latency(cluster, all_reduce), buckets


def ddp_step(num_gpus: int, model: str = "Llama-3.2-1B", gpu: str = "H100-80GB", tokens_per_gpu: int = 4096,
             compute_efficiency: float = 0.5, bucket_bytes: float = DDP_BUCKET_BYTES,
             gpus_per_node: int = 8, nics_per_node: int | None = None, grad_bytes_per_param: float = BF16_BYTES,
             all_reduce: str = "nccl rings") -> DDPStep:
    """One DDP step of ``model`` on ``num_gpus`` GPUs (one partly filled node, or whole nodes
    with ``nics_per_node`` NDR NICs each, one per GPU by default).

    The default model is small enough for plain DDP: with mixed-precision Adam every GPU holds
    bf16 weights and gradients, fp32 master weights and two fp32 Adam moments, 2 + 2 + 4 + 4 + 4
    = 16 bytes per parameter. The gradients all-reduced are ``grad_bytes_per_param`` bytes per
    parameter: 2 for bf16 gradients (a bf16 model, or DDP's bf16_compress_hook); plain DDP of an
    fp32 model under autocast all-reduces fp32 gradients, 4. ``all_reduce`` is NCCL's rings by
    default, or another of ``ALL_REDUCES`` ("tree": NCCL's trees across nodes). The ratio
    comm/compute barely depends on the model (both grow with the parameter count); it is set
    by tokens per GPU, bucket count, link and algorithm.
    """
    require_count("tokens_per_gpu", tokens_per_gpu)
    require_fraction("compute_efficiency", compute_efficiency)
    require_positive("bucket_bytes", bucket_bytes)
    require_positive("grad_bytes_per_param", grad_bytes_per_param)
    spec, chip = get_model(model), get_gpu(gpu)
    compute_s = 6 * spec.active_params * tokens_per_gpu / (chip.bf16_flops * compute_efficiency)
    grad_bytes = grad_bytes_per_param * spec.num_params
    cluster = cluster_of(num_gpus, gpus_per_node, nics_per_node)
    comm_s, latency_s, buckets = _gradient_all_reduce(cluster, grad_bytes, bucket_bytes, all_reduce)
    one_node_comm_s, _, _ = _gradient_all_reduce(cluster_of(gpus_per_node, gpus_per_node), grad_bytes,
                                                 bucket_bytes, all_reduce)
    return DDPStep(num_gpus, cluster.ring_link.name, tokens_per_gpu, compute_s, comm_s, latency_s, buckets,
                   _overlapped_step_s(compute_s, one_node_comm_s), all_reduce, grad_bytes)


def ddp_sweep(gpu_counts: tuple[int, ...] = DDP_GPU_COUNTS, **kwargs) -> list[DDPStep]:
    """``ddp_step`` at each GPU count (same keyword arguments), for the "throughput per GPU
    collapses from 8 to 512 GPUs" diagnosis. With NCCL's rings on rail-optimised nodes (a NIC
    per GPU) the bandwidth hardly drops at the node boundary: 8 NICs x 50 GB/s = 400 GB/s
    against NVLink's 450 GB/s each way. The collapse comes from the rings' latency per bucket,
    2(N-M) NVLink alphas and 2(M-1) InfiniBand ones, which grows with N: the reason NCCL turns
    to trees (2 log2 M network hops and 2(L-1) NVLink ones) at scale, ``all_reduce="tree"``.
    With one NIC per node (``nics_per_node=1``) the bandwidth collapses at the boundary
    instead, 50 GB/s against 450."""
    return [ddp_step(n, **kwargs) for n in gpu_counts]


def _requests(phase: str, num_tokens: int, context_tokens: int, prompt_tokens: int) -> list[tuple[int, int]]:
    """Decode: ``num_tokens`` sequences of one new token each; prefill: ``num_tokens`` new tokens
    as prompts of ``prompt_tokens`` each. Either way after ``context_tokens`` already cached."""
    require_count("num_tokens", num_tokens)
    require_count("context_tokens", context_tokens, minimum=0)
    if phase == "decode":
        return [(context_tokens, 1)] * num_tokens
    if phase == "prefill":
        require_count("prompt_tokens", prompt_tokens)
        if num_tokens % prompt_tokens:
            raise ValueError(f"a prefill batch of {num_tokens} tokens does not split into prompts of "
                             f"{prompt_tokens}: use a multiple of prompt_tokens.")
        return [(context_tokens, prompt_tokens)] * (num_tokens // prompt_tokens)
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


def _tp_all_reduce_s(spec: ModelSpec, tp: int, num_tokens: int, gpus_per_node: int, nics_per_node: int | None,
                     all_reduce: str) -> float:
    """One all-reduce of the activations (tokens x hidden, bf16) over a TP group of ``tp`` GPUs
    by one of ``ALL_REDUCES`` (all of them NVLink rings inside one node)."""
    num_bytes = num_tokens * spec.hidden_size * BF16_BYTES
    return all_reduce_time(cluster_of(tp, gpus_per_node, nics_per_node), num_bytes, all_reduce)


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
             efficiency: Efficiency = Efficiency(), all_reduce: str = "nccl rings",
             nics_per_node: int | None = None) -> TPLayer:
    """A layer's compute (the roofline of ``course_lib.perf.roofline``: FLOPs or weight and KV
    bytes, whichever is slower, divided over the layers) and its two all-reduces, for a TP group
    inside one node (NVLink) or spanning whole nodes (InfiniBand hops at the node boundaries).
    Decode: ``num_tokens`` sequences; prefill: one prompt of ``num_tokens``."""
    spec = get_model(model)
    requests = _requests(phase, num_tokens, context_tokens, num_tokens)
    compute_s = _compute_s(spec, gpu, tp, requests, efficiency) / spec.num_layers
    return TPLayer(tp, num_tokens, cluster_of(tp, gpus_per_node).ring_link.name, compute_s,
                   2 * _tp_all_reduce_s(spec, tp, num_tokens, gpus_per_node, nics_per_node, all_reduce))


@dataclass(frozen=True)
class ParallelLayout:
    """One placement of the model (TP x PP, times DP replicas) serving ``total_tokens`` at once,
    split into ``batches_in_flight`` = pp x dp equal batches of ``num_tokens``: one per replica,
    pp micro-batches per pipeline.

    ``latency_s`` is what one batch waits: every stage in turn, with its TP all-reduces and
    the activation hand-offs between stages (``pp_comm_s``: each a send and an all-gather) (the sampled token ids that return to the first stage, a
    few bytes, are left out); for decode it is the inter-token latency. In steady state the pp
    micro-batches take turns on the stages, so every GPU is busy and each batch moves on once
    per ``latency_s``: ``tokens_per_s`` = total_tokens / latency_s. (With a single batch in flight
    each stage would work 1/pp of the time, ``busy_share_one_batch``.)
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
    pp_comm_s: float  # activations across the pp - 1 stage boundaries: sends of 1/tp, then all-gathers

    @property
    def latency_s(self) -> float:
        return self.compute_s + self.tp_comm_s + self.pp_comm_s

    @property
    def batches_in_flight(self) -> int:
        return self.pp * self.dp

    @property
    def total_tokens(self) -> int:
        """Tokens (decode: sequences) the layout serves at once, the same for every layout compared."""
        return self.batches_in_flight * self.num_tokens

    @property
    def tokens_per_s(self) -> float:
        return self.total_tokens / self.latency_s

    @property
    def busy_share_one_batch(self) -> float:
        return 1 / self.pp


def _layout_name(tp: int, pp: int, dp: int) -> str:
    """'TP=8 x PP=2' and the like: the sizes above 1."""
    parts = [f"{kind}={size}" for kind, size in (("TP", tp), ("PP", pp), ("DP", dp)) if size > 1]
    return " x ".join(parts) or "TP=1"


def parallel_layout(tp: int, pp: int = 1, dp: int = 1, phase: str = "decode", num_tokens: int = 128,
                    context_tokens: int = 1024, model: str = "Llama-3.1-70B", gpu: str = "H100-80GB",
                    gpus_per_node: int = 8, efficiency: Efficiency = Efficiency(),
                    all_reduce: str = "nccl rings", nics_per_node: int | None = None,
                    prompt_tokens: int = 2048) -> ParallelLayout:
    """``model`` laid out as TP x PP (x DP replicas) on H100 nodes, serving ``num_tokens`` in
    total (decode: sequences, each with ``context_tokens`` cached; prefill: prompts of
    ``prompt_tokens``), split into pp x dp equal batches. Stage s holds layers [s L/pp,
    (s+1) L/pp) on GPUs [s tp, (s+1) tp) of its replica. Between stages the activations move as
    vLLM moves them (``send_tensor_dict`` with ``all_gather_group``): see ``stage_handoff_s``."""
    for name, value in (("tp", tp), ("pp", pp), ("dp", dp)):
        require_count(name, value)
    spec, chip = get_model(model), get_gpu(gpu)
    if spec.num_layers % pp:
        raise ValueError(f"pp={pp} must divide {spec.name}'s {spec.num_layers} layers into equal stages.")
    if spec.num_params * BF16_BYTES / (tp * pp) > chip.memory_bytes:
        raise ValueError(f"{spec.name}'s bf16 weights do not fit on {tp * pp} {chip.name}: raise tp x pp.")
    require_count("num_tokens", num_tokens)
    if num_tokens % (pp * dp):
        raise ValueError(f"num_tokens={num_tokens} must split into pp x dp = {pp * dp} equal batches.")
    batch = num_tokens // (pp * dp)
    stage = replace(spec, num_layers=spec.num_layers // pp, num_params=spec.num_params / pp)
    compute_s = pp * _compute_s(stage, gpu, tp, _requests(phase, batch, context_tokens, prompt_tokens), efficiency)
    tp_comm_s = 2 * spec.num_layers * _tp_all_reduce_s(spec, tp, batch, gpus_per_node, nics_per_node, all_reduce)
    node = h100_cluster(1, gpus_per_node, nics_per_node)
    crosses = [s * tp // gpus_per_node != (s + 1) * tp // gpus_per_node for s in range(pp - 1)]
    activation_bytes = batch * spec.hidden_size * BF16_BYTES
    sends = [stage_handoff_s(activation_bytes, tp, crossing, gpus_per_node, nics_per_node) for crossing in crosses]
    slowest = "" if not crosses else (node.across_nodes if any(crosses) else node.in_node).name
    return ParallelLayout(_layout_name(tp, pp, dp), tp, pp, dp, phase, batch,
                          cluster_of(tp, gpus_per_node).ring_link.name, slowest, compute_s, tp_comm_s, sum(sends))


def stage_handoff_s(activation_bytes: float, tp: int, across_nodes: bool, gpus_per_node: int = 8,
                    nics_per_node: int | None = None) -> float:
    """Seconds to hand ``activation_bytes`` (one micro-batch's tokens x hidden, bf16) from one
    pipeline stage of ``tp`` ranks to the next, as vLLM does: each TP rank sends its 1/tp of
    them to its peer, then the receiving stage all-gathers them (NCCL's rings).

    The send: across nodes, through the rank's NIC, which the min(tp, gpus_per_nic) ranks
    sharing it send through one after another, back to back (one alpha_x):
    alpha_x + min(tp, gpus_per_nic) x activation_bytes / tp / NIC bandwidth. Inside one node,
    over NVLink, every rank on its own link: alpha_n + activation_bytes / tp / NVLink bandwidth.
    The all-gather over the receiving tp ranks: (tp-1) alpha_n + (tp-1)/tp x activation_bytes
    / NVLink bandwidth when they share a node (none for tp = 1); a stage wider than a node
    all-gathers with NCCL's rings over its nodes (``nccl_ring_all_gather_time``).
    """
    require_count("tp", tp)
    node = h100_cluster(1, gpus_per_node, nics_per_node)
    share = activation_bytes / tp
    if across_nodes:
        send_s = node.across_nodes.alpha_s + min(tp, node.gpus_per_nic) * share * node.across_nodes.beta
    else:
        send_s = node.in_node.time(share)
    gather_s = nccl_ring_all_gather_time(cluster_of(tp, gpus_per_node, nics_per_node), activation_bytes)
    return send_s + gather_s


def two_node_layouts(decode_tokens: int = 128, prefill_tokens: int = 4096, context_tokens: int = 1024,
                     model: str = "Llama-3.1-70B", gpu: str = "H100-80GB", gpus_per_node: int = 8,
                     efficiency: Efficiency = Efficiency(), all_reduce: str = "nccl rings",
                     nics_per_node: int | None = None, prompt_tokens: int = 2048) -> list[ParallelLayout]:
    """The spot-the-bug: ``tensor_parallel_size=16`` across two nodes, against the fix (TP = GPUs
    per node, PP = nodes) and two single-node TP replicas (the simplest fix when the model fits
    on a node), at equal concurrency: every layout serves ``decode_tokens`` sequences (with
    ``context_tokens`` cached) in a decode step, and ``prefill_tokens`` of new prompts of
    ``prompt_tokens`` each in a prefill step. TP=16 runs them as one batch, TP=8 x PP=2 as two
    micro-batches of half, TP=8 x DP=2 as half per replica.

    TP=16's 2 x layers all-reduces sit on the critical path and cross the network. With NCCL's
    rings each pays 38 us of latency (28 NVLink hops and 2 InfiniBand ones), against 14 us
    inside a node: on the defaults the fix serves about 1.23x TP=16's tokens/s in decode and
    1.34x in prefill. ``all_reduce="tree"`` cuts the latency to 24 us: TP=16 then comes within
    about 1-2% of the fix in decode, while prefill's large all-reduces still cost it about 1.3x
    (1.5x with the hierarchical scheme's added-up phases). So how much the bug costs in decode
    rests on the all-reduce's latency."""
    shapes = [(2 * gpus_per_node, 1, 1), (gpus_per_node, 2, 1), (gpus_per_node, 1, 2)]
    return [parallel_layout(tp, pp, dp, phase, tokens, context, model, gpu, gpus_per_node, efficiency, all_reduce,
                            nics_per_node, prompt_tokens)
            for phase, tokens, context in (("decode", decode_tokens, context_tokens), ("prefill", prefill_tokens, 0))
            for tp, pp, dp in shapes]
