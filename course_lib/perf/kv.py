"""KV-cache sizing and the memory plan a vLLM-style server makes at start-up.

bytes per token = layers x ``kv_elements_per_token_per_layer`` x bytes per element: for standard
attention (MHA, GQA, MQA) that is 2 (K and V) x KV heads x head dim; for multi-head latent attention
(DeepSeek's MLA) one compressed latent of kv_lora_rank + qk_rope_head_dim elements (576 for
DeepSeek-V3), shared by every head. Tensor parallelism splits standard attention's KV heads across
the ranks (replicated once the ranks outnumber them); it cannot split MLA's latent, which every
rank of the TP group holds whole.
At start-up the server keeps ``gpu_memory_utilization x GPU memory`` for itself, loads
the weights, reserves room for the activation peak, and cuts what is left into KV blocks
of ``block_size`` tokens. If nothing is left, or not even one ``max_model_len`` request
fits, or ``max_model_len`` is longer than the model's context, it refuses to start with an error
that says what to change.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from course_lib.checks import require_fraction, require_positive
from course_lib.perf.hardware import GPU
from course_lib.perf.models import ModelSpec
from course_lib.perf.units import GiB, format_bytes, plural

DTYPE_BYTES: dict[str, float] = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1, "int4": 0.5}

DEFAULT_ACTIVATION_RESERVE = 1 * GiB
"""Stand-in for the activation peak vLLM measures with a profiling forward pass."""


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of a dtype name such as 'bf16' or 'fp8'."""
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise KeyError(f"Unknown dtype {dtype!r}; choose one of {sorted(DTYPE_BYTES)}.") from None


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, bytes_per_element: float) -> float:
    """KV-cache bytes one token occupies: 2 x layers x KV heads x head dim x bytes."""
    for name, value in (
        ("num_layers", num_layers),
        ("num_kv_heads", num_kv_heads),
        ("head_dim", head_dim),
        ("bytes_per_element", bytes_per_element),
    ):
        require_positive(name, value)
    return 2 * num_layers * num_kv_heads * head_dim * bytes_per_element


def kv_heads_per_gpu(model: ModelSpec, tensor_parallel_size: int = 1) -> int:
    """KV heads each GPU stores under tensor parallelism (replicated once TP exceeds them).

    Standard attention only: an MLA model caches no K and V per head (``kv_elements_per_gpu``)."""
    require_positive("tensor_parallel_size", tensor_parallel_size)
    if model.uses_mla:
        raise ValueError(f"{model.name} uses multi-head latent attention: it caches one latent per token and "
                         f"layer, shared by all heads, not K and V per KV head; use kv_elements_per_gpu.")
    return math.ceil(model.num_kv_heads / tensor_parallel_size)


def kv_elements_per_gpu(model: ModelSpec, tensor_parallel_size: int = 1) -> int:
    """KV elements one GPU of a ``tensor_parallel_size`` group caches per token and layer:
    2 x its share of the KV heads x head dim for standard attention; the whole MLA latent
    (kv_lora_rank + qk_rope_head_dim) on every rank for MLA, whatever the TP size."""
    require_positive("tensor_parallel_size", tensor_parallel_size)
    if model.uses_mla:
        return model.kv_elements_per_token_per_layer
    return 2 * kv_heads_per_gpu(model, tensor_parallel_size) * model.head_dim


@functools.lru_cache(maxsize=256)  # the simulator asks once per step
def model_kv_bytes_per_token(model: ModelSpec, kv_dtype: str = "fp16", tensor_parallel_size: int = 1) -> float:
    """KV bytes per token for ``model`` on one GPU of a ``tensor_parallel_size`` group:
    layers x ``kv_elements_per_gpu`` x bytes per element (70,272 B for DeepSeek-V3 in bf16, on every
    TP rank)."""
    return model.num_layers * kv_elements_per_gpu(model, tensor_parallel_size) * dtype_bytes(kv_dtype)


def kv_bytes_per_sequence(model: ModelSpec, context_len: int, kv_dtype: str = "fp16") -> float:
    """KV bytes for one sequence of ``context_len`` tokens."""
    require_positive("context_len", context_len)
    return context_len * model_kv_bytes_per_token(model, kv_dtype)


def kv_bytes_per_batch(model: ModelSpec, context_len: int, batch_size: int, kv_dtype: str = "fp16") -> float:
    """KV bytes for ``batch_size`` sequences of ``context_len`` tokens each."""
    require_positive("batch_size", batch_size)
    return batch_size * kv_bytes_per_sequence(model, context_len, kv_dtype)


def weight_bytes(model: ModelSpec, dtype: str = "bf16", tensor_parallel_size: int = 1) -> float:
    """Weight bytes per GPU: parameters x bytes per parameter / TP size."""
    require_positive("tensor_parallel_size", tensor_parallel_size)
    return model.num_params * dtype_bytes(dtype) / tensor_parallel_size


class KVCacheMemoryError(ValueError):
    """The server cannot start: the memory plan leaves too little room for KV blocks."""


class MaxModelLenError(ValueError):
    """The server cannot start: ``max_model_len`` is longer than the model's context."""


@dataclass(frozen=True)
class KVCachePlan:
    """How one GPU's memory splits at start-up. ``num_blocks`` may be 0 here; ``plan_kv_cache``
    only returns plans with ``num_blocks * block_size >= max_model_len``."""

    gpu_memory_bytes: float
    budget_bytes: float
    weight_bytes: float
    activation_reserve_bytes: float
    kv_cache_bytes: float
    block_size: int
    block_bytes: float
    num_blocks: int
    max_model_len: int

    @property
    def bytes_per_token(self) -> float:
        return self.block_bytes / self.block_size

    @property
    def max_tokens(self) -> int:
        """Tokens the whole KV cache holds."""
        return self.num_blocks * self.block_size

    @property
    def max_concurrency(self) -> float:
        """How many ``max_model_len`` requests fit at once (vLLM logs this at start-up)."""
        return self.max_tokens / self.max_model_len


def whole_blocks(kv_cache_bytes: float, block_bytes: float) -> int:
    """Whole KV blocks of ``block_bytes`` that fit in ``kv_cache_bytes``; 0 when nothing is left."""
    return max(0, math.floor(kv_cache_bytes / block_bytes))


def checked_memory_settings(model: ModelSpec, gpu_memory_utilization: float, block_size: int,
                            max_model_len: int | None, activation_reserve_bytes: float) -> int:
    """Raise ``ValueError`` naming the setting unless each is in range; return ``max_model_len``
    (the model's longest context when None)."""
    require_fraction("gpu_memory_utilization", gpu_memory_utilization)
    require_positive("block_size", block_size)
    max_model_len = model.max_context if max_model_len is None else max_model_len
    require_positive("max_model_len", max_model_len)
    if activation_reserve_bytes < 0:
        raise ValueError(f"activation_reserve_bytes must be 0 or more, got {activation_reserve_bytes!r}.")
    return max_model_len


def split_memory(
    model: ModelSpec,
    gpu: GPU,
    *,
    gpu_memory_utilization: float = 0.9,
    max_model_len: int | None = None,
    block_size: int = 16,
    dtype: str = "bf16",
    kv_dtype: str | None = None,
    tensor_parallel_size: int = 1,
    activation_reserve_bytes: float = DEFAULT_ACTIVATION_RESERVE,
) -> KVCachePlan:
    """Split one GPU's memory into weights, activation peak and KV blocks, without judging the result.

    ``max_model_len`` defaults to the model's longest context, ``kv_dtype`` to ``dtype``.
    """
    max_model_len = checked_memory_settings(model, gpu_memory_utilization, block_size, max_model_len,
                                            activation_reserve_bytes)
    budget = gpu_memory_utilization * gpu.memory_bytes
    weights = weight_bytes(model, dtype, tensor_parallel_size)
    block_bytes = model_kv_bytes_per_token(model, kv_dtype or dtype, tensor_parallel_size) * block_size
    kv_cache_bytes = budget - weights - activation_reserve_bytes
    return KVCachePlan(
        gpu_memory_bytes=gpu.memory_bytes,
        budget_bytes=budget,
        weight_bytes=weights,
        activation_reserve_bytes=activation_reserve_bytes,
        kv_cache_bytes=kv_cache_bytes,
        block_size=block_size,
        block_bytes=block_bytes,
        num_blocks=whole_blocks(kv_cache_bytes, block_bytes),
        max_model_len=max_model_len,
    )


def plan_kv_cache(model: ModelSpec, gpu: GPU, **settings) -> KVCachePlan:
    """The memory split a server starts with; raise, stating the numbers and the fixes, where a real
    server would refuse to start: ``MaxModelLenError`` for a ``max_model_len`` beyond the model's
    context, ``KVCacheMemoryError`` when the KV cache cannot hold one ``max_model_len`` request.
    Every fix the error names is computed for these settings and lets the server start.
    ``settings`` are ``split_memory``'s."""
    plan = split_memory(model, gpu, **settings)
    if plan.max_model_len > model.max_context:
        raise MaxModelLenError(
            f"max_model_len={plan.max_model_len} is longer than {model.name} supports: its config.json allows "
            f"{model.max_context:,} tokens (max_position_embeddings), and a server refuses at start-up to serve "
            f"positions the model was never trained on. Fix: set max_model_len to {model.max_context} or less, "
            f"or leave it unset (the server then takes the model's {model.max_context:,})."
        )
    if plan.max_tokens >= plan.max_model_len:
        return plan
    dtype = settings.get("dtype", "bf16")
    setting = (
        f"{model.name} on {gpu.name} ({format_bytes(gpu.memory_bytes)}), "
        f"gpu_memory_utilization={settings.get('gpu_memory_utilization', 0.9)}, "
        f"tensor_parallel_size={settings.get('tensor_parallel_size', 1)}"
    )
    fixes = _fixes(model, gpu, settings)
    if plan.num_blocks == 0:
        fixed_costs = (f"the {dtype} weights take {format_bytes(plan.weight_bytes)} and the activation peak "
                       f"{format_bytes(plan.activation_reserve_bytes)}")
        if plan.kv_cache_bytes < 0:
            left = f"{format_bytes(-plan.kv_cache_bytes)} more than it may use, so nothing is left for KV blocks"
        else:
            left = (f"leaving {format_bytes(plan.kv_cache_bytes)}, less than one {plan.block_size}-token block "
                    f"({format_bytes(plan.block_bytes)})")
        raise KVCacheMemoryError(
            f"No available memory for the cache blocks ({setting}). The server may use "
            f"{format_bytes(plan.budget_bytes)} of {format_bytes(gpu.memory_bytes)}, but {fixed_costs}: {left}. "
            + fixes + "use a GPU with more memory; or quantize the weights."
        )
    raise KVCacheMemoryError(
        f"The KV cache cannot hold one request of max_model_len={plan.max_model_len} tokens ({setting}). "
        f"That request needs {plan.max_model_len} x {format_bytes(plan.bytes_per_token)} = "
        f"{format_bytes(plan.max_model_len * plan.bytes_per_token)} of KV cache, but only "
        f"{format_bytes(plan.num_blocks * plan.block_bytes)} is left ({plan.num_blocks} blocks of "
        f"{plan.block_size} tokens = {plan.max_tokens} tokens) after the weights "
        f"({format_bytes(plan.weight_bytes)}) and the activation peak "
        f"({format_bytes(plan.activation_reserve_bytes)}). "
        + fixes + f"lower max_model_len to {plan.max_tokens} or less; or lower max_num_seqs (a smaller "
        f"activation peak)."
    )


def _starts(model: ModelSpec, gpu: GPU, settings: dict, **change) -> bool:
    """Whether a server with ``settings`` changed by ``change`` holds one ``max_model_len`` request."""
    plan = split_memory(model, gpu, **{**settings, **change})
    return plan.max_tokens >= plan.max_model_len


def utilization_to_start(model: ModelSpec, gpu: GPU, **settings) -> float | None:
    """The least ``gpu_memory_utilization``, in hundredths, at which the server starts with the other
    ``settings`` unchanged; None when even 1.0 is not enough."""
    plan = split_memory(model, gpu, **settings)
    needed = (plan.weight_bytes + plan.activation_reserve_bytes
              + math.ceil(plan.max_model_len / plan.block_size) * plan.block_bytes)
    first = max(1, math.floor(needed / plan.gpu_memory_bytes * 100))  # rounding decides the last hundredth
    return next((hundredths / 100 for hundredths in range(first, 101)
                 if _starts(model, gpu, settings, gpu_memory_utilization=hundredths / 100)), None)


TENSOR_PARALLEL_SIZES = (1, 2, 4, 8)  # one node's GPUs


def tensor_parallel_to_start(model: ModelSpec, gpu: GPU, **settings) -> int | None:
    """The smallest tensor-parallel size of one node (2, 4 or 8), larger than the current one and
    dividing the model's attention heads (as vLLM requires), at which the server starts with the
    other ``settings`` unchanged; None when there is none."""
    current = settings.get("tensor_parallel_size", 1)
    return next((size for size in TENSOR_PARALLEL_SIZES if size > current and model.num_heads % size == 0
                 and _starts(model, gpu, settings, tensor_parallel_size=size)), None)


def _fixes(model: ModelSpec, gpu: GPU, settings: dict) -> str:
    """'Fixes: ...; ' for a server that does not start: the utilization and the tensor-parallel size
    that would start it, each only where one exists (the caller appends its own fixes)."""
    fixes = []
    utilization = utilization_to_start(model, gpu, **settings)
    if utilization is not None:
        fixes.append(f"raise gpu_memory_utilization to {utilization:.2f} or more"
                     + (" (0.9, the default, is enough)" if utilization <= 0.9 else ""))
    size = tensor_parallel_to_start(model, gpu, **settings)
    if size is not None:
        weights = format_bytes(weight_bytes(model, settings.get("dtype", "bf16"), size))
        kv = ("the whole latent KV cache, which TP cannot split" if model.uses_mla
              else f"{plural(kv_heads_per_gpu(model, size), 'KV head')} of {model.num_kv_heads}")
        fixes.append(f"use tensor_parallel_size={size} (each GPU then holds {weights} of weights and {kv})")
    short = "" if utilization is not None else "Not even gpu_memory_utilization=1.0 would be enough with these settings. "
    return short + "Fixes: " + "".join(fix + "; " for fix in fixes)
