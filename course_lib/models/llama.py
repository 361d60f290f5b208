"""A Llama-style decoder: RMSNorm, rotary positions, grouped-query attention, SwiGLU.

Module and parameter names match Hugging Face's ``LlamaForCausalLM`` (and ``Qwen2ForCausalLM``,
the same decoder with q/k/v biases) exactly, so a state dict moves between them unchanged. The
model runs two ways:
  * ``forward_dense(ids[B, T])``: plain causal attention over whole sequences (training,
    and the reference generation every engine test compares against);
  * ``forward(ids[N], positions[N], kv_caches, metadata)``: a flat batch of new tokens from
    many requests whose past keys and values live in a paged KV cache (the engine's path).
Both read every setting of the config (rotary theta and scaling, biases, head_dim) the same way,
so they give the same logits.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.kv_cache.fp8 import fake_quantize_fp8
from course_lib.kv_cache.metadata import AttentionMetadata

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


@dataclass(frozen=True)
class RopeScaling:
    """Hugging Face's ``rope_scaling``: how rotary frequencies stretch past the pretraining context.

    ``linear``: every frequency divided by ``factor`` (positions compressed ``factor`` times).
    ``llama3``: wavelengths longer than ``original_max_position_embeddings / low_freq_factor`` are
    stretched ``factor`` times, those shorter than ``... / high_freq_factor`` kept, and the ones
    between interpolated linearly in ``original_max_position_embeddings / wavelength``.
    """

    rope_type: str
    factor: float
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    original_max_position_embeddings: int | None = None

    def __post_init__(self) -> None:
        if self.rope_type not in ("linear", "llama3"):
            raise ValueError(f"rope_type {self.rope_type!r} (rope_parameters / rope_scaling) is not supported; "
                             f"use default, linear or llama3.")
        if self.factor is None:
            raise ValueError(f"{self.rope_type} rope scaling needs factor.")
        if self.rope_type != "llama3":
            return
        missing = [name for name in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
                   if getattr(self, name) is None]
        if missing:
            raise ValueError(f"llama3 rope scaling needs {', '.join(missing)}.")
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError("llama3 rope scaling needs low_freq_factor < high_freq_factor.")

    def to_hf_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class LlamaConfig:
    """Shape and maths of the model; field names follow Hugging Face's ``LlamaConfig``.

    ``head_dim`` defaults to ``hidden_size // num_attention_heads``; ``eos_token_ids`` to
    ``(eos_token_id,)``, and always starts with ``eos_token_id``. ``model_type`` "qwen2" adds
    q/k/v biases (Qwen2 has no ``attention_bias``/``mlp_bias``; Llama's ``attention_bias`` biases
    q, k, v and o).
    """

    vocab_size: int = 258
    hidden_size: int = 192
    num_hidden_layers: int = 6
    num_attention_heads: int = 6
    num_key_value_heads: int = 2
    intermediate_size: int = 512
    max_position_embeddings: int = 1024
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    bos_token_id: int = 256
    eos_token_id: int = 257
    eos_token_ids: tuple[int, ...] = ()
    head_dim: int | None = None
    rope_scaling: RopeScaling | None = None
    attention_bias: bool = False
    mlp_bias: bool = False
    model_type: str = "llama"

    def __post_init__(self) -> None:
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError("hidden_size must be a multiple of num_attention_heads (or give head_dim).")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads.")
        object.__setattr__(self, "eos_token_ids", tuple(self.eos_token_ids) or (self.eos_token_id,))
        if self.eos_token_ids[0] != self.eos_token_id:
            raise ValueError(f"eos_token_ids {self.eos_token_ids} must start with eos_token_id {self.eos_token_id}; "
                             f"to change the EOS id, give both (e.g. dataclasses.replace(config, eos_token_id="
                             f"{self.eos_token_id}, eos_token_ids=({self.eos_token_id},))).")
        if self.model_type not in ARCHITECTURES:
            raise ValueError(f"model_type {self.model_type!r} is not supported; use one of {sorted(ARCHITECTURES)}.")
        if self.model_type == "qwen2" and (self.attention_bias or self.mlp_bias):
            raise ValueError("Qwen2 has q/k/v biases only: attention_bias and mlp_bias must be False.")

    @property
    def qkv_bias(self) -> bool:
        """Whether q_proj, k_proj and v_proj have biases (o_proj has one only with ``attention_bias``)."""
        return self.attention_bias or self.model_type == "qwen2"

    def to_hf_dict(self) -> dict:
        """A ``config.json`` that Hugging Face ``transformers`` (4.x and 5.x) loads as this model."""
        data = {**asdict(self), "architectures": [ARCHITECTURES[self.model_type]], "hidden_act": "silu",
                "torch_dtype": "bfloat16"}
        data["eos_token_id"] = list(data.pop("eos_token_ids")) if len(self.eos_token_ids) > 1 else self.eos_token_id
        data["rope_scaling"] = self.rope_scaling and self.rope_scaling.to_hf_dict()
        if self.model_type == "qwen2":
            del data["attention_bias"], data["mlp_bias"]
            data["use_sliding_window"] = False
        return data

    @classmethod
    def from_hf_dict(cls, data: dict, generation_eos: int | list[int] | None = None) -> "LlamaConfig":
        """Read a Llama- or Qwen2-style ``config.json`` (old top-level ``rope_theta``/``rope_scaling``
        or transformers 5's ``rope_parameters``); ``generation_eos`` is ``generation_config.json``'s
        ``eos_token_id``, added to the EOS ids. Raises ``ValueError`` naming the field for any setting
        that changes the maths and is not implemented here."""
        _refuse_unsupported(data)
        model_type = data.get("model_type", "llama")
        known = {k: data[k] for k in cls.__dataclass_fields__ if data.get(k) is not None}
        known.setdefault("num_key_value_heads", data["num_attention_heads"])
        known["rope_theta"], known["rope_scaling"] = _rope_from_hf(data)
        if model_type == "qwen2":  # Qwen2's modelling has fixed biases whatever the config says
            known.pop("attention_bias", None), known.pop("mlp_bias", None)
        eos = list(dict.fromkeys(_token_ids(data.get("eos_token_id")) + _token_ids(generation_eos)))
        if eos:
            known["eos_token_id"], known["eos_token_ids"] = eos[0], tuple(eos)
        return cls(**known)


def _token_ids(value: int | list[int] | None) -> list[int]:
    return [] if value is None else [value] if isinstance(value, int) else list(value)


def _refuse_unsupported(data: dict) -> None:
    """Raise for config settings that change the maths and that this model does not implement."""
    if data.get("hidden_act", "silu") not in ("silu", "swish"):  # transformers' two names for x * sigmoid(x)
        raise ValueError(f"hidden_act {data['hidden_act']!r} is not supported: this model's MLP uses silu.")
    if data.get("use_sliding_window"):
        raise ValueError("use_sliding_window: true is not supported: attention here is always full-context.")
    if any(kind != "full_attention" for kind in data.get("layer_types") or []):
        raise ValueError(f"layer_types {data['layer_types']} is not supported: only full_attention layers.")
    if data.get("quantization_config"):
        raise ValueError("quantization_config is not supported: load a checkpoint with unquantized weights.")


def _rope_from_hf(data: dict) -> tuple[float, RopeScaling | None]:
    """``(rope_theta, rope_scaling)`` from either the old or the transformers 5 config format."""
    params = data.get("rope_parameters") or data.get("rope_scaling") or {}
    if any(isinstance(value, dict) for value in params.values()):
        raise ValueError("rope_parameters per layer type is not supported: one rotary setting for all layers.")
    theta = params.get("rope_theta") or data.get("rope_theta") or 10000.0
    partial = params.get("partial_rotary_factor") or data.get("partial_rotary_factor") or 1.0
    if partial != 1.0:
        raise ValueError(f"partial_rotary_factor {partial} is not supported: rotary covers the whole head_dim.")
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type == "default":
        return theta, None
    if rope_type != "llama3":  # linear has a factor only; RopeScaling refuses any other type
        return theta, RopeScaling(rope_type, params.get("factor"))
    return theta, RopeScaling(rope_type, params.get("factor"), params.get("low_freq_factor"),
                              params.get("high_freq_factor"), params.get("original_max_position_embeddings")
                              or data.get("max_position_embeddings"))


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_inv_freq(config: LlamaConfig, device: torch.device) -> torch.Tensor:
    """Radians per position of each rotary pair, ``[head_dim / 2]``: 1 / theta^(2i / head_dim), then
    stretched as ``config.rope_scaling`` says (see ``RopeScaling``)."""
    dim, scaling = config.head_dim, config.rope_scaling
    inv_freq = 1.0 / config.rope_theta ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim)
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    # llama3: weight 0 (stretch) for long wavelengths, 1 (keep) for short ones, linear between
    periods_in_context = scaling.original_max_position_embeddings * inv_freq / (2 * math.pi)
    keep = ((periods_in_context - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor))
    keep = keep.clamp(0.0, 1.0)
    return (1 - keep) * inv_freq / scaling.factor + keep * inv_freq


def rotary(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype):
    """cos and *signed* sin tables (``[*positions.shape, head_dim]``) for rotary embeddings, HF
    layout: ``signed_sin`` is sin with its first half negated, which ``apply_rotary`` relies on."""
    angles = positions.float()[..., None] * inv_freq
    return torch.cat([angles, angles], dim=-1).cos().to(dtype), torch.cat([-angles, angles], dim=-1).sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x[..., heads, head_dim]`` by position (the non-interleaved 'rotate half' form):
    ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = [-x2, x1]``, computed as
    ``x * cos + roll(x, half) * signed_sin`` (``[x2, x1] * [-sin, sin]``): three ops instead of six,
    which measured 3-8% of the engine's step time on this model."""
    return torch.addcmul(x * cos.unsqueeze(-2), x.roll(x.shape[-1] // 2, -1), signed_sin.unsqueeze(-2))


class LlamaAttention(nn.Module):
    """Grouped-query attention over ``num_heads`` query heads and ``num_kv_heads`` KV heads: all of
    the config's, or one tensor-parallel rank's share of them (``models/tensor_parallel_llama.py``)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        hd, h, kvh = config.head_dim, config.num_attention_heads, config.num_key_value_heads
        self.num_heads, self.num_kv_heads, self.head_dim = h, kvh, hd
        # (k_scale, v_scale) of an fp8 KV cache (course_lib/kv_cache/fp8.py), or None: the paged path
        # passes them to the cache write and read; the dense path rounds K and V through e4m3 with them.
        self.kv_scales: tuple[float, float] | None = None
        self.q_proj = nn.Linear(config.hidden_size, h * hd, bias=config.qkv_bias)
        self.k_proj = nn.Linear(config.hidden_size, kvh * hd, bias=config.qkv_bias)
        self.v_proj = nn.Linear(config.hidden_size, kvh * hd, bias=config.qkv_bias)
        self.o_proj = nn.Linear(h * hd, config.hidden_size, bias=config.attention_bias)

    def _qkv(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        q = self.q_proj(x).unflatten(-1, (self.num_heads, self.head_dim))
        k = self.k_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim))
        v = self.v_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim))
        return apply_rotary(q, *rope), apply_rotary(k, *rope), v

    def forward_dense(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """x: [B, T, hidden]; full causal attention within each row."""
        q, k, v = self._qkv(x, rope)
        if self.kv_scales is not None:  # what an fp8 KV cache stores and gives back
            k, v = fake_quantize_fp8(k, self.kv_scales[0]), fake_quantize_fp8(v, self.kv_scales[1])
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, heads, T, hd]
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).flatten(-2))

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], kv_cache: torch.Tensor,
                metadata: AttentionMetadata) -> torch.Tensor:
        """x: [N, hidden] new tokens; their K/V are written to ``kv_cache`` before attending."""
        q, k, v = self._qkv(x, rope)
        metadata.write(kv_cache, k, v, self.kv_scales)
        out = metadata.attend(q, kv_cache, 1.0 / math.sqrt(self.head_dim), self.kv_scales)
        return self.o_proj(out.flatten(-2))


class LlamaMLP(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, attend) -> torch.Tensor:
        x = x + attend(self.self_attn, self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """Decoder plus LM head. Invariant: both forward paths give the same logits for the same tokens."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype):
        return rotary(positions, rope_inv_freq(self.config, positions.device), dtype)

    def forward_dense(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, T, vocab]`` for whole sequences ``[B, T]`` (positions 0..T-1)."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        x = self.model.embed_tokens(input_ids)
        rope = self._rope(positions, x.dtype)
        for layer in self.model.layers:
            x = layer(x, lambda attn, h: attn.forward_dense(h, rope))
        return self.lm_head(self.model.norm(x))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                metadata: AttentionMetadata, logits_indices: torch.Tensor) -> torch.Tensor:
        """Logits at ``logits_indices`` of a flat batch of new tokens, reading and writing paged KV."""
        x = self.model.embed_tokens(input_ids)
        rope = self._rope(positions, x.dtype)
        for layer, cache in zip(self.model.layers, kv_caches):
            x = layer(x, lambda attn, h, cache=cache: attn.forward(h, rope, cache, metadata))
        return self.lm_head(self.model.norm(x[logits_indices]))
