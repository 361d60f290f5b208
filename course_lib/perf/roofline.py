"""Roofline step-time model: how long one engine step takes on a GPU preset.

A step computes ``num_tokens`` new tokens. Its work:
  FLOPs  = 2 x active parameters x new tokens                      (the linear layers)
         + 4 x layers x query heads x head_dim x attended pairs    (QK^T and PV; a pair is one
                                                                    new token attending one cached one)
  bytes  = weights (every parameter, read once per step)
         + KV cache read (every context token of every scheduled request, once per step)
         + KV cache written (the new tokens)
Time = max(FLOPs / (peak FLOP/s x compute efficiency), bytes / (HBM bandwidth x memory
efficiency)) + a fixed per-step overhead (``Efficiency``: 50 %, 80 % and 0.5 ms by default).
Decode steps (few tokens, much to read) land on the bandwidth roof; prefill (many tokens per
weight read) on the compute roof.

One definition of compute-bound: a step's arithmetic intensity is at or above the ridge point
of the roofs it runs against. Against the peaks that ridge is ``ridge_point`` (peak FLOP/s /
bandwidth); the step times run against the reachable roofs (the peaks times the efficiencies),
whose ridge is ``reachable_ridge_point``. ``StepCost.bound`` names the roof that sets the step's
time, which is the same test against the reachable ridge.
"""

from __future__ import annotations

from dataclasses import dataclass

from course_lib.checks import require_fraction
from course_lib.perf.hardware import GPU
from course_lib.perf.kv import dtype_bytes, model_kv_bytes_per_token
from course_lib.perf.models import ModelSpec


@dataclass(frozen=True)
class Efficiency:
    """Shares of the peaks a real engine reaches, and the fixed cost of a step (launches, scheduling)."""

    compute: float = 0.5
    memory: float = 0.8
    overhead_s: float = 0.0005

    def __post_init__(self) -> None:
        require_fraction("compute efficiency", self.compute)
        require_fraction("memory efficiency", self.memory)


AT_THE_ROOFS = Efficiency(compute=1.0, memory=1.0, overhead_s=0.0)
"""The roofs themselves: no share of a peak lost and no fixed cost per step (the textbook roofline)."""


@dataclass(frozen=True)
class StepCost:
    flops: float
    bytes: float
    compute_s: float
    memory_s: float
    overhead_s: float

    @property
    def time_s(self) -> float:
        return max(self.compute_s, self.memory_s) + self.overhead_s

    @property
    def bound(self) -> str:
        """'compute' or 'memory': which roof sets the step's time. The same as comparing the step's
        arithmetic intensity with ``reachable_ridge_point`` of the efficiency it was costed at."""
        return "compute" if self.compute_s >= self.memory_s else "memory"

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte moved."""
        return self.flops / self.bytes


@dataclass(frozen=True)
class StepPoint:
    """One step to place on a roofline: its modelled cost, and its measured time where it ran."""

    phase: str        # "prefill" or "decode" (drawn as lines), or "chosen" (drawn by the caller)
    label: str        # e.g. "prefill of 1024 tokens", "decode, batch 64"
    cost: StepCost
    measured_s: float | None = None  # the step's measured time, where it ran for real

    @property
    def time_s(self) -> float:
        """The measured time if there is one, else the roofline model's."""
        return self.cost.time_s if self.measured_s is None else self.measured_s

    @property
    def achieved_flops(self) -> float:
        """FLOP/s this step reaches: its FLOPs over its time."""
        return self.cost.flops / self.time_s


def step_cost(model: ModelSpec, gpu: GPU, requests: list[tuple[int, int]], dtype: str = "bf16",
              efficiency: Efficiency = Efficiency()) -> StepCost:
    """Cost of one step in which each request ``(cached_tokens, new_tokens)`` computes its new tokens."""
    new_tokens = pairs = context = 0
    for cached, new in requests:
        new_tokens += new
        pairs += new * cached + new * (new + 1) // 2  # new token i attends cached + i + 1 tokens
        context += cached + new
    flops = 2 * model.active_params * new_tokens + 4 * model.num_layers * model.num_heads * model.head_dim * pairs
    kv_per_token = model_kv_bytes_per_token(model, dtype)
    moved = model.num_params * dtype_bytes(dtype) + kv_per_token * (context + new_tokens)
    return StepCost(flops, moved, flops / (peak_flops(gpu, dtype) * efficiency.compute),
                    moved / (gpu.hbm_bandwidth * efficiency.memory), efficiency.overhead_s)


def peak_flops(gpu: GPU, dtype: str = "bf16") -> float:
    """The compute roof for ``dtype``: fp8 tensor cores where the GPU has them, else bf16's."""
    return gpu.fp8_flops if dtype == "fp8" and gpu.fp8_flops else gpu.bf16_flops


def ridge_point(gpu: GPU, dtype: str = "bf16") -> float:
    """FLOPs per byte where the two peak roofs meet: peak FLOP/s / memory bandwidth. Against the
    peaks, a step with a lower arithmetic intensity is memory-bound, one at or above it compute-bound."""
    return peak_flops(gpu, dtype) / gpu.hbm_bandwidth


def reachable_ridge_point(gpu: GPU, dtype: str = "bf16", efficiency: Efficiency = Efficiency()) -> float:
    """FLOPs per byte where the reachable roofs meet: (peak FLOP/s x compute efficiency) /
    (bandwidth x memory efficiency). ``step_cost`` calls a step compute-bound exactly when its
    intensity is at or above this ridge (up to rounding at the ridge itself)."""
    return ridge_point(gpu, dtype) * efficiency.compute / efficiency.memory
