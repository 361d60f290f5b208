"""Model presets: the shapes that decide KV-cache and weight memory.

Figures come from each model's published ``config.json`` (layers, attention heads, KV heads,
head dimension, hidden size, MLP intermediate size, vocabulary, longest supported context) and
its model card (parameter count). ``tests/test_model_presets.py`` checks that the shapes add up
to the published parameter counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from course_lib.checks import require_positive


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer as the memory planner sees it.

    Invariant: ``num_heads`` is a multiple of ``num_kv_heads`` (MHA: equal; GQA: a group
    of query heads shares one KV head; MQA: a single KV head).
    """

    name: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_params: float
    max_context: int
    num_active_params: float | None = None  # mixture of experts: parameters one token uses
    hidden_size: int = field(kw_only=True)
    intermediate_size: int = field(kw_only=True)  # of one MLP (one expert, for a mixture of experts)
    vocab_size: int = field(kw_only=True)
    tied_embeddings: bool = field(default=False, kw_only=True)  # the output layer reuses the embedding matrix
    num_experts: int = field(default=1, kw_only=True)
    experts_per_token: int = field(default=1, kw_only=True)
    # multi-head latent attention (DeepSeek): a layer caches one compressed vector per token,
    # kv_lora_rank latent elements plus qk_rope_head_dim for the shared RoPE key, not K and V per head
    kv_lora_rank: int | None = field(default=None, kw_only=True)
    qk_rope_head_dim: int | None = field(default=None, kw_only=True)
    q_lora_rank: int | None = field(default=None, kw_only=True)  # MLA: queries through a latent of this rank
    # DeepSeek-style mixture of experts: experts every token runs besides its routed top-k, and the
    # first ``num_dense_layers`` layers (config.json's first_k_dense_replace) are plain MLPs of
    # ``dense_intermediate_size`` (config.json's intermediate_size; ``intermediate_size`` here is one expert's)
    num_shared_experts: int = field(default=0, kw_only=True)
    num_dense_layers: int = field(default=0, kw_only=True)
    dense_intermediate_size: int | None = field(default=None, kw_only=True)

    @property
    def embedding_params(self) -> int:
        """Parameters of the token embedding and the output layer (lm_head): vocab x hidden each, one
        shared matrix when ``tied_embeddings``."""
        return self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)

    @property
    def active_params(self) -> float:
        """Parameters each token's forward pass multiplies by (all of them for a dense model)."""
        return self.num_params if self.num_active_params is None else self.num_active_params

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_heads", "num_kv_heads", "head_dim", "num_params", "max_context",
                     "hidden_size", "intermediate_size", "vocab_size", "num_experts", "experts_per_token"):
            require_positive(f"{self.name}: {name}", getattr(self, name))
        if (self.kv_lora_rank is None) != (self.qk_rope_head_dim is None):
            raise ValueError(f"{self.name}: multi-head latent attention needs both kv_lora_rank and "
                             f"qk_rope_head_dim (got {self.kv_lora_rank!r} and {self.qk_rope_head_dim!r}).")
        for name in ("kv_lora_rank", "qk_rope_head_dim", "q_lora_rank", "dense_intermediate_size"):
            if getattr(self, name) is not None:
                require_positive(f"{self.name}: {name}", getattr(self, name))
        if not 0 <= self.num_dense_layers < self.num_layers or self.num_shared_experts < 0:
            raise ValueError(f"{self.name}: num_dense_layers must lie in [0, num_layers) and num_shared_experts "
                             f"be 0 or more (got {self.num_dense_layers!r} and {self.num_shared_experts!r}).")
        if self.num_dense_layers and self.dense_intermediate_size is None:
            raise ValueError(f"{self.name}: dense layers need their dense_intermediate_size.")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"{self.name}: num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})."
            )

    @property
    def kv_elements_per_token_per_layer(self) -> int:
        """Cached elements per token and layer: K and V of every KV head, or MLA's compressed
        vector (``kv_lora_rank + qk_rope_head_dim``) when ``kv_lora_rank`` is set."""
        if self.kv_lora_rank is None:
            return 2 * self.num_kv_heads * self.head_dim
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def uses_mla(self) -> bool:
        """True for multi-head latent attention: one latent per token and layer, shared by all heads
        (so tensor parallelism replicates it on every rank instead of splitting it by heads)."""
        return self.kv_lora_rank is not None

    @property
    def num_moe_layers(self) -> int:
        """Layers whose MLP is the mixture of experts (all of them for Mixtral, 58 of 61 for DeepSeek-V3;
        0 for a dense model)."""
        return self.num_layers - self.num_dense_layers if self.num_experts > 1 else 0

    @property
    def attention_kind(self) -> str:
        """'MLA' for multi-head latent attention, else 'MHA', 'GQA' or 'MQA', from the ratio of
        query heads to KV heads."""
        if self.uses_mla:
            return "MLA"
        if self.num_kv_heads == self.num_heads:
            return "MHA"
        return "MQA" if self.num_kv_heads == 1 else "GQA"

    def with_kv_heads(self, num_kv_heads: int) -> "ModelSpec":
        """The same model with a different number of KV heads (for MHA/GQA/MQA comparisons). An MLA
        model becomes standard attention with those KV heads: its latent cache is dropped."""
        return replace(self, name=f"{self.name} ({num_kv_heads} KV heads)", num_kv_heads=num_kv_heads,
                       kv_lora_rank=None, qk_rope_head_dim=None, q_lora_rank=None)


# DeepSeek-V3, from deepseek-ai/DeepSeek-V3's config.json: 61 layers (num_hidden_layers), 128 attention
# heads (num_key_value_heads is also 128: MLA decompresses keys and values per head from the latent),
# hidden 7168, vocab 129280, max_position_embeddings 163840, n_routed_experts 256 + n_shared_experts 1,
# num_experts_per_tok 8, moe_intermediate_size 2048, first_k_dense_replace 3 (layers 0-2 are dense MLPs
# of intermediate_size 18432), q_lora_rank 1536, kv_lora_rank 512, qk_rope_head_dim 64, and
# qk_nope_head_dim = v_head_dim = 128 (``head_dim`` here), tie_word_embeddings false.
# 671B total and 37B activated per token: the technical report's abstract (arXiv 2412.19437);
# the repository's README_WEIGHTS.md gives 671B and 36.7B for the main model without its MTP module.
# ``num_experts`` counts the routed experts; the shared expert runs for every token on top of the top-8.
# KV: MLA caches kv_lora_rank + qk_rope_head_dim = 576 elements per token and layer
# (``kv_elements_per_token_per_layer``), not 2 x 128 x 128; ``perf.kv`` sizes it from that property.
# Not yet in MODELS: the graders of exercises 01 and 04 draw cases from every preset and check them
# against standard attention's 2 x KV heads x head_dim formula; they must leave MLA presets out first.
DEEPSEEK_V3 = ModelSpec("DeepSeek-V3", 61, 128, 128, 128, 671e9, 163840, num_active_params=37e9, hidden_size=7168,
                        intermediate_size=2048, vocab_size=129280, num_experts=256, experts_per_token=8,
                        kv_lora_rank=512, qk_rope_head_dim=64, q_lora_rank=1536, num_shared_experts=1,
                        num_dense_layers=3, dense_intermediate_size=18432)

MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("Llama-3-8B", 32, 32, 8, 128, 8.03e9, 8192, hidden_size=4096, intermediate_size=14336,
                  vocab_size=128256),
        ModelSpec("Llama-3.1-8B", 32, 32, 8, 128, 8.03e9, 131072, hidden_size=4096, intermediate_size=14336,
                  vocab_size=128256),
        ModelSpec("Llama-3.2-1B", 16, 32, 8, 64, 1.24e9, 131072, hidden_size=2048, intermediate_size=8192,
                  vocab_size=128256, tied_embeddings=True),
        ModelSpec("Llama-3.1-70B", 80, 64, 8, 128, 70.6e9, 131072, hidden_size=8192, intermediate_size=28672,
                  vocab_size=128256),
        ModelSpec("Qwen2.5-7B", 28, 28, 4, 128, 7.62e9, 131072, hidden_size=3584, intermediate_size=18944,
                  vocab_size=152064),
        ModelSpec("Mistral-7B-v0.3", 32, 32, 8, 128, 7.25e9, 32768, hidden_size=4096, intermediate_size=14336,
                  vocab_size=32768),
        ModelSpec("Llama-2-7B", 32, 32, 32, 128, 6.74e9, 4096, hidden_size=4096, intermediate_size=11008,
                  vocab_size=32000),
        # Falcon's MLP is a plain 4x GELU (not gated) and its embeddings are tied
        ModelSpec("Falcon-7B", 32, 71, 1, 64, 6.92e9, 2048, hidden_size=4544, intermediate_size=18176,
                  vocab_size=65024, tied_embeddings=True),
        ModelSpec("Mixtral-8x7B", 32, 32, 8, 128, 46.7e9, 32768, num_active_params=12.9e9, hidden_size=4096,
                  intermediate_size=14336, vocab_size=32000, num_experts=8, experts_per_token=2),
    )
}




def get_model(name: str) -> ModelSpec:
    """Look up a model preset by name; the error lists the known names."""
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"Unknown model {name!r}; choose one of {sorted(MODELS)}.") from None


def kv_head_choices(num_heads: int) -> list[int]:
    """The KV-head counts a model with ``num_heads`` query heads can have: the divisors of
    ``num_heads`` (each KV head serves an equal group of query heads), from 1 (MQA) to
    ``num_heads`` (MHA)."""
    return [n for n in range(1, num_heads + 1) if num_heads % n == 0]


def attention_variants(base: ModelSpec) -> list[ModelSpec]:
    """``base`` as MHA (one KV head per query head), GQA and MQA (one KV head): same layers,
    heads and head size. GQA uses the model's own KV heads when it is a GQA model, else the valid
    count nearest 8; it is left out when no count lies strictly between 1 and the query heads
    (Falcon-7B's 71 heads)."""
    heads = base.num_heads
    inner = [n for n in kv_head_choices(heads) if 1 < n < heads]
    counts = [heads]
    if inner:
        counts.append(base.num_kv_heads if base.num_kv_heads in inner else min(inner, key=lambda n: (abs(n - 8), n)))
    return [base.with_kv_heads(n) for n in counts + [1]]
