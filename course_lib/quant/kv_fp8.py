"""FP8 (e4m3) KV cache: the rounding a KV write applies, its inverse on read, and the scale rule.

``LLM(..., kv_cache_dtype="fp8")`` (vLLM's option) stores every layer's keys and values as
``torch.float8_e4m3fn``: one byte per element, half of bf16's two, a quarter of float32's four,
so the same memory holds two (or four) times the KV blocks. e4m3 has 4 exponent bits and 3
mantissa bits: neighbouring values are 2^-3 of a power of two apart, so rounding errs by at most
1/16 (about 6%) of the value, and its largest finite value is 448, so each tensor is stored divided
by a scale.

* **Write** (``quantize_fp8``): ``fp8(clamp(x / scale, -448, 448))``, computed in float32 and
  rounded to the nearest e4m3 value (ties to even). Clamping first saturates an out-of-range
  value at +-448 explicitly (e4m3fn has no infinity; PyTorch's CPU cast happens to saturate, but
  the clamp does not rely on what a given device's cast does).
* **Read** (``dequantize_fp8``): ``float32(code) * scale``, then cast to the model dtype.
* ``fake_quantize_fp8`` is the two in a row: what the attention of an fp8-cached model sees. The
  model's dense forward applies it when its layers carry scales (``LlamaAttention.kv_scales``), so
  the dense forward stays the paged engine's reference, and the accuracy gate's "kv-fp8" scheme
  measures exactly what the engine serves.

**Scale rule** (one per-tensor scale per layer for K and one for V, as vLLM's ``k_scale`` /
``v_scale``; vLLM reads them from the checkpoint and uses 1.0 where it has none, unless asked to
calculate them on the first batch): calibrated once, before serving, by a dense forward over ``CALIBRATION_WINDOWS``
windows of ``CALIBRATION_TOKENS`` tokens of the model's *training* corpus (never the held-out text
the gate scores), recording each layer's largest ``|K|`` (after the rotary embedding, as cached) and
largest ``|V|``. Then ``k_scale = amax_K / 200`` and ``v_scale = amax_V / 100``: the constants
vLLM's own on-the-fly calibration divides by (its ``K_SCALE_CONSTANT`` and ``V_SCALE_CONSTANT``).
The largest calibration value lands at 200 (or 100), not at 448, which leaves 2.2x (4.5x) headroom
before a larger value in an unseen prompt saturates. e4m3 is floating point, so the headroom
costs almost nothing: the relative step is the same at 2 as at 200, and only values below
2^-6 * scale (over 10,000 times smaller than the calibration max for K) lose precision. A model
whose vocabulary is not the corpus's bytes reads the corpus's token ids modulo its vocabulary.
"""

from __future__ import annotations

import torch
from torch import nn

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")  # "fp8" and "fp8_e4m3" are the same format, as in vLLM
K_SCALE_CONSTANT, V_SCALE_CONSTANT = 200.0, 100.0  # calibration max of |K| and |V| maps here
CALIBRATION_WINDOWS, CALIBRATION_TOKENS = 8, 256


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


def attention_layers(model: nn.Module) -> list[nn.Module]:
    return [layer.self_attn for layer in model.model.layers]


def calibration_inputs(vocab_size: int, windows: int = CALIBRATION_WINDOWS,
                       tokens: int = CALIBRATION_TOKENS) -> torch.Tensor:
    """``[windows, tokens]`` evenly spaced windows of the training corpus (ids modulo ``vocab_size``)."""
    from course_lib.models.train import corpus

    train, _ = corpus()
    starts = torch.linspace(0, len(train) - tokens, windows).long().tolist()
    return torch.stack([train[s:s + tokens] for s in starts]) % vocab_size


@torch.inference_mode()
def calibrate_kv_scales(model: nn.Module, inputs: torch.Tensor | None = None) -> list[tuple[float, float]]:
    """Per layer ``(k_scale, v_scale)`` by the module docstring's rule: a dense forward of ``inputs``
    (default ``calibration_inputs``) records each layer's amax of K (post-rotary) and V."""
    if inputs is None:
        inputs = calibration_inputs(model.config.vocab_size,
                                    tokens=min(CALIBRATION_TOKENS, model.config.max_position_embeddings))
    layers = attention_layers(model)
    amax = [[0.0, 0.0] for _ in layers]
    saved = [layer.kv_scales for layer in layers]
    for i, layer in enumerate(layers):
        def observe(x, rope, i=i, qkv=layer._qkv):  # the bound method, taken before the shadowing below
            q, k, v = qkv(x, rope)
            amax[i][0] = max(amax[i][0], float(k.abs().max()))
            amax[i][1] = max(amax[i][1], float(v.abs().max()))
            return q, k, v

        layer._qkv = observe  # an instance attribute shadows the method for this pass only
        layer.kv_scales = None  # observe K and V unrounded
    try:
        model.forward_dense(inputs.to(next(model.parameters()).device))
    finally:
        for layer, scales in zip(layers, saved):
            del layer._qkv
            layer.kv_scales = scales
    return [(max(k, 1e-12) / K_SCALE_CONSTANT, max(v, 1e-12) / V_SCALE_CONSTANT) for k, v in amax]


def set_kv_scales_(model: nn.Module, scales: list[tuple[float, float]] | None) -> None:
    """Give every attention layer its ``kv_scales`` (None: no fp8 rounding in the dense forward)."""
    layers = attention_layers(model)
    if scales is not None and len(scales) != len(layers):
        raise ValueError(f"{len(scales)} (k_scale, v_scale) pairs for {len(layers)} layers")
    for i, layer in enumerate(layers):
        layer.kv_scales = None if scales is None else tuple(scales[i])
