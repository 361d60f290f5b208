"""``LLM(..., quantization=...)``: the quantized model served through the same engine."""

import pytest
import torch

from course_lib.engine.llm import LLM
from course_lib.engine.sampling_params import SamplingParams
from course_lib.models.generate import greedy_reference

GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
PROMPTS = ["The for statement", "Lists are mutable"]


@pytest.mark.parametrize("scheme", ["int8", "int4", "w8a8"])
def test_the_engine_serves_the_quantized_model_with_its_own_greedy_tokens(scheme):
    llm = LLM("tiny-llama", quantization=scheme, max_model_len=128, max_num_batched_tokens=8)  # chunked prefill
    assert llm.quantization_summary["scheme"] == scheme and llm.quantization_summary["num_layers_replaced"] == 42
    outputs = llm.generate(PROMPTS, GREEDY)
    for prompt, output in zip(PROMPTS, outputs):
        ids = llm.tokenizer.encode(prompt)
        assert output.outputs[0].token_ids == greedy_reference(llm.model, ids, GREEDY.max_tokens)
    if scheme == "int4":  # the W4A16 Triton kernel on CUDA, PyTorch's dequantize + matmul elsewhere
        expected = "triton w4a16" if torch.cuda.is_available() else "dequantize + F.linear"
        assert llm.quantization_summary["matmul"] == expected
        assert llm.model.model.layers[0].mlp.down_proj.last_path == expected


def test_a_model_object_is_copied_not_quantized_in_place(tiny_model):
    before = {name: p.clone() for name, p in tiny_model.named_parameters()}
    llm = LLM(tiny_model, quantization="int8", max_model_len=64)
    assert llm.model is not tiny_model
    assert all(torch.equal(p, before[name]) for name, p in tiny_model.named_parameters())


def test_quantization_with_tensor_parallelism_is_refused_with_what_to_change():
    with pytest.raises(ValueError, match="tensor_parallel_size=1 only"):
        LLM("tiny-llama", quantization="int8", tensor_parallel_size=2)
    with pytest.raises(ValueError, match="quantization='awq': vLLM has it, this course's engine does not"):
        LLM("tiny-llama", quantization="awq")  # vLLM's checkpoint format (tests/engine/test_vllm_arguments.py)
    with pytest.raises(ValueError, match="scheme must be one of"):
        LLM("tiny-llama", quantization="int3")
