"""Calibration of an fp8 (e4m3) KV cache: one K and one V scale per layer, from text the caller gives.

The cache's format (how a write rounds and a read scales back) is ``kv_cache/fp8.py``; this file
chooses the scales. **Scale rule** (one per-tensor scale per layer for K and one for V, as vLLM's
``k_scale`` / ``v_scale``; vLLM reads them from the checkpoint and uses 1.0 where it has none,
unless asked to calculate them on the first batch): calibrated once, before serving, by a dense
forward over ``CALIBRATION_WINDOWS`` evenly spaced windows of ``CALIBRATION_TOKENS`` tokens of the
token stream passed in (the engine and the accuracy gate pass the model's *training* corpus, never
the held-out text the gate scores), recording each layer's largest ``|K|`` (after the rotary
embedding, as cached) and largest ``|V|``. Then ``k_scale = amax_K / 200`` and
``v_scale = amax_V / 100``: the constants vLLM's own on-the-fly calibration divides by (its
``K_SCALE_CONSTANT`` and ``V_SCALE_CONSTANT``). The largest calibration value lands at 200 (or
100), not at 448, which leaves 2.2x (4.5x) headroom before a larger value in an unseen prompt
saturates. e4m3 is floating point, so the headroom costs almost nothing: the relative step is the
same at 2 as at 200, and only values below 2^-6 * scale (over 10,000 times smaller than the
calibration max for K) lose precision. A model whose vocabulary is not the text's bytes reads
its token ids modulo its vocabulary.

The text is an argument so that quantization does not depend on how (or whether) the model was
trained here: ``quant`` imports no training code.
"""

from __future__ import annotations

import torch
from torch import nn

K_SCALE_CONSTANT, V_SCALE_CONSTANT = 200.0, 100.0  # calibration max of |K| and |V| maps here
CALIBRATION_WINDOWS, CALIBRATION_TOKENS = 8, 256


def attention_layers(model: nn.Module) -> list[nn.Module]:
    return [layer.self_attn for layer in model.model.layers]


def calibration_inputs(text: torch.Tensor, vocab_size: int, windows: int = CALIBRATION_WINDOWS,
                       tokens: int = CALIBRATION_TOKENS) -> torch.Tensor:
    """``[windows, tokens]`` evenly spaced windows of the token stream ``text`` (ids modulo ``vocab_size``)."""
    if text.dim() != 1 or len(text) < tokens:
        raise ValueError(f"text must be one token stream of at least {tokens} ids (a 1-D tensor), got shape "
                         f"{tuple(text.shape)}; pass the training corpus, e.g. course_lib.models.corpus.corpus()[0].")
    starts = torch.linspace(0, len(text) - tokens, windows).long().tolist()
    return torch.stack([text[s:s + tokens] for s in starts]) % vocab_size


@torch.inference_mode()
def calibrate_kv_scales(model: nn.Module, text: torch.Tensor) -> list[tuple[float, float]]:
    """Per layer ``(k_scale, v_scale)`` by the module docstring's rule: a dense forward of windows of
    the token stream ``text`` records each layer's amax of K (post-rotary) and V."""
    inputs = calibration_inputs(text, model.config.vocab_size,
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
