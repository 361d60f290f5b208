"""The model presets' shapes must explain their published parameter counts."""

import pytest

from course_lib.perf.models import MODELS, ModelSpec


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
