"""Module 08's design sheet: serving a DeepSeek-style mixture of experts that does not fit one node.

Given a model (``DEEPSEEK_V3``), a cluster (nodes x GPUs per node of one ``perf.hardware`` preset,
NVLink inside a node, an ``perf.interconnect`` link between nodes), a weight dtype and a layout
(attention TP x attention DP x PP GPUs, routed experts sharded EP ways across each stage's
TP x DP GPUs), ``plan_moe_serving`` computes what one GPU holds and checks the layout against
the rubric of a vLLM-style deployment:

* TP inside a node only: its blocking all-reduces (after attention and after the MLP, every
  layer) sit on the critical path and must run on NVLink, never on InfiniBand.
* EP shards the routed experts: an all-to-all dispatches each token to its top-8 experts' ranks
  and another combines the results, twice per MoE layer. Across nodes it rides InfiniBand:
  acceptable, but measure its bus bandwidth against the NIC's peak.
* DP on attention: with MLA, TP cannot split the cached latent (it has no heads to split), so
  every TP rank holds the same tokens; DP ranks each cache only their own requests.
* Idle DP ranks still run dummy forwards: the EP all-to-all is collective, so a rank with no
  requests must join every MoE layer of every step or the others hang.

Placement: ranks are numbered node by node, TP innermost, then DP, then PP (vLLM's order); the
routed experts of a stage are split EP ways, and each expert's matrices a further
``tp x dp / ep`` ways (expert tensor parallelism, innermost) when EP is smaller than the stage.

Memory per GPU, from the config's shapes (``parameter_breakdown``):

* attention (MLA): vLLM's ``DeepseekV2MLAAttention`` keeps the down-projections to the latents
  (q_a_proj 7168 x 1536, kv_a_proj_with_mqa 7168 x 576) replicated on every TP rank and splits
  the up-projections (q_b_proj, kv_b_proj) and o_proj by heads;
* dense MLP (the first 3 layers, intermediate 18432) and the shared expert: split by TP,
  replicated across DP;
* routed experts (58 layers x 256 experts x 3 x 7168 x 2048): split across all TP x DP GPUs
  of a stage, whichever way (EP, expert TP) does it;
* router (7168 x 256 per MoE layer) and embeddings + LM head: kept in bf16, as in the released
  fp8 checkpoint; embeddings split by TP (vocab-parallel);
* fp8 weights carry one fp32 scale per 128 x 128 block (the checkpoint's
  ``weight_block_size``): 1 + 4 / 16384 bytes per parameter.

Approximated: norms, biases and the KV layernorm are left out (under 0.1%); the MTP module (the
checkpoint's 62nd layer, loaded only for speculative decoding) is left out; with PP the layers
are split evenly and the heaviest stage is charged one of the embedding and the LM head; the
activation peak is one number (``activation_reserve_bytes``) where vLLM measures it.
KV per token and layer: ``perf.kv.kv_elements_per_gpu`` (576 elements for DeepSeek-V3, on every
TP rank), in 64-token blocks (FlashMLA's paged-KV block size).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from course_lib.checks import require_count
from course_lib.perf.hardware import GPU, get_gpu
from course_lib.perf.interconnect import (
    ACROSS_NODES,
    IN_NODE,
    INFINIBAND_HDR,
    INFINIBAND_NDR,
    LINKS,
    NVLINK_4,
    PCIE_GEN4,
    PCIE_GEN5,
    Link,
)
from course_lib.perf.kv import (DEFAULT_ACTIVATION_RESERVE, checked_memory_settings, dtype_bytes, kv_elements_per_gpu,
                              whole_blocks)
from course_lib.perf.models import DEEPSEEK_V3, ModelSpec
from course_lib.perf.units import GiB, plural
from course_lib.perf.vllm_all_reduce import PCIE_GROUP_MAX

WEIGHT_DTYPES = ("fp8", "bf16")
DEFAULT_GPU, DEFAULT_WEIGHT_DTYPE = "H100-80GB", "fp8"
"""The cluster the presets are laid out for: 80 GB GPUs, on which one node of 8 cannot hold
DeepSeek-V3 in any layout (``lightest_plan``) and two nodes can."""
LAYOUT_SIZES = (1, 2, 4, 8, 16, 32)
"""The TP, DP and EP sizes ``lightest_plan`` tries (PP: 1, 2, 4, 8)."""
FP8_BLOCK = 128
"""DeepSeek-V3's fp8 checkpoint scales weights in 128 x 128 blocks, one fp32 scale each."""
MLA_BLOCK_SIZE = 64
"""Tokens per paged KV block for MLA: FlashMLA's block size."""

RIGHT, WATCH, WRONG = "right", "watch", "wrong"
MARKS = {RIGHT: "✔", WATCH: "⚠", WRONG: "✘"}

COMPONENTS = ("attention", "dense MLP", "shared expert", "routed experts", "router", "embeddings + LM head")


class LayoutError(ValueError):
    """The layout cannot be built on this cluster (sizes that do not multiply out or divide)."""


def weight_bytes_per_param(dtype: str) -> float:
    """Bytes per weight: fp8 adds one fp32 scale per 128 x 128 block; bf16 is 2."""
    if dtype not in WEIGHT_DTYPES:
        raise KeyError(f"Unknown weight dtype {dtype!r}; choose one of {list(WEIGHT_DTYPES)}.")
    return dtype_bytes(dtype) + (4 / FP8_BLOCK**2 if dtype == "fp8" else 0)


@dataclass(frozen=True)
class ParameterBreakdown:
    """Parameter counts by component, derived from a ``ModelSpec``'s config fields.

    ``attention_replicated`` is MLA's down-projections (TP replicates them), ``attention_split``
    the projections TP splits by heads; ``embeddings`` counts the input embedding and the
    (untied) LM head together."""

    attention_replicated: float
    attention_split: float
    dense_mlp: float
    shared_experts: float
    routed_experts: float
    router: float
    embeddings: float
    routed_per_token: float  # the routed experts one token runs: top-k of them

    @property
    def total(self) -> float:
        return (self.attention_replicated + self.attention_split + self.dense_mlp + self.shared_experts
                + self.routed_experts + self.router + self.embeddings)

    @property
    def active(self) -> float:
        """Parameters one token multiplies by: everything but the routed experts it is not sent to
        and the input embedding, which is looked up (one row), not multiplied."""
        return self.total - self.routed_experts + self.routed_per_token - self.embeddings / 2


def parameter_breakdown(model: ModelSpec) -> ParameterBreakdown:
    """Count ``model``'s weights by component from its shapes (norms and biases left out).

    MLA attention per layer: h x q_lora + q_lora x heads x (nope + rope) [queries],
    h x (kv_lora + rope) [latent + shared RoPE key], kv_lora x heads x (nope + v) [keys and values
    from the latent], heads x v x h [output]; nope = v = ``head_dim``. Standard attention:
    Q and O of heads x head_dim, K and V of KV heads x head_dim, all split by TP.
    MLP: 3 x h x intermediate (gated). DeepSeek-V3: 187.1M attention + 44.0M per expert, 58 MoE
    layers x (256 + 1) experts, 3 dense layers of 396.4M, embeddings 2 x 926.7M: 671.0B total,
    36.7B active (DeepSeek's README_WEIGHTS: 671B and 36.6B, the paper's abstract: 37B activated)."""
    h, heads, d = model.hidden_size, model.num_heads, model.head_dim
    if model.uses_mla:
        rope, kv_lora = model.qk_rope_head_dim, model.kv_lora_rank
        q_lora = model.q_lora_rank
        if q_lora is None:  # DeepSeek-V2-Lite projects queries directly
            replicated, q_up = h * (kv_lora + rope), h * heads * (d + rope)
        else:
            replicated, q_up = h * q_lora + h * (kv_lora + rope), q_lora * heads * (d + rope)
        split = q_up + kv_lora * heads * (d + d) + heads * d * h
    else:
        replicated, split = 0, 2 * h * heads * d + 2 * h * model.num_kv_heads * d
    expert = 3 * h * model.intermediate_size
    moe_layers = model.num_moe_layers
    dense_layers = model.num_layers - moe_layers
    dense_width = model.dense_intermediate_size or model.intermediate_size
    routed = moe_layers * model.num_experts * expert if moe_layers else 0
    return ParameterBreakdown(
        attention_replicated=model.num_layers * replicated,
        attention_split=model.num_layers * split,
        dense_mlp=dense_layers * 3 * h * dense_width,
        shared_experts=moe_layers * model.num_shared_experts * expert,
        routed_experts=routed,
        router=moe_layers * h * model.num_experts,
        embeddings=2 * model.vocab_size * h,
        routed_per_token=moe_layers * model.experts_per_token * expert,
    )


def _in_node_link(gpu: GPU) -> Link:
    """GPU to GPU inside a node: NVLink named after ``gpu`` (half its datasheet's both-ways aggregate
    each way, NVLink 4's latency), else PCIe."""
    if gpu.nvlink_bandwidth:
        return Link(f"NVLink ({gpu.name}, within a node)", LINKS[NVLINK_4].alpha_s, gpu.nvlink_bandwidth / 2, IN_NODE)
    return LINKS[PCIE_GEN5 if gpu.pcie_bandwidth >= LINKS[PCIE_GEN5].bandwidth else PCIE_GEN4]


def _scale_out_link(gpu: GPU) -> Link:
    """One GPU's share of the network between nodes: its NIC (``gpu.network_bandwidth``, named after
    the InfiniBand preset of that speed), capped by the PCIe link the NIC hangs off, since a node's
    NICs sit behind PCIe. Invariant: never faster than ``gpu.pcie_bandwidth``."""
    presets = [LINKS[name] for name in (INFINIBAND_NDR, INFINIBAND_HDR)]
    nic = next((link for link in presets if link.bandwidth == gpu.network_bandwidth),
               Link(f"{gpu.network_bandwidth * 8 / 1e9:.0f} Gb/s network (across nodes)", presets[0].alpha_s,
                    gpu.network_bandwidth, ACROSS_NODES))
    if gpu.pcie_bandwidth < nic.bandwidth:
        return Link(f"{nic.name}, behind PCIe at {gpu.pcie_bandwidth / 1e9:.0f} GB/s", nic.alpha_s,
                    gpu.pcie_bandwidth, ACROSS_NODES)
    return nic


@dataclass(frozen=True)
class Cluster:
    """``nodes`` x ``gpus_per_node`` GPUs of one preset; ``scale_out`` links the nodes (by default
    each GPU's NIC behind its PCIe link, ``_scale_out_link``)."""

    nodes: int
    gpus_per_node: int
    gpu: GPU = field(default_factory=lambda: get_gpu(DEFAULT_GPU))
    scale_out: Link | None = None

    def __post_init__(self) -> None:
        require_count("nodes", self.nodes)
        require_count("gpus_per_node", self.gpus_per_node)
        if self.scale_out is None:
            object.__setattr__(self, "scale_out", _scale_out_link(self.gpu))

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def in_node(self) -> Link:
        return _in_node_link(self.gpu)

    @property
    def name(self) -> str:
        return f"{self.nodes} node{'s' if self.nodes > 1 else ''} x {self.gpus_per_node} {self.gpu.name}"

    def group_link(self, size: int) -> Link:
        """The slowest link a group of ``size`` consecutive ranks crosses, groups starting at 0."""
        return self.in_node if self.group_in_node(size) else self.scale_out

    def group_in_node(self, size: int) -> bool:
        """Whether every group of ``size`` consecutive ranks stays inside one node."""
        return size <= self.gpus_per_node and self.gpus_per_node % size == 0

    def nodes_spanned(self, size: int) -> int:
        return max(1, math.ceil(size / self.gpus_per_node))


@dataclass(frozen=True)
class Layout:
    """Attention TP x attention DP x PP GPUs; EP shards each stage's routed experts."""

    tp: int = 1
    dp: int = 1
    ep: int = 1
    pp: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "dp", "ep", "pp"):
            require_count(name, getattr(self, name))

    @property
    def stage_gpus(self) -> int:
        """GPUs of one pipeline stage: attention's TP x DP, which the MoE layers share."""
        return self.tp * self.dp

    @property
    def expert_tp(self) -> int:
        """Ways each routed expert's matrices are split inside an EP rank's share."""
        return self.stage_gpus // self.ep

    @property
    def name(self) -> str:
        parts = [f"TP={self.tp}"] + [f"{k}={v}" for k, v in (("DP", self.dp), ("PP", self.pp)) if v > 1]
        return " x ".join(parts) + (f", EP={self.ep}" if self.ep > 1 else "")


def check_layout(model: ModelSpec, cluster: Cluster, layout: Layout) -> None:
    """Raise LayoutError, with the numbers, unless ``layout`` can be built on ``cluster``."""
    product = layout.tp * layout.dp * layout.pp
    if product != cluster.num_gpus:
        raise LayoutError(
            f"TP x DP x PP = {layout.tp} x {layout.dp} x {layout.pp} = {plural(product, 'GPU')}, but the cluster "
            f"has {cluster.num_gpus} ({cluster.name}): the layout must use every GPU exactly once.")
    if layout.stage_gpus % layout.ep:
        raise LayoutError(
            f"EP={layout.ep} must divide the {plural(layout.stage_gpus, 'GPU')} (TP x DP = {layout.tp} x "
            f"{layout.dp}) that run each stage's MoE layers.")
    if model.num_experts % layout.ep:
        raise LayoutError(f"EP={layout.ep} must divide the {model.num_experts} routed experts evenly.")
    if model.num_heads % layout.tp:
        raise LayoutError(f"TP={layout.tp} must divide the {model.num_heads} attention heads.")
    if layout.pp > model.num_layers:
        raise LayoutError(f"PP={layout.pp} is more stages than the {model.num_layers} layers.")


@dataclass(frozen=True)
class Finding:
    """One rubric check: the dimension it is about, the link it lands on, a verdict (right,
    watch, wrong), what it is and why."""

    dimension: str
    link: str
    verdict: str
    text: str
    why: str

    @property
    def mark(self) -> str:
        return MARKS[self.verdict]

    @property
    def line(self) -> str:
        return f"{self.mark} {self.dimension} [{self.link}]: {self.text}. Why: {self.why}"


@dataclass(frozen=True)
class MoEServingPlan:
    """One GPU of the heaviest pipeline stage, and the rubric's findings."""

    model: ModelSpec
    cluster: Cluster
    layout: Layout
    weight_dtype: str
    kv_dtype: str
    memory: dict[str, float]  # bytes per GPU by component, in ``COMPONENTS`` order
    budget_bytes: float
    activation_reserve_bytes: float
    kv_bytes_per_token: float  # on one GPU: its stage's layers x latent (or KV heads share)
    block_size: int
    kv_tokens_per_gpu: int
    max_model_len: int
    findings: list[Finding]

    @property
    def weight_bytes(self) -> float:
        return sum(self.memory.values())

    @property
    def room_bytes(self) -> float:
        """What the weights and the KV cache share on one GPU: the budget less the activation peak."""
        return self.budget_bytes - self.activation_reserve_bytes

    @property
    def kv_cache_bytes(self) -> float:
        """What is left for KV blocks: the room less the weights (may be < 0)."""
        return self.room_bytes - self.weight_bytes

    @property
    def fits(self) -> bool:
        return self.kv_tokens_per_gpu >= self.max_model_len

    @property
    def kv_copies(self) -> int:
        """How many GPUs of a stage cache the same token: every TP rank for MLA, else 1."""
        return self.layout.tp if self.model.uses_mla else 1

    @property
    def kv_tokens_deployment(self) -> int:
        """Distinct tokens the whole deployment caches: each DP rank its own requests. A DP rank's TP
        ranks hold the same tokens (MLA: the same latent, whole; standard attention: other KV heads) and
        its PP stages other layers of them, so they add none."""
        return self.kv_tokens_per_gpu * self.layout.dp

    @property
    def wrong(self) -> list[Finding]:
        return [f for f in self.findings if f.verdict == WRONG]


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / GiB:.1f} GiB"


def memory_per_gpu(model: ModelSpec, layout: Layout, weight_dtype: str = DEFAULT_WEIGHT_DTYPE) -> dict[str, float]:
    """Weight bytes one GPU of the heaviest stage holds, by component (``COMPONENTS``)."""
    p = parameter_breakdown(model)
    w, bf16 = weight_bytes_per_param(weight_dtype), dtype_bytes("bf16")
    tp, pp = layout.tp, layout.pp
    layers = math.ceil(model.num_layers / pp) / model.num_layers  # the share of the layers on one stage
    embeddings = p.embeddings / (1 if pp == 1 else 2)  # with PP: the embedding on the first stage, the head on the last
    return {
        "attention": (p.attention_replicated + p.attention_split / tp) * w * layers,
        "dense MLP": p.dense_mlp / tp * w * layers,
        "shared expert": p.shared_experts / tp * w * layers,
        "routed experts": p.routed_experts / layout.stage_gpus * w * layers,
        "router": p.router * bf16 * layers,
        "embeddings + LM head": embeddings / tp * bf16,
    }


def _findings(model: ModelSpec, cluster: Cluster, layout: Layout, plan_numbers: dict) -> list[Finding]:
    gpn, ib, nv = cluster.gpus_per_node, cluster.scale_out, cluster.in_node
    has_nvlink = cluster.gpu.nvlink_bandwidth > 0  # else the GPUs of a node talk over PCIe
    bw = lambda link: f"{link.bandwidth / 1e9:.0f} GB/s per GPU each way"  # noqa: E731
    findings = []

    weights, budget, tokens = plan_numbers["weights"], plan_numbers["budget"], plan_numbers["tokens"]
    util = plan_numbers["utilization"]
    room = budget - plan_numbers["reserve"]
    where_room = f"{util} x {_gib(cluster.gpu.memory_bytes)}, less a {_gib(plan_numbers['reserve'])} activation peak"
    if weights > room:
        fixes = "spread the weights over more GPUs (more nodes, a larger EP), " + (
            "use fp8 weights (half of bf16), " if plan_numbers["weight_dtype"] != "fp8" else ""
        ) + "or GPUs with more memory"
        findings.append(Finding("memory", "HBM", WRONG,
                                f"weights do not fit: {_gib(weights)} per GPU > {_gib(room)} of room ({where_room})",
                                f"the server refuses to start with no room for KV blocks; {fixes}"))
    elif tokens < plan_numbers["max_model_len"]:
        findings.append(Finding("memory", "HBM", WRONG,
                                f"weights fit ({_gib(weights)} per GPU) but the KV cache holds {tokens:,} tokens, "
                                f"less than one {plan_numbers['max_model_len']:,}-token request",
                                "vLLM refuses to start when one max_model_len request cannot be cached"))
    else:
        findings.append(Finding("memory", "HBM", RIGHT,
                                f"weights fit: {_gib(weights)} per GPU of its {_gib(room)} of room ({where_room}); "
                                f"the other {_gib(room - weights)} holds {plural(tokens, 'token')} of KV",
                                "what is left after weights and the activation peak becomes paged KV blocks"))
    if plan_numbers["weight_dtype"] == "fp8" and not cluster.gpu.fp8_flops:
        findings.append(Finding("fp8 weights", "tensor cores", WATCH,
                                f"the {cluster.gpu.name} has no FP8 tensor cores: fp8 weights are stored in one byte "
                                "and widened to bf16 for every matmul",
                                "vLLM serves FP8 checkpoints on Ampere as weight-only FP8 (W8A16, Marlin kernels): "
                                "fp8's memory at bf16's compute peak; the FP8 W8A8 speed-up (module 09) needs Ada, "
                                "Hopper or Blackwell"))

    tp = layout.tp
    if tp == 1:
        findings.append(Finding("TP", "none", RIGHT, "TP=1: attention and the dense MLPs need no all-reduce",
                                "each DP rank runs attention on its own batch; nothing blocks on another GPU"))
    elif cluster.group_in_node(tp) and has_nvlink:
        findings.append(Finding("TP", nv.name, RIGHT,
                                f"TP={tp} stays inside one node: its per-layer all-reduces run on NVLink ({bw(nv)})",
                                "two blocking all-reduces per layer sit on the critical path; at decode sizes they are "
                                "latency-bound, which a fused all-reduce (+ residual + RMSNorm) over NVLink addresses, "
                                "one-shot or two-shot by message size"))
    elif cluster.group_in_node(tp):
        kernel = (f"vLLM's custom all-reduce still serves a group of {tp} over PCIe" if tp <= PCIE_GROUP_MAX else
                  f"over PCIe vLLM's custom all-reduce serves groups of {PCIE_GROUP_MAX} only, so TP={tp} runs NCCL")
        findings.append(Finding("TP", nv.name, WATCH,
                                f"TP={tp} stays inside one node, but these GPUs have no NVLink: its per-layer "
                                f"all-reduces run on {nv.name} ({bw(nv)})",
                                f"two blocking all-reduces per layer on PCIe cost far more than on NVLink, and {kernel}; "
                                "prefer fewer TP ranks (DP attention, EP for the experts) or NVLink-connected GPUs"))
    else:
        where = (f"spans {cluster.nodes_spanned(tp)} nodes" if tp > gpn
                 else f"groups straddle node boundaries ({gpn} GPUs per node is not a multiple of {tp})")
        findings.append(Finding("TP", ib.name, WRONG,
                                f"TP={tp} {where}: its per-layer all-reduce crosses {ib.name} ({bw(ib)}, "
                                f"{ib.alpha_s * 1e6:g} µs a hop, against {nv.bandwidth / 1e9:.0f} GB/s and "
                                f"{nv.alpha_s * 1e6:g} µs inside the node)",
                                "the all-reduce blocks every layer, twice: each one now pays network latency and the "
                                "NIC's bandwidth; keep TP inside a node and go across nodes with EP or DP"))

    stage, ep, etp = layout.stage_gpus, layout.ep, layout.expert_tp
    experts_per_rank = model.num_experts // ep
    if ep > 1:
        inside = cluster.group_in_node(stage)
        link = cluster.group_link(stage)
        verdict = RIGHT if inside and has_nvlink else WATCH
        across = (f"inside one node on {link.name}" if inside
                  else f"across {cluster.nodes_spanned(stage)} nodes on {link.name}")
        findings.append(Finding("EP", link.name, verdict,
                                f"EP={ep}: {experts_per_rank} routed experts per rank; all-to-all dispatch/combine "
                                f"{across}",
                                "each token goes to its top-"
                                f"{model.experts_per_token} experts' ranks and back, two all-to-alls per MoE layer; "
                                + ("fine on NVLink" if inside and has_nvlink else
                                   f"acceptable, but watch the all-to-all's busbw against the link's {bw(link)} peak "
                                   "and overlap it with compute")))
    if etp > 1:
        link = cluster.group_link(etp)
        if cluster.group_in_node(etp):
            findings.append(Finding("expert TP", link.name, WATCH,
                                    f"each routed expert is split {etp} ways inside a node "
                                    f"({model.intermediate_size / etp:g}-wide slices of its {model.intermediate_size})",
                                    "works, but slices of a small expert make small matmuls and add an all-reduce per "
                                    "MoE layer; EP over all the GPUs keeps experts whole"))
        else:
            findings.append(Finding("expert TP", link.name, WRONG,
                                    f"each routed expert is split {etp} ways across nodes: every MoE layer's "
                                    f"all-reduce crosses {link.name}",
                                    "a blocking all-reduce on the network in every MoE layer; use EP "
                                    f"(EP={stage}) so experts stay whole and only tokens travel"))

    if model.uses_mla and tp > 1:
        findings.append(Finding("attention TP and KV", "HBM", WRONG,
                                f"TP={tp} on MLA attention replicates the "
                                f"{model.kv_elements_per_token_per_layer}-element latent on all {tp} ranks: "
                                f"{tp} GPUs cache the same tokens",
                                "MLA has no KV heads to split; DP attention lets each GPU cache its own "
                                "requests, so the same memory holds up to "
                                f"{tp}x the distinct tokens"))
    if layout.dp > 1:
        if tokens:
            findings.append(Finding("DP attention", "none", RIGHT,
                                    f"DP={layout.dp} on attention: each rank batches and caches its own requests; "
                                    f"{plural(plan_numbers['deployment_tokens'], 'distinct token')} of KV across the "
                                    "deployment",
                                    "attention's KV is per request, so DP scales cache capacity and throughput without "
                                    "any per-layer collective for attention"))
        else:
            findings.append(Finding("DP attention", "none", WATCH,
                                    f"DP={layout.dp} on attention would let each rank cache its own requests, but no "
                                    "KV fits beside the weights",
                                    "fix the memory first: DP multiplies the KV the deployment holds, and zero times "
                                    f"{layout.dp} is zero"))
        if ep > 1 or etp > 1:
            findings.append(Finding("DP idle ranks", cluster.group_link(stage).name, WATCH,
                                    "a DP rank with no requests must still run dummy forwards",
                                    "the MoE layers' all-to-all (or all-reduce) needs every rank of the stage in "
                                    "every step; a rank that skips one leaves the others waiting forever"))
    if layout.pp > 1:
        inside = stage < gpn and gpn % stage == 0 and stage * layout.pp <= gpn
        link = nv if inside else ib
        findings.append(Finding("PP", link.name, RIGHT if inside else WATCH,
                                f"PP={layout.pp}: activations pass stage to stage over {link.name}",
                                "point-to-point sends of one token batch's hidden states, cheap even on InfiniBand; "
                                f"but {layout.pp} batches must be in flight or stages sit idle"))
    return findings


def plan_moe_serving(model: ModelSpec = DEEPSEEK_V3, cluster: Cluster | None = None, layout: Layout | None = None, *,
                     weight_dtype: str = DEFAULT_WEIGHT_DTYPE, kv_dtype: str = "bf16", gpu_memory_utilization: float = 0.9,
                     activation_reserve_bytes: float = DEFAULT_ACTIVATION_RESERVE,
                     max_model_len: int | None = None, block_size: int = MLA_BLOCK_SIZE) -> MoEServingPlan:
    """Memory per GPU, KV room and the rubric's findings for ``layout`` on ``cluster``.

    Raises LayoutError when the layout cannot be built (``check_layout``). Defaults: 2 nodes x 8
    ``DEFAULT_GPU`` with InfiniBand NDR, the recommended ``RECOMMENDED`` layout, fp8 weights, bf16 KV."""
    cluster = Cluster(2, 8) if cluster is None else cluster
    layout = RECOMMENDED if layout is None else layout
    check_layout(model, cluster, layout)
    max_model_len = checked_memory_settings(model, gpu_memory_utilization, block_size, max_model_len,
                                            activation_reserve_bytes)
    memory = memory_per_gpu(model, layout, weight_dtype)
    weights = sum(memory.values())
    budget = gpu_memory_utilization * cluster.gpu.memory_bytes
    layers = math.ceil(model.num_layers / layout.pp)
    per_token = layers * kv_elements_per_gpu(model, layout.tp) * dtype_bytes(kv_dtype)
    tokens = whole_blocks(budget - weights - activation_reserve_bytes, per_token * block_size) * block_size
    deployment = tokens * layout.dp  # a DP rank's TP ranks and PP stages all hold the same tokens
    numbers = dict(weights=weights, budget=budget, tokens=tokens, reserve=activation_reserve_bytes,
                   utilization=gpu_memory_utilization, max_model_len=max_model_len, deployment_tokens=deployment,
                   weight_dtype=weight_dtype)
    return MoEServingPlan(model, cluster, layout, weight_dtype, kv_dtype, memory, budget, activation_reserve_bytes,
                          per_token, block_size, tokens, max_model_len,
                          _findings(model, cluster, layout, numbers))


def lightest_plan(model: ModelSpec = DEEPSEEK_V3, cluster: Cluster | None = None, *,
                  weight_dtype: str = DEFAULT_WEIGHT_DTYPE) -> MoEServingPlan:
    """The plan of the layout whose GPUs hold the fewest weight bytes, among every layout that can be
    built on ``cluster`` (TP, DP and EP from ``LAYOUT_SIZES``, PP 1 to 8; default one node of 8
    ``DEFAULT_GPU``): if its weights do not fit, no layout's do."""
    cluster = Cluster(1, 8) if cluster is None else cluster
    lightest = None
    for tp, dp, ep, pp in itertools.product(LAYOUT_SIZES, LAYOUT_SIZES, LAYOUT_SIZES, (1, 2, 4, 8)):
        layout = Layout(tp, dp, ep, pp)
        try:
            check_layout(model, cluster, layout)
        except LayoutError:
            continue
        weights = sum(memory_per_gpu(model, layout, weight_dtype).values())
        if lightest is None or weights < lightest[0]:
            lightest = (weights, layout)
    if lightest is None:
        raise LayoutError(f"No layout with sizes from {LAYOUT_SIZES} can be built on {cluster.name}.")
    return plan_moe_serving(model, cluster, lightest[1], weight_dtype=weight_dtype)


def one_node_verdict(model: ModelSpec = DEEPSEEK_V3, gpu: GPU | None = None, gpus_per_node: int = 8, *,
                     weight_dtype: str = DEFAULT_WEIGHT_DTYPE) -> str:
    """One line: whether ``model``'s weights fit one node of ``gpus_per_node`` ``gpu`` (default
    ``DEFAULT_GPU``) in any layout, from ``lightest_plan``'s weights against the room the budget
    leaves beside the activation peak."""
    cluster = Cluster(1, gpus_per_node, get_gpu(DEFAULT_GPU) if gpu is None else gpu)
    plan = lightest_plan(model, cluster, weight_dtype=weight_dtype)
    room = plan.room_bytes
    head = f"One node of {gpus_per_node} {cluster.gpu.name}"
    if plan.weight_bytes > room:
        return (f"{head}: even the lightest layout ({plan.layout.name}) puts {_gib(plan.weight_bytes)} of "
                f"{weight_dtype} weights on each GPU, more than its {_gib(room)} of room: no layout fits, "
                f"{model.name} needs more than one node.")
    return (f"{head}: the lightest layout ({plan.layout.name}) puts {_gib(plan.weight_bytes)} of {weight_dtype} "
            f"weights on each GPU, within its {_gib(room)} of room: on these GPUs {model.name} fits one node.")


def model_summary(model: ModelSpec = DEEPSEEK_V3) -> str:
    """One line on a mixture of experts' shape, read from its config (``parameter_breakdown``)."""
    p = parameter_breakdown(model)
    cache = (f"MLA caches {model.kv_lora_rank} + {model.qk_rope_head_dim} = {model.kv_elements_per_token_per_layer} "
             "values per token and layer" if model.uses_mla else
             f"attention caches {model.kv_elements_per_token_per_layer} values per token and layer")
    return (f"{model.name}: {p.total / 1e9:.0f}B parameters, {p.active / 1e9:.1f}B active per token; "
            f"{model.num_layers} layers, the first {model.num_layers - model.num_moe_layers} dense, then "
            f"{model.num_experts} routed experts + {model.num_shared_experts} shared per layer, "
            f"{model.experts_per_token} routed per token; {cache}; the routed experts are "
            f"{p.routed_experts / p.total:.1%} of the weights.")


RECOMMENDED = Layout(tp=1, dp=16, ep=16)
"""2 nodes x 8 GPUs: DP attention on every GPU (no TP: with MLA it would only copy the latent
cache), the routed experts sharded over all 16 (16 per GPU)."""

PRESETS: dict[str, tuple[int, int, Layout]] = {
    "DP=16 attention + EP=16 (recommended)": (2, 8, RECOMMENDED),
    "TP=8 x DP=2 attention + EP=16": (2, 8, Layout(tp=8, dp=2, ep=16)),
    "TP=16 across two nodes (the bug)": (2, 8, Layout(tp=16)),
}
"""Named layouts for the design sheet: (nodes, GPUs per node, layout)."""

def tp_kernels(cluster: Cluster) -> tuple[str, str]:
    """The checklist's line on a TP group's all-reduce kernel: one-shot or two-shot by message size on
    NVLink; on PCIe GPUs, vLLM's custom kernel for pairs only and NCCL beyond (``PCIE_GROUP_MAX``)."""
    nv = cluster.in_node
    if cluster.gpu.nvlink_bandwidth:
        return ("One-shot or two-shot all-reduce for any TP group",
                f"a TP group's per-layer all-reduces are small and latency-bound: on {nv.name}, one kernel that "
                "reads the peers' buffers and fuses residual + RMSNorm beats a ring's 2(N-1) rounds; one-shot for "
                "the smallest messages, two-shot above the crossover K* (module 08, section 4)")
    return (f"TP of {PCIE_GROUP_MAX} at most on {nv.name}",
            "one- and two-shot kernels read the peers' memory at NVLink speed; over PCIe vLLM runs its custom "
            f"all-reduce for groups of {PCIE_GROUP_MAX} GPUs only and leaves larger ones to NCCL's ring, so split "
            "attention by DP and the experts by EP instead")


def serving_checklist(cluster: Cluster) -> tuple[tuple[str, str], ...]:
    """What every layout on ``cluster`` needs besides its parallelism: (practice, why), with the
    links' peaks taken from the cluster's presets."""
    nv, net = cluster.in_node, cluster.scale_out
    return (
        ("PagedAttention", f"the latent KV lives in fixed-size blocks ({MLA_BLOCK_SIZE} tokens for FlashMLA), so no "
                           "request reserves memory for its maximum length"),
        ("Continuous batching", "requests join and leave the batch every step, keeping each DP rank's batch full"),
        ("Chunked prefill", "long prompts are cut into chunks that share steps with decodes, so ITL stays bounded"),
        ("Prefix caching", "shared system prompts and earlier turns reuse their cached latents instead of prefilling"),
        tp_kernels(cluster),
        ("Watch busbw vs peak", "measure each collective's bus bandwidth (nccl-tests' busbw) against the link's peak: "
                                f"{nv.name} {nv.bandwidth / 1e9:.0f} GB/s, {net.name} {net.bandwidth / 1e9:.0f} GB/s "
                                "per GPU each way"),
    )


def memory_rows(plan: MoEServingPlan) -> list[tuple[str, str]]:
    """(component, GiB per GPU) for the sheet's table, then the weights' total, the KV room and the budget."""
    rows = [(name, f"{plan.memory[name] / GiB:.2f}") for name in COMPONENTS]
    rows += [("weights total", f"{plan.weight_bytes / GiB:.2f}"),
             ("activation peak (reserve)", f"{plan.activation_reserve_bytes / GiB:.2f}"),
             ("KV cache room", f"{max(0.0, plan.kv_cache_bytes) / GiB:.2f}"),
             (f"budget ({plan.budget_bytes / plan.cluster.gpu.memory_bytes:.2f} x {plan.cluster.gpu.name})",
              f"{plan.budget_bytes / GiB:.2f}")]
    return rows


def kv_summary(plan: MoEServingPlan) -> str:
    """One line on the KV cache: bytes per token on a GPU, tokens per GPU and across the deployment."""
    tp, layers = plan.layout.tp, math.ceil(plan.model.num_layers / plan.layout.pp)
    latent = (f"the {plan.model.kv_elements_per_token_per_layer}-element latent x {layers} layers"
              + (f", whole on each of the {tp} TP ranks" if tp > 1 else "")
              if plan.model.uses_mla else "K and V of this GPU's KV heads")
    return (f"KV per token on one GPU: {plan.kv_bytes_per_token:,.0f} B ({latent}); "
            f"{plural(plan.kv_tokens_per_gpu, 'token')} per GPU; {plural(plan.kv_tokens_deployment, 'distinct token')} "
            f"across the {plural(plan.layout.dp, 'DP rank')}.")
