"""The KV cache as a tiered resource: reload a prefix's KV from a tier, or recompute it.

When a prefix's KV is no longer in GPU memory (evicted, preempted, or cached by another
instance), the engine has two ways to get it back:

  reload     = KV bytes / tier bandwidth + tier latency
             = tokens x KV bytes per token (``perf.kv.model_kv_bytes_per_token``) / B + latency
  recompute  = 2 x active params x tokens / FLOP/s                     (a prefill of the prefix)
             + 4 x layers x heads x head_dim x tokens (tokens + 1) / 2 / FLOP/s
                                                  (causal QK^T and PV, only with include_attention)

Reload grows linearly with the prefix; recompute grows linearly too, but its slope per token is
about 12x larger for Llama-3.1-8B on an H100 against CPU memory, and with attention counted it
grows quadratically, so the gap widens with context. Worked example (Llama-3.1-8B, bf16 KV,
131,072 B per token): 10,100 tokens are 1.32 GB, 26.5 ms from CPU memory at 50 GB/s, against
2 x 8.03e9 x 10,100 / 500e12 = 0.32 s to recompute at 500 TFLOP/s on an H100: reload wins ~12x.

Tiers (bandwidth one way, towards the GPU, per GPU; latency is the fixed cost of one reload):

  GPU HBM           already resident: nothing to move, reload costs 0.
  CPU DRAM          over PCIe Gen5 x16 with DMA-engine copies (``cudaMemcpyAsync``), as vLLM's
                    KV offloading connector does. vLLM's blog ("Inside vLLM's new KV offloading
                    connector", blog.vllm.ai/2026/01/08/kv-offloading-connector.html) measured on
                    an H100 83.4 GB/s for the DMA engines against 68.5 GB/s for a custom copy
                    kernel, both BIDIRECTIONAL (loads and stores together). The preset takes
                    50 GB/s one way: a reload with no store beside it is bounded by the link's
                    one-way ceiling, 64 GB/s in ``perf.interconnect`` (32 GT/s x 16 lanes,
                    128b/130b: 63 GB/s), and 50 GB/s is ~80% of it, what pinned host-to-device
                    copies typically reach; it is what the worked example needs (1.3 GB / 26 ms).
                    When stores run at the same time the DMA engines' 83.4 GB/s is shared, 41.7
                    GB/s each way (``CPU_DRAM_BUSY``). Latency 10 us: a copy's launch and DMA
                    set-up, an order of magnitude, not a measurement. On a PCIe Gen4 GPU (L4,
                    A100: 32 GB/s one way) ``tier_on_gpu`` scales both CPU tiers to its link.
  local NVMe        one PCIe Gen4 x4 NVMe SSD: ~7 GB/s sequential read and ~100 us to the first
                    byte, typical datasheet figures for Gen4 drives (a Gen5 drive reads ~12-14
                    GB/s), not a measurement.
  shared KV pool    LMCache / Mooncake style, KV held in other machines' memory. Assumed: RDMA
                    through one InfiniBand NDR 400 Gb/s NIC per GPU (ConnectX-7, 50 GB/s, as
                    ``perf.interconnect``), 20 us for the hop plus the pool's lookup; or TCP over
                    100 Gb/s Ethernet at ~10 GB/s achieved (80% of the 12.5 GB/s line rate) and
                    ~200 us through the kernel's network stack. Both are assumptions.

Crossovers (``crossover_tokens``, Llama-3.1-8B on an H100 at the default FLOP/s): none for HBM,
CPU DRAM and the RDMA pool, whose latency equals the copy of only 4-8 tokens, so reload wins from
the first token; ~7 tokens for NVMe and ~10 for the TCP pool. Recompute wins long prefixes only
from a tier slower per token than the prefill itself (1 GB/s: 131 us a token against 32.5 us).

Recompute's default FLOP/s is the GPU's bf16 peak times ``DEFAULT_UTILIZATION`` (0.5, the
roofline's ``Efficiency().compute``): 494.5 TFLOP/s on an H100, close to the 500 TFLOP/s a
well-tuned prefill reaches; pass ``flops`` for an achieved figure. Left out of recompute: the
weight read that floors a short prefill's time (``weight_read_bound_below``: below a few hundred
tokens a prefill is memory-bound, so the FLOP formula understates recompute there) and per-step
overheads. Left out of reload: overlapping the copy with compute (layer-by-layer loading) and
contention with other traffic on the link.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from course_lib.checks import require_count, require_fraction, require_positive
from course_lib.perf.hardware import GPU, get_gpu
from course_lib.perf.interconnect import PCIE_GEN4, PCIE_GEN5, get_link
from course_lib.perf.kv import dtype_bytes, model_kv_bytes_per_token
from course_lib.perf.models import ModelSpec
from course_lib.perf.roofline import Efficiency

DEFAULT_UTILIZATION = Efficiency().compute
"""Share of the bf16 peak a long prefill reaches by default (0.5: 494.5 TFLOP/s on an H100)."""

DMA_BIDIRECTIONAL_BANDWIDTH = 83.4e9
"""Bytes/s, loads and stores together: vLLM's offloading connector's DMA-engine copies, H100."""

COPY_KERNEL_BIDIRECTIONAL_BANDWIDTH = 68.5e9
"""Bytes/s, loads and stores together: a custom CUDA copy kernel on the same H100 (vLLM's blog)."""

PCIE_GEN5_ONE_WAY = get_link(PCIE_GEN5).bandwidth
"""Bytes/s, one way: the PCIe Gen5 x16 ceiling from ``perf.interconnect`` (64e9)."""

CPU_DRAM_ONE_WAY = 50e9
"""Bytes/s one way for a solo reload from pinned CPU memory: ~80% of ``PCIE_GEN5_ONE_WAY``,
between half the DMA bidirectional figure (41.7e9) and the link's ceiling."""


@dataclass(frozen=True)
class KVTier:
    """Where a prefix's KV can live: ``bandwidth`` bytes/s one way to the GPU (``math.inf`` for
    memory the GPU already holds) and ``latency_s`` fixed seconds per reload.

    Invariants: bandwidth > 0, latency_s >= 0; reload time = bytes / bandwidth + latency_s."""

    name: str
    bandwidth: float
    latency_s: float
    source: str = ""

    def __post_init__(self) -> None:
        require_positive(f"KVTier {self.name!r}: bandwidth", self.bandwidth)
        if isinstance(self.latency_s, bool) or not isinstance(self.latency_s, (int, float)) \
                or not 0 <= self.latency_s < math.inf:
            raise ValueError(f"KVTier {self.name!r}: latency_s must be a finite number of seconds, 0 or more, "
                             f"got {self.latency_s!r}.")

    @property
    def resident(self) -> bool:
        """True for the GPU's own memory: nothing to move."""
        return self.bandwidth == math.inf and self.latency_s == 0


GPU_HBM = "GPU HBM (resident)"
CPU_DRAM = "CPU DRAM (PCIe Gen5, DMA)"
CPU_DRAM_BUSY = "CPU DRAM (PCIe Gen5, DMA, stores at the same time)"
LOCAL_NVME = "Local NVMe SSD (PCIe Gen4 x4)"
POOL_RDMA = "Shared KV pool (RDMA, 400 Gb/s NIC)"
POOL_TCP = "Shared KV pool (TCP, 100 Gb/s Ethernet)"

TIERS: dict[str, KVTier] = {tier.name: tier for tier in (
    KVTier(GPU_HBM, math.inf, 0.0, "Already in GPU memory: a prefix-cache hit, nothing to copy."),
    KVTier(CPU_DRAM, CPU_DRAM_ONE_WAY, 10e-6,
           "vLLM offloading connector, cudaMemcpyAsync on the DMA engines: 83.4 GB/s bidirectional "
           "(68.5 GB/s for a copy kernel) on H100 (vLLM blog); one way alone ~80% of Gen5's 64 GB/s."),
    KVTier(CPU_DRAM_BUSY, DMA_BIDIRECTIONAL_BANDWIDTH / 2, 10e-6,
           "Half of the DMA engines' 83.4 GB/s bidirectional: reloads while offloads run."),
    KVTier(LOCAL_NVME, 7e9, 100e-6,
           "Typical PCIe Gen4 x4 NVMe SSD: ~7 GB/s sequential read, ~100 us latency (Gen5: ~12-14 GB/s)."),
    KVTier(POOL_RDMA, get_gpu("H100-80GB").network_bandwidth, 20e-6,
           "Assumed LMCache/Mooncake-style pool over GPUDirect RDMA, one ConnectX-7 NDR NIC per GPU; "
           "20 us for the hop and the lookup."),
    KVTier(POOL_TCP, 10e9, 200e-6,
           "Assumed pool over TCP on 100 GbE: ~80% of the 12.5 GB/s line rate, ~200 us through the stack."),
)}


def get_tier(name: str) -> KVTier:
    """Look up a tier preset by name; the error lists the known names."""
    try:
        return TIERS[name]
    except KeyError:
        raise KeyError(f"Unknown KV tier {name!r}; choose one of {sorted(TIERS)}.") from None


PCIE_GENERATIONS = {get_link(PCIE_GEN4).bandwidth: "Gen4", PCIE_GEN5_ONE_WAY: "Gen5"}
"""The PCIe x16 generation of each one-way bandwidth a GPU preset can have (``GPU.pcie_bandwidth``)."""


def tier_on_gpu(tier: KVTier, gpu: GPU) -> KVTier:
    """``tier`` as seen from ``gpu``. The two CPU DRAM tiers' figures are for PCIe Gen5 x16 (an H100); a
    GPU on another PCIe link moves them in proportion to its one-way bandwidth, so the L4 and the
    A100 (PCIe Gen4 x16, 32 GB/s) get half of each, and the tier's name says Gen4. An assumption:
    the same share of the link as vLLM measured on an H100. The other tiers are unchanged: HBM is
    the GPU's own, and the drive or the NIC, not the GPU's PCIe slot, bounds NVMe and the pools."""
    _require_tier(tier)
    if tier.name not in (CPU_DRAM, CPU_DRAM_BUSY) or gpu.pcie_bandwidth == PCIE_GEN5_ONE_WAY:
        return tier
    link = f"PCIe {PCIE_GENERATIONS[gpu.pcie_bandwidth]}" if gpu.pcie_bandwidth in PCIE_GENERATIONS \
        else f"PCIe at {gpu.pcie_bandwidth / 1e9:g} GB/s"
    scale = gpu.pcie_bandwidth / PCIE_GEN5_ONE_WAY
    return KVTier(tier.name.replace("PCIe Gen5", link), tier.bandwidth * scale, tier.latency_s,
                  f"{tier.source} Scaled by {scale:g} for {gpu.name}'s {link} x16 ({gpu.pcie_bandwidth / 1e9:g} GB/s "
                  "one way).")


def _require_tier(tier: KVTier) -> None:
    if not isinstance(tier, KVTier):
        raise TypeError(f"tier must be a KVTier (e.g. get_tier({CPU_DRAM!r})), got {tier!r}.")


def reload_bytes(model: ModelSpec, tokens: int, kv_dtype: str = "bf16") -> float:
    """KV bytes of a ``tokens``-token prefix: tokens x ``model_kv_bytes_per_token`` (131,072 B a
    token for Llama-3.1-8B in bf16, so 10,100 tokens are 1.32 GB)."""
    require_count("tokens", tokens)
    return tokens * model_kv_bytes_per_token(model, kv_dtype)


def reload_time(model: ModelSpec, tokens: int, tier: KVTier, kv_dtype: str = "bf16") -> float:
    """Seconds to copy a ``tokens``-token prefix's KV from ``tier`` to the GPU:
    bytes / tier bandwidth + tier latency; 0 for the resident GPU tier. Linear in ``tokens``."""
    _require_tier(tier)
    size = reload_bytes(model, tokens, kv_dtype)
    return size / tier.bandwidth + tier.latency_s


def recompute_flops_per_s(gpu: GPU, flops: float | None = None,
                          utilization: float = DEFAULT_UTILIZATION) -> float:
    """FLOP/s a recompute runs at: ``flops`` when given (an achieved figure, e.g. 500e12 on an
    H100), else the GPU's dense bf16 peak x ``utilization``."""
    if flops is not None:
        require_positive("flops (achieved FLOP/s, e.g. 500e12 for an H100)", flops)
        return float(flops)
    require_fraction("utilization", utilization)
    return gpu.bf16_flops * utilization


def recompute_flops(model: ModelSpec, tokens: int, include_attention: bool = False) -> float:
    """FLOPs of a prefill of ``tokens`` tokens with nothing cached:
    2 x active parameters x tokens (the linear layers; all parameters for a dense model), plus
    with ``include_attention`` 4 x layers x heads x head_dim x tokens (tokens + 1) / 2, QK^T and PV
    over the causal pairs (token i attends i + 1 tokens), ~2 x layers x hidden x tokens^2. The
    same count as ``roofline.step_cost`` for one request ``(0, tokens)``."""
    require_count("tokens", tokens)
    total = 2 * model.active_params * tokens
    if include_attention:
        total += 4 * model.num_layers * model.num_heads * model.head_dim * tokens * (tokens + 1) / 2
    return total


def recompute_time(model: ModelSpec, tokens: int, gpu: GPU, flops: float | None = None,
                   include_attention: bool = False, utilization: float = DEFAULT_UTILIZATION) -> float:
    """Seconds to recompute a ``tokens``-token prefix's KV by prefill: ``recompute_flops`` /
    ``recompute_flops_per_s`` (2 x 8.03e9 x 10,100 / 500e12 = 0.32 s for Llama-3.1-8B on an H100).
    Linear in ``tokens``; quadratic with ``include_attention``."""
    return recompute_flops(model, tokens, include_attention) / recompute_flops_per_s(gpu, flops, utilization)


def crossover_tokens(model: ModelSpec, tier: KVTier, gpu: GPU, *, flops: float | None = None,
                     include_attention: bool = False, kv_dtype: str = "bf16",
                     utilization: float = DEFAULT_UTILIZATION, max_tokens: int | None = None) -> float | None:
    """The prompt length below which recompute is faster than reloading from ``tier``, exactly.

    With a = KV bytes per token / bandwidth, c = 2 x active params / F, q = 2 x layers x heads x
    head_dim / F (0 without attention) and L the tier's latency, recompute - reload =
    q n^2 + (c + q - a) n - L: a parabola that is -L <= 0 at n = 0, so recompute wins on [0, n*)
    and reload beyond, n* being its positive root. Returns n* (tokens, not rounded) when
    1 < n* <= ``max_tokens`` (default the model's longest context); None when reload already
    wins (or ties) from the first token, as for resident KV or a fast, low-latency tier, and None
    when recompute wins over the whole range (a slow tier without attention counted). Compare
    ``reload_time`` and ``recompute_time`` at 1 token to tell the two apart.
    """
    _require_tier(tier)
    max_tokens = model.max_context if max_tokens is None else max_tokens
    require_count("max_tokens", max_tokens)
    f = recompute_flops_per_s(gpu, flops, utilization)
    a = model_kv_bytes_per_token(model, kv_dtype) / tier.bandwidth
    c = 2 * model.active_params / f
    q = 2 * model.num_layers * model.num_heads * model.head_dim / f if include_attention else 0.0
    b, lat = c + q - a, tier.latency_s
    if q == 0 and b <= 0:
        root = math.inf if lat > 0 else 0.0  # recompute's slope is no steeper: it never loses
    else:
        disc = math.sqrt(b * b + 4 * q * lat)
        # the form without cancellation: b > 0 adds like signs, b < 0 leaves -b + disc > 0
        root = (2 * lat / (b + disc) if b + disc > 0 else 0.0) if b >= 0 else (-b + disc) / (2 * q)
    if root <= 1 or root > max_tokens:
        return None
    return root


def weight_read_bound_below(model: ModelSpec, gpu: GPU, flops: float | None = None, dtype: str = "bf16",
                            utilization: float = DEFAULT_UTILIZATION) -> float:
    """Prompt length below which a prefill is bound by reading the weights (once, at the GPU's
    HBM bandwidth) rather than by its FLOPs: weight bytes x F / (2 x active params x HBM). For a
    dense bf16 model that is F / HBM bandwidth: 148 tokens at 494.5 TFLOP/s on an H100, 295 at
    the peak. Below it recompute costs about a fixed weight read, which ``recompute_time`` leaves
    out: fixed overheads dominate short prefixes."""
    weights = model.num_params * dtype_bytes(dtype)
    return weights * recompute_flops_per_s(gpu, flops, utilization) / (2 * model.active_params * gpu.hbm_bandwidth)


@dataclass(frozen=True)
class ReloadOrRecompute:
    """One prompt length's two costs, for a table or a plot."""

    tokens: int
    kv_bytes: float
    reload_s: float
    recompute_s: float

    @property
    def speedup(self) -> float:
        """How many times faster reload is than recompute (inf when reload is free)."""
        return math.inf if self.reload_s == 0 else self.recompute_s / self.reload_s

    @property
    def winner(self) -> str:
        """'reload' or 'recompute' (a tie goes to reload: it leaves the GPU's compute free)."""
        return "reload" if self.reload_s <= self.recompute_s else "recompute"


DEFAULT_LENGTHS = (16, 64, 256, 1024, 4096, 10_100, 16_384, 32_768, 65_536, 131_072)


def reload_vs_recompute_table(model: ModelSpec, tier: KVTier, gpu: GPU,
                              lengths: tuple[int, ...] | list[int] | None = None, *, flops: float | None = None,
                              include_attention: bool = True, kv_dtype: str = "bf16",
                              utilization: float = DEFAULT_UTILIZATION) -> list[ReloadOrRecompute]:
    """Reload and recompute times over prompt lengths (default ``DEFAULT_LENGTHS`` up to the
    model's longest context), sorted, for a widget to plot. Attention is counted by default:
    a plot over long contexts should show recompute's quadratic growth."""
    _require_tier(tier)
    if lengths is None:
        lengths = [n for n in DEFAULT_LENGTHS if n <= model.max_context]
    lengths = list(lengths)
    if not lengths:
        raise ValueError("lengths is empty; pass at least one prompt length (tokens), e.g. [1024, 8192].")
    for n in lengths:
        require_count("each prompt length in lengths", n)
    return [ReloadOrRecompute(n, reload_bytes(model, n, kv_dtype), reload_time(model, n, tier, kv_dtype),
                              recompute_time(model, n, gpu, flops, include_attention, utilization))
            for n in sorted(set(lengths))]
