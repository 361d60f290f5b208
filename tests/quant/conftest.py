"""Fixtures shared by the quantization tests."""

import pytest
import torch

from course_lib.models.llama import LlamaConfig, LlamaForCausalLM


@pytest.fixture(scope="module")
def tiny():
    """A random two-layer Llama (float32, eval mode), the same weights in every module that asks."""
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         intermediate_size=128)
    return LlamaForCausalLM(config).eval()
