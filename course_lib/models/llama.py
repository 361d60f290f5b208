"""A Llama-style decoder: RMSNorm, rotary positions, grouped-query attention, SwiGLU.

Module and parameter names match Hugging Face's ``LlamaForCausalLM`` exactly, so a
state dict moves between the two unchanged. The model runs two ways:
  * ``forward_dense(ids[B, T])``: plain causal attention over whole sequences (training,
    and the reference generation every engine test compares against);
  * ``forward(ids[N], positions[N], kv_caches, metadata)``: a flat batch of new tokens from
    many requests whose past keys and values live in a paged KV cache (the engine's path).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.engine.attention import AttentionMetadata
from course_lib.quant.kv_fp8 import fake_quantize_fp8


@dataclass(frozen=True)
class LlamaConfig:
    """Shape of the model; field names follow Hugging Face's ``LlamaConfig``."""

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

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be a multiple of num_attention_heads.")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads.")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def to_hf_dict(self) -> dict:
        """A ``config.json`` that Hugging Face ``transformers`` loads as a LlamaForCausalLM."""
        return {**asdict(self), "architectures": ["LlamaForCausalLM"], "model_type": "llama",
                "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "head_dim": self.head_dim,
                "torch_dtype": "bfloat16"}

    @classmethod
    def from_hf_dict(cls, data: dict) -> "LlamaConfig":
        """Read the fields this model uses from a Llama- or Qwen2-style ``config.json``."""
        known = {k: data[k] for k in cls.__dataclass_fields__ if data.get(k) is not None}
        known.setdefault("num_key_value_heads", data["num_attention_heads"])
        eos = known.get("eos_token_id")
        if isinstance(eos, list):
            known["eos_token_id"] = eos[0]
        config = cls(**known)
        explicit = data.get("head_dim")
        if explicit is not None and explicit != config.head_dim:
            raise ValueError(f"head_dim {explicit} != hidden_size / num_attention_heads; this model is not supported.")
        return config


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rotary(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos and sin tables (``[*positions.shape, head_dim]``) for rotary embeddings, HF layout."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    angles = positions.float()[..., None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x[..., heads, head_dim]`` by position (the non-interleaved 'rotate half' form)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.unsqueeze(-2) + rotated * sin.unsqueeze(-2)


class LlamaAttention(nn.Module):
    """Grouped-query attention over ``num_heads`` query heads and ``num_kv_heads`` KV heads: all of
    the config's, or one tensor-parallel rank's share of them (``models/tensor_parallel_llama.py``)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        hd, h, kvh = config.head_dim, config.num_attention_heads, config.num_key_value_heads
        self.num_heads, self.num_kv_heads, self.head_dim = h, kvh, hd
        # (k_scale, v_scale) of an fp8 KV cache (course_lib/quant/kv_fp8.py), or None: the paged path
        # passes them to the cache write and read; the dense path rounds K and V through e4m3 with them.
        self.kv_scales: tuple[float, float] | None = None
        self.q_proj = nn.Linear(config.hidden_size, h * hd, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, kvh * hd, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, kvh * hd, bias=False)
        self.o_proj = nn.Linear(h * hd, config.hidden_size, bias=False)

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
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

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
        return rotary(positions, self.config.head_dim, self.config.rope_theta, dtype)

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
