"""The model presets' shapes must explain their published parameter counts."""

import pytest

from course_lib.perf.kv import kv_elements_per_gpu, kv_heads_per_gpu, model_kv_bytes_per_token
from course_lib.perf.models import DEEPSEEK_V3, MODELS, ModelSpec, attention_variants, get_model

# deepseek-ai/DeepSeek-V3's config.json, the fields the preset encodes (Hugging Face model repository)
DEEPSEEK_V3_CONFIG = {
    "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
    "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "q_lora_rank": 1536,
    "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
    "moe_intermediate_size": 2048, "intermediate_size": 18432, "first_k_dense_replace": 3,
    "vocab_size": 129280, "max_position_embeddings": 163840,
}

# every preset, DeepSeek-V3 included whether or not MODELS lists it yet (see perf/models.py)
PRESETS = {**MODELS, DEEPSEEK_V3.name: DEEPSEEK_V3}

# max_position_embeddings, the longest max_model_len vLLM accepts, from each model's config.json on the
# Hugging Face Hub (Falcon-7B's config.json leaves it out: transformers' FalconConfig default, 2048, applies)
CONTEXT_LENGTHS = {
    "Llama-3-8B": 8192, "Llama-3.1-8B": 131072, "Llama-3.2-1B": 131072, "Llama-3.1-70B": 131072,
    "Qwen2.5-7B": 131072, "Mistral-7B-v0.3": 32768, "Llama-2-7B": 4096, "Falcon-7B": 2048, "Mixtral-8x7B": 32768,
    "DeepSeek-V3": 163840,
}


def test_every_preset_records_its_published_context_length():
    assert {name: model.max_context for name, model in PRESETS.items()} == CONTEXT_LENGTHS


def attention_parameters(model: ModelSpec) -> int:
    """One layer's attention projections. Standard: Q and O of num_heads x head_dim, K and V of
    num_kv_heads x head_dim. MLA (DeepSeek): queries through a q_lora_rank latent to heads x
    (nope + rope), keys/values through the kv_lora_rank latent plus one shared RoPE key, the latent
    expanded to heads x (nope key + value), and the output projection (nope = v = head_dim here)."""
    h, heads, d = model.hidden_size, model.num_heads, model.head_dim
    if not model.uses_mla:
        return h * heads * d * 2 + h * model.num_kv_heads * d * 2
    rope, q_lora, kv_lora = model.qk_rope_head_dim, model.q_lora_rank, model.kv_lora_rank
    return (h * q_lora + q_lora * heads * (d + rope) + h * (kv_lora + rope)
            + kv_lora * heads * (d + d) + heads * d * h)


def count_parameters(model: ModelSpec, experts: int, gated_mlp: bool = True) -> float:
    """Weights of a decoder built from the preset's shapes (norms and biases left out: under 0.1%):
    attention in every layer; ``num_dense_layers`` plain MLPs, then in every other layer ``experts``
    routed experts, the shared experts and a router (one plain MLP for a dense model)."""
    h = model.hidden_size
    per_mlp = (3 if gated_mlp else 2) * h
    moe = per_mlp * model.intermediate_size * (experts + model.num_shared_experts)
    router = h * model.num_experts if model.num_experts > 1 else 0
    dense = per_mlp * (model.dense_intermediate_size or 0)
    embeddings = model.embedding_params
    moe_layers = model.num_layers - model.num_dense_layers
    return (model.num_layers * attention_parameters(model) + model.num_dense_layers * dense
            + moe_layers * (moe + router) + embeddings)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_shapes_add_up_to_the_published_parameter_count(name):
    model = PRESETS[name]
    shape = dict(gated_mlp=False) if name == "Falcon-7B" else {}
    assert count_parameters(model, model.num_experts, **shape) == pytest.approx(model.num_params, rel=0.01)
    assert count_parameters(model, model.experts_per_token, **shape) == pytest.approx(model.active_params, rel=0.02)


def test_shapes_are_consistent():
    for model in PRESETS.values():
        assert model.num_heads % model.num_kv_heads == 0
        assert model.experts_per_token <= model.num_experts
        if model.uses_mla:
            # MLA projects the hidden state down to a latent narrower than itself and back up to
            # heads x head_dim (16384 for DeepSeek-V3), which is not the hidden width (7168)
            assert model.kv_lora_rank < model.q_lora_rank < model.hidden_size < model.num_heads * model.head_dim
        else:
            # every other preset projects the hidden state onto heads without changing its width
            assert model.num_heads * model.head_dim == model.hidden_size
        assert model.num_dense_layers < model.num_layers


def test_deepseek_v3_preset_matches_its_config_json():
    c, m = DEEPSEEK_V3_CONFIG, DEEPSEEK_V3
    if "DeepSeek-V3" in MODELS:
        assert get_model("DeepSeek-V3") is DEEPSEEK_V3
    assert (m.hidden_size, m.num_layers, m.num_heads, m.num_kv_heads) == (
        c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"])
    assert (m.num_experts, m.num_shared_experts, m.experts_per_token) == (
        c["n_routed_experts"], c["n_shared_experts"], c["num_experts_per_tok"])
    assert (m.q_lora_rank, m.kv_lora_rank, m.qk_rope_head_dim) == (
        c["q_lora_rank"], c["kv_lora_rank"], c["qk_rope_head_dim"])
    assert m.head_dim == c["qk_nope_head_dim"] == c["v_head_dim"]
    assert (m.intermediate_size, m.dense_intermediate_size, m.num_dense_layers) == (
        c["moe_intermediate_size"], c["intermediate_size"], c["first_k_dense_replace"])
    assert (m.vocab_size, m.max_context) == (c["vocab_size"], c["max_position_embeddings"])
    assert m.num_moe_layers == 58 and m.attention_kind == "MLA"


def test_deepseek_v3_shapes_add_up_to_671b_total_and_37b_active():
    assert count_parameters(DEEPSEEK_V3, DEEPSEEK_V3.num_experts) == pytest.approx(671e9, rel=0.01)
    assert count_parameters(DEEPSEEK_V3, DEEPSEEK_V3.experts_per_token) == pytest.approx(37e9, rel=0.02)


def test_mla_caches_576_elements_per_token_and_layer():
    assert DEEPSEEK_V3.kv_elements_per_token_per_layer == 512 + 64
    assert DEEPSEEK_V3.num_layers * DEEPSEEK_V3.kv_elements_per_token_per_layer * 2 == 70272  # bf16 bytes/token
    assert model_kv_bytes_per_token(DEEPSEEK_V3, "bf16") == 70272
    # the same attention uncompressed: 128 keys of 128 + 64 and 128 values of 128 per layer
    m = DEEPSEEK_V3
    uncompressed = m.num_kv_heads * (m.head_dim + m.qk_rope_head_dim + m.head_dim)
    assert uncompressed / DEEPSEEK_V3.kv_elements_per_token_per_layer == pytest.approx(71.1, rel=0.01)
    # and what the standard formula would have charged: 2 x 128 x 128, 57x the latent
    assert 2 * DEEPSEEK_V3.num_kv_heads * DEEPSEEK_V3.head_dim / 576 == pytest.approx(56.9, rel=0.01)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_cache_k_and_v_per_kv_head_or_one_mla_latent(name):
    model = PRESETS[name]
    if model.uses_mla:
        assert model.kv_elements_per_token_per_layer == model.kv_lora_rank + model.qk_rope_head_dim
    else:
        assert model.kv_elements_per_token_per_layer == 2 * model.num_kv_heads * model.head_dim
    assert model_kv_bytes_per_token(model, "fp16") == model.num_layers * model.kv_elements_per_token_per_layer * 2


@pytest.mark.parametrize("tp", [1, 2, 8, 16, 128, 256])
def test_tensor_parallelism_replicates_the_mla_latent_on_every_rank(tp):
    assert kv_elements_per_gpu(DEEPSEEK_V3, tp) == 576
    assert model_kv_bytes_per_token(DEEPSEEK_V3, "bf16", tp) == 70272
    with pytest.raises(ValueError, match="latent"):
        kv_heads_per_gpu(DEEPSEEK_V3, tp)


def test_mla_variants_are_standard_attention_with_the_same_heads():
    variants = attention_variants(DEEPSEEK_V3)
    assert [v.attention_kind for v in variants] == ["MHA", "GQA", "MQA"]
    assert not any(v.uses_mla for v in variants)
    assert model_kv_bytes_per_token(variants[0], "bf16") == 2 * 61 * 128 * 128 * 2


def test_half_a_latent_is_rejected():
    with pytest.raises(ValueError, match="both kv_lora_rank and qk_rope_head_dim"):
        ModelSpec("half", 2, 4, 4, 64, 1e6, 128, hidden_size=256, intermediate_size=512, vocab_size=256,
                  kv_lora_rank=64)
    with pytest.raises(ValueError, match="dense_intermediate_size"):
        ModelSpec("dense", 4, 4, 4, 64, 1e6, 128, hidden_size=256, intermediate_size=512, vocab_size=256,
                  num_dense_layers=1)
