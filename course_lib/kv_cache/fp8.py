"""The fp8 (e4m3) KV-cache format: the rounding a KV write applies, and its inverse on read.

``LLM(..., kv_cache_dtype="fp8")`` (vLLM's option) stores every layer's keys and values as
``torch.float8_e4m3fn``: one byte per element, half of bf16's two, a quarter of float32's four,
so the same memory holds two (or four) times the KV blocks. e4m3 has 4 exponent bits and 3
mantissa bits: neighbouring values are 2^-3 of a power of two apart, so rounding errs by at most
1/16 (about 6%) of the value, and its largest finite value is 448, so each tensor is stored divided
by a scale (how the scales are chosen: ``quant/kv_fp8.py``).

* **Write** (``quantize_fp8``): ``fp8(clamp(x / scale, -448, 448))``, computed in float32 and
  rounded to the nearest e4m3 value (ties to even). Clamping first saturates an out-of-range
  value at +-448 explicitly (e4m3fn has no infinity; PyTorch's CPU cast happens to saturate, but
  the clamp does not rely on what a given device's cast does).
* **Read** (``dequantize_fp8``): ``float32(code) * scale``, then cast to the model dtype.
* ``fake_quantize_fp8`` is the two in a row: what the attention of an fp8-cached model sees. The
  model's dense forward applies it when its layers carry scales (``LlamaAttention.kv_scales``), so
  the dense forward stays the paged engine's reference, and the accuracy gate's "kv-fp8" scheme
  measures exactly what the engine serves.

Every attention backend and kernel that writes or reads an fp8 cache uses these functions (or, in
a Triton kernel, the same arithmetic), so they all store and read the same bytes.
"""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")  # "fp8" and "fp8_e4m3" are the same format, as in vLLM


def kv_cache_torch_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The cache's element type for an ``LLM(kv_cache_dtype=...)`` value; a bad value is refused."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES} ('auto' = the model's dtype), "
                         f"got {kv_cache_dtype!r}.")
    return model_dtype if kv_cache_dtype == "auto" else FP8_DTYPE


def required_scales(kv_scales: tuple[float, float] | None) -> tuple[float, float]:
    """An fp8 cache's (k_scale, v_scale); None means the layer lost its calibration, which must fail
    loudly: silently reading at scale 1.0 would serve garbage."""
    if kv_scales is None:
        raise RuntimeError("This layer writes or reads an fp8 KV cache but carries no kv_scales: its model was "
                           "changed after the engine calibrated it. Build the LLM again with kv_cache_dtype='fp8'.")
    return kv_scales


def is_fp8(tensor: torch.Tensor) -> bool:
    return tensor.dtype == FP8_DTYPE


def quantize_fp8(x: torch.Tensor, scale: float) -> torch.Tensor:
    """``x / scale`` in float32, saturated to +-448, rounded to e4m3 (nearest, ties to even)."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def dequantize_fp8(codes: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """``codes * scale`` in float32, cast to ``dtype``."""
    return (codes.float() * scale).to(dtype)


def fake_quantize_fp8(x: torch.Tensor, scale: float) -> torch.Tensor:
    """``x`` rounded through the fp8 cache and back, in x's dtype (what attention reads)."""
    return dequantize_fp8(quantize_fp8(x, scale), scale, x.dtype)
