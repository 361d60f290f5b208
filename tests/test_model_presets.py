"""The model presets' shapes must explain their published parameter counts."""

import pytest

from course_lib.perf.models import MODELS, ModelSpec
from course_lib.perf.models import DEEPSEEK_V3


def count_parameters(model: ModelSpec, experts: int, gated_mlp: bool = True, tied_embeddings: bool = False) -> float:
    """Weights of a decoder built from the preset's shapes (norms and biases left out: under 0.1%)."""
    h = model.hidden_size
    attention = h * model.num_heads * model.head_dim * 2 + h * model.num_kv_heads * model.head_dim * 2
    mlp = (3 if gated_mlp else 2) * h * model.intermediate_size * experts
    router = h * model.num_experts if model.num_experts > 1 else 0
    embeddings = model.vocab_size * h * (1 if tied_embeddings else 2)
    return model.num_layers * (attention + mlp + router) + embeddings


@pytest.mark.parametrize("name", sorted(MODELS))
def test_shapes_add_up_to_the_published_parameter_count(name):
    model = MODELS[name]
    shape = dict(gated_mlp=False, tied_embeddings=True) if name == "Falcon-7B" else {}
    if name == "Llama-3.2-1B":
        shape = dict(tied_embeddings=True)  # the output layer reuses the embedding matrix
    assert count_parameters(model, model.num_experts, **shape) == pytest.approx(model.num_params, rel=0.01)
    assert count_parameters(model, model.experts_per_token, **shape) == pytest.approx(model.active_params, rel=0.02)


def test_shapes_are_consistent():
    for model in MODELS.values():
        assert model.num_heads % model.num_kv_heads == 0
        assert model.experts_per_token <= model.num_experts
        # every preset here projects the hidden state onto heads without changing its width
        assert model.num_heads * model.head_dim == model.hidden_size


def count_deepseek_v3_parameters(routed_experts: int) -> float:
    """DeepSeek-V3's weights from its config.json (MTP module left out): MLA projections (queries
    through a 1536-rank latent, keys/values through the 512-rank latent plus a 64-wide RoPE key),
    3 dense layers (intermediate 18432), then 58 MoE layers of 1 shared + ``routed_experts``
    experts and a router, untied embeddings."""
    m = DEEPSEEK_V3
    h, heads, nope, rope, v = m.hidden_size, m.num_heads, m.head_dim, m.qk_rope_head_dim, m.head_dim
    q_lora, dense_layers, dense_intermediate = 1536, 3, 18432
    attention = (h * q_lora + q_lora * heads * (nope + rope) + h * (m.kv_lora_rank + rope)
                 + m.kv_lora_rank * heads * (nope + v) + heads * v * h)
    dense_mlp = 3 * h * dense_intermediate
    moe = 3 * h * m.intermediate_size * (1 + routed_experts) + h * m.num_experts
    layers = m.num_layers * attention + dense_layers * dense_mlp + (m.num_layers - dense_layers) * moe
    return layers + 2 * m.vocab_size * h


def test_deepseek_v3_shapes_add_up_to_671b_total_and_37b_active():
    assert count_deepseek_v3_parameters(DEEPSEEK_V3.num_experts) == pytest.approx(DEEPSEEK_V3.num_params, rel=0.01)
    assert count_deepseek_v3_parameters(DEEPSEEK_V3.experts_per_token) == pytest.approx(
        DEEPSEEK_V3.active_params, rel=0.02)
    assert DEEPSEEK_V3.experts_per_token <= DEEPSEEK_V3.num_experts
    assert DEEPSEEK_V3.num_heads % DEEPSEEK_V3.num_kv_heads == 0


def test_mla_caches_576_elements_per_token_and_layer():
    assert DEEPSEEK_V3.kv_elements_per_token_per_layer == 512 + 64
    assert DEEPSEEK_V3.num_layers * DEEPSEEK_V3.kv_elements_per_token_per_layer * 2 == 70272  # bf16 bytes/token
    # the same attention uncompressed: 128 keys of 128 + 64 and 128 values of 128 per layer
    uncompressed = DEEPSEEK_V3.num_kv_heads * (DEEPSEEK_V3.head_dim + DEEPSEEK_V3.qk_rope_head_dim + DEEPSEEK_V3.head_dim)
    assert uncompressed / DEEPSEEK_V3.kv_elements_per_token_per_layer == pytest.approx(71.1, rel=0.01)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_presets_without_mla_cache_k_and_v_per_kv_head(name):
    model = MODELS[name]
    assert model.kv_elements_per_token_per_layer == 2 * model.num_kv_heads * model.head_dim
