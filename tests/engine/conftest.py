import pytest
import torch

from course_lib.models.llama import LlamaConfig, LlamaForCausalLM


@pytest.fixture(scope="session")
def tiny_model() -> LlamaForCausalLM:
    """A random float64 Llama small enough to run hundreds of engine steps per second.

    float64 makes ties between logits vanishingly unlikely, so greedy comparisons test
    the engine's bookkeeping rather than rounding luck.
    """
    torch.manual_seed(1234)
    config = LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=256,
                         bos_token_id=0, eos_token_id=1)
    model = LlamaForCausalLM(config).double().eval()
    with torch.no_grad():  # sharper logits than the default init: greedy paths vary with context
        model.lm_head.weight.mul_(8)
    return model
