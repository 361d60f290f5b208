"""Quantization cost model: what fits, and which kernel wins a decode step?

Three weight schemes, each a number of bytes per weight and a tensor-core roof for the linear layers:

  BF16      2 bytes/weight; matmuls on bf16 tensor cores (``GPU.bf16_flops``).
  W4A16     weight-only int4 (GPTQ/AWQ style, run by Marlin-like kernels): 4 bits per weight plus one
            16-bit scale per group of 128 weights = 4 + 16/128 = 4.125 bits = 0.515625 bytes/weight.
            Activations stay 16-bit: the kernel dequantizes each weight tile to bf16 in registers and
            multiplies on the bf16 roof. That dequantize work is charged as a configurable fraction of
            the linear layers' compute time (``dequant_overhead``, default 0: an ideal kernel that hides
            it under the weight loads; raise it to model a kernel that falls behind at large batches).
  FP8-W8A8  1 byte/weight (e4m3), activations quantized to fp8 on the fly; matmuls on fp8 tensor cores
            (``GPU.fp8_flops``: 2x bf16 on Ada, Hopper and Blackwell). The per-channel or per-tensor
            scales (one fp32 per output row at most: < 0.01% of the bytes) are left out. A GPU with
            ``fp8_flops == 0`` (A100) has no such kernel: the model says so (``SchemeUnavailableError``)
            rather than time it on another roof. (vLLM runs FP8 checkpoints on an A100 as weight-only
            FP8 through Marlin: a W8A16 scheme, not this one.)

One decode step of ``batch`` sequences, each with ``context_len`` cached tokens, is costed with
``roofline.step_cost`` (its FLOP count, KV traffic, efficiencies and per-step overhead), then two
things change with the scheme:
  bytes   = weights at the scheme's bytes/weight (instead of bf16) + the bf16 KV cache read and written
            (``kv.model_kv_bytes_per_token(model, "bf16")`` x (context_len + 1) x batch), unchanged;
  compute = linear FLOPs (2 x active params x batch) / (scheme's peak x compute efficiency)
            x (1 + dequant_overhead for W4A16) + attention FLOPs (QK^T and PV against the bf16 KV
            cache, ``step_cost``'s count) / (bf16 peak x compute efficiency): attention stays 16-bit
            in every scheme.
  time    = max(compute, bytes / (HBM bandwidth x memory efficiency)) + overhead.

Assumptions, stated: every parameter is quantized, embeddings and ``lm_head`` included (real GPTQ, AWQ
and FP8 checkpoints usually keep those in 16 bits: 1.05B of Llama-3.1-8B's 8.03B parameters, 2.1B of
the 70B's 70.6B, so the 8B's quantized weights are ~11% (W4A16) / ~6% (FP8) heavier than modelled;
``weight_memory(..., quantized_embeddings=False)`` gives that checkpoint size);
every weight is read once per step (as in ``roofline``); activations are not counted as memory.

Invariants (tests/test_quant_cost.py): W4A16 < FP8-W8A8 < BF16 in bytes; at batch 1 (memory-bound)
W4A16 is fastest; once the step is compute-bound FP8-W8A8 is fastest wherever fp8 exists; FP8 never
wins where ``fp8_flops == 0``; whether FP8 beats W4A16 is monotone in the batch (once it wins it keeps
winning: W4A16 only loses after its compute roof passes FP8's whole memory roof), so the crossover is
a single batch size; and it does not change with tensor parallelism (``tensor_parallel_group`` scales
both roofs alike and the overhead is common to both schemes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from course_lib.checks import require_count, require_fraction, require_positive
from course_lib.perf.hardware import GPU
from course_lib.perf.kv import kv_bytes_per_batch, kv_bytes_per_sequence, weight_bytes
from course_lib.perf.models import ModelSpec
from course_lib.perf.roofline import Efficiency, StepCost, step_cost


@dataclass(frozen=True)
class QuantScheme:
    """A weight format and the tensor cores its matmuls run on.

    ``bytes_per_weight = (weight_bits + scale_bits / group_size) / 8``: one ``scale_bits`` scale
    (plus zero point, if the caller folds it into ``scale_bits``) per ``group_size`` weights.
    """

    name: str
    weight_bits: float
    compute_dtype: str  # "bf16" or "fp8": the roof its linear layers run on
    group_size: int | None = None  # weights sharing one scale; None: no per-group scales
    scale_bits: float = 0.0
    description: str = ""

    def __post_init__(self) -> None:
        require_positive(f"{self.name}: weight_bits", self.weight_bits)
        if self.compute_dtype not in ("bf16", "fp8"):
            raise ValueError(f"{self.name}: compute_dtype must be 'bf16' or 'fp8', got {self.compute_dtype!r}.")
        if self.group_size is not None:
            require_count(f"{self.name}: group_size", self.group_size)
        if self.scale_bits < 0 or (self.scale_bits and self.group_size is None):
            raise ValueError(f"{self.name}: scale_bits must be 0 or more, and needs a group_size to share "
                             f"each scale over (got scale_bits={self.scale_bits!r}, group_size={self.group_size!r}).")

    @property
    def bits_per_weight(self) -> float:
        """Weight bits plus each weight's share of its group's scale (4.125 for W4A16 with g=128)."""
        return self.weight_bits + (self.scale_bits / self.group_size if self.group_size else 0.0)

    @property
    def bytes_per_weight(self) -> float:
        return self.bits_per_weight / 8


BF16 = QuantScheme("BF16", 16, "bf16", description="bf16 weights and activations (the baseline)")
W4A16 = QuantScheme("W4A16", 4, "bf16", group_size=128, scale_bits=16,
                    description="int4 weights, one fp16 scale per 128, dequantized to bf16 in the kernel")
FP8_W8A8 = QuantScheme("FP8-W8A8", 8, "fp8", description="fp8 (e4m3) weights and activations, fp8 tensor cores")

SCHEMES: dict[str, QuantScheme] = {s.name: s for s in (BF16, W4A16, FP8_W8A8)}
SERVING_MEMORY_UTILIZATION = 0.9  # the share of GPU memory a server takes for weights and KV (vLLM's default)


class SchemeUnavailableError(ValueError):
    """The GPU has no tensor cores for the scheme's compute dtype (FP8 on an A100)."""


def get_scheme(scheme: str | QuantScheme) -> QuantScheme:
    """A scheme by name (or the scheme itself); the error lists the known names."""
    if isinstance(scheme, QuantScheme):
        return scheme
    try:
        return SCHEMES[scheme]
    except KeyError:
        raise KeyError(f"Unknown quantization scheme {scheme!r}; choose one of {sorted(SCHEMES)}.") from None


def scheme_available(scheme: str | QuantScheme, gpu: GPU) -> bool:
    """True unless the scheme needs fp8 tensor cores and ``gpu.fp8_flops == 0``."""
    return get_scheme(scheme).compute_dtype != "fp8" or gpu.fp8_flops > 0


def scheme_peak_flops(scheme: str | QuantScheme, gpu: GPU) -> float:
    """Dense FLOP/s of the tensor cores the scheme's linear layers use; raise
    ``SchemeUnavailableError`` (saying what to choose instead) where the GPU lacks them."""
    s = get_scheme(scheme)
    if s.compute_dtype == "bf16":
        return gpu.bf16_flops
    if not gpu.fp8_flops:
        raise SchemeUnavailableError(
            f"{s.name} needs fp8 tensor cores and {gpu.name} has none (fp8_flops == 0). Choose W4A16 or BF16 "
            f"on this GPU, or an Ada, Hopper or Blackwell GPU (L4, H100, H200, B200) for FP8.")
    return gpu.fp8_flops


def weight_memory(model: ModelSpec, scheme: str | QuantScheme = "BF16", quantized_embeddings: bool = True) -> float:
    """Bytes of all of ``model``'s weights in ``scheme`` (scales included): 141.2 GB for
    Llama-3.1-70B in BF16, 36.4 GB in W4A16, 70.6 GB in FP8-W8A8. With ``quantized_embeddings=False``
    the embedding and ``lm_head`` (``model.embedding_params``) stay in bf16, as GPTQ, AWQ and FP8
    checkpoints usually ship them: 39.5 GB for the 70B in W4A16, 72.7 GB in FP8-W8A8."""
    kept = 0 if quantized_embeddings else model.embedding_params
    return (model.num_params - kept) * get_scheme(scheme).bytes_per_weight + kept * BF16.bytes_per_weight


def min_gpus_for_weights(model: ModelSpec, scheme: str | QuantScheme, gpu: GPU,
                         memory_utilization: float = 1.0, quantized_embeddings: bool = True) -> int:
    """Fewest GPUs whose memory (x ``memory_utilization``) holds the weights alone (sized as
    ``weight_memory`` does), before any KV cache, activations or CUDA context: a lower bound.
    Llama-3.1-70B in BF16 (141.2 GB) needs two H100-80GB (80 GiB = 85.9 GB each); a serving
    deployment also needs room for KV blocks (``kv.plan_kv_cache``) and a tensor-parallel size that
    divides the heads."""
    require_fraction("memory_utilization", memory_utilization)
    weights = weight_memory(model, scheme, quantized_embeddings)
    return max(1, math.ceil(weights / (gpu.memory_bytes * memory_utilization)))


def max_batch_in_memory(model: ModelSpec, scheme: str | QuantScheme, gpu: GPU, context_len: int = 1024,
                        memory_utilization: float = SERVING_MEMORY_UTILIZATION) -> int:
    """Sequences of ``context_len`` tokens whose bf16 KV cache fits beside the weights in
    ``memory_utilization`` of ``gpu``'s memory (0 where the weights alone do not fit); activations are
    left out. A crossover batch above this needs more GPUs (``tensor_parallel_group``) to be reached."""
    require_fraction("memory_utilization", memory_utilization)
    left = gpu.memory_bytes * memory_utilization - weight_memory(model, scheme)
    return max(0, math.floor(left / kv_bytes_per_sequence(model, context_len, "bf16")))


def min_gpus_for_batch(model: ModelSpec, scheme: str | QuantScheme, gpu: GPU, batch: int, context_len: int = 1024,
                       memory_utilization: float = SERVING_MEMORY_UTILIZATION) -> int:
    """Fewest GPUs whose memory (x ``memory_utilization``) holds the weights and the bf16 KV cache of
    ``batch`` sequences of ``context_len`` tokens (``kv.kv_bytes_per_batch``), split over them by
    tensor parallelism; activations left out, so a lower bound. 1 where ``max_batch_in_memory`` admits
    the batch on one GPU."""
    require_fraction("memory_utilization", memory_utilization)
    needed = weight_memory(model, scheme) + kv_bytes_per_batch(model, context_len, batch, "bf16")
    return max(1, math.ceil(needed / (gpu.memory_bytes * memory_utilization)))


def decode_step_cost(model: ModelSpec, scheme: str | QuantScheme, gpu: GPU, batch: int,
                     context_len: int = 1024, efficiency: Efficiency = Efficiency(),
                     dequant_overhead: float = 0.0) -> StepCost:
    """Roofline cost of one decode step: ``batch`` sequences, each with ``context_len`` cached tokens,
    each computing one new token, with the weights in ``scheme`` and the KV cache in bf16.

    Starts from ``roofline.step_cost`` in bf16 and swaps in the scheme's weight bytes and roofs (see
    the module docstring). ``dequant_overhead`` (W4A16 only) adds that fraction to the linear layers'
    compute time. Raises ``SchemeUnavailableError`` for FP8 on a GPU without fp8 tensor cores.
    """
    s = get_scheme(scheme)
    require_count("batch", batch)
    require_count("context_len", context_len, minimum=0)
    if dequant_overhead < 0:
        raise ValueError(f"dequant_overhead is a fraction of the linear layers' compute time and must be 0 or "
                         f"more (0: dequantizing is free), got {dequant_overhead!r}.")
    peak = scheme_peak_flops(s, gpu)
    base = step_cost(model, gpu, [(context_len, 1)] * batch, dtype="bf16", efficiency=efficiency)
    linear_flops = 2 * model.active_params * batch
    attention_flops = base.flops - linear_flops
    moved = base.bytes - weight_bytes(model, "bf16") + weight_memory(model, s)
    slowdown = 1 + (dequant_overhead if s.weight_bits < 8 and s.compute_dtype == "bf16" else 0.0)
    compute_s = (linear_flops * slowdown / (peak * efficiency.compute)
                 + attention_flops / (gpu.bf16_flops * efficiency.compute))
    return StepCost(base.flops, moved, compute_s, moved / (gpu.hbm_bandwidth * efficiency.memory),
                    efficiency.overhead_s)


def decode_step_time(model: ModelSpec, scheme: str | QuantScheme, gpu: GPU, batch: int,
                     context_len: int = 1024, efficiency: Efficiency = Efficiency(),
                     dequant_overhead: float = 0.0) -> float:
    """Seconds for one decode step (``decode_step_cost(...).time_s``)."""
    return decode_step_cost(model, scheme, gpu, batch, context_len, efficiency, dequant_overhead).time_s


def best_scheme(model: ModelSpec, gpu: GPU, batch: int, context_len: int = 1024,
                efficiency: Efficiency = Efficiency(), dequant_overhead: float = 0.0,
                schemes: tuple[str | QuantScheme, ...] = tuple(SCHEMES)) -> str:
    """Name of the fastest scheme for a decode step, among those ``gpu`` can run (FP8 is skipped
    where ``fp8_flops == 0``). Equal times go to the earlier scheme in ``schemes`` (BF16 first: with
    nothing to gain, keep the weights exact). Speed only: check the weights fit with
    ``min_gpus_for_weights``, and pass ``tensor_parallel_group(gpu, n)`` for a model that needs n GPUs."""
    candidates = [get_scheme(s) for s in schemes if scheme_available(s, gpu)]
    if not candidates:
        raise SchemeUnavailableError(f"None of {[get_scheme(s).name for s in schemes]} runs on {gpu.name}; "
                                     f"include BF16 or W4A16.")
    return min(candidates, key=lambda s: decode_step_time(model, s, gpu, batch, context_len, efficiency,
                                                          dequant_overhead)).name


def _fp8_beats_w4a16(model: ModelSpec, gpu: GPU, batch: int, context_len: int, efficiency: Efficiency,
                     dequant_overhead: float) -> bool:
    return (decode_step_time(model, FP8_W8A8, gpu, batch, context_len, efficiency)
            < decode_step_time(model, W4A16, gpu, batch, context_len, efficiency, dequant_overhead))


def crossover_batch(model: ModelSpec, gpu: GPU, context_len: int = 1024, efficiency: Efficiency = Efficiency(),
                    dequant_overhead: float = 0.0, max_batch: int = 1 << 16) -> int | None:
    """Smallest decode batch at which FP8-W8A8 is strictly faster than W4A16; None where the GPU has no
    fp8 tensor cores, or where FP8 still loses at ``max_batch`` (a context long enough that the KV reads
    outgrow the compute, so the step never leaves the memory roof and W4A16's fewer bytes always win).

    FP8 wins once W4A16's compute time passes FP8's memory time, and then keeps winning (module
    docstring), so a binary search over the batch finds the edge."""
    require_count("max_batch", max_batch)
    if not scheme_available(FP8_W8A8, gpu):
        return None
    if not _fp8_beats_w4a16(model, gpu, max_batch, context_len, efficiency, dequant_overhead):
        return None
    lo, hi = 1, max_batch  # invariant: FP8 wins at hi
    if _fp8_beats_w4a16(model, gpu, lo, context_len, efficiency, dequant_overhead):
        return lo
    while hi - lo > 1:  # FP8 loses at lo
        mid = (lo + hi) // 2
        if _fp8_beats_w4a16(model, gpu, mid, context_len, efficiency, dequant_overhead):
            hi = mid
        else:
            lo = mid
    return hi


DEFAULT_TABLE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def scheme_table(model: ModelSpec, gpu: GPU, batches: tuple[int, ...] = DEFAULT_TABLE_BATCHES,
                 context_len: int = 1024, efficiency: Efficiency = Efficiency(),
                 dequant_overhead: float = 0.0) -> list[dict]:
    """One JSON-ready row per batch size, for a widget: ``{"batch", "best", "schemes": {name: {"time_s",
    "tokens_per_s", "bound", "weight_bytes"} or None where the GPU cannot run it}}``."""
    rows = []
    for batch in batches:
        cells: dict[str, dict | None] = {}
        for s in SCHEMES.values():
            if not scheme_available(s, gpu):
                cells[s.name] = None
                continue
            cost = decode_step_cost(model, s, gpu, batch, context_len, efficiency, dequant_overhead)
            cells[s.name] = {"time_s": cost.time_s, "tokens_per_s": batch / cost.time_s, "bound": cost.bound,
                             "weight_bytes": weight_memory(model, s)}
        best = min((n for n, c in cells.items() if c), key=lambda n: cells[n]["time_s"])
        rows.append({"batch": batch, "best": best, "schemes": cells})
    return rows
