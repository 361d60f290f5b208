"""``LLM(..., kv_cache_dtype="fp8")``: the paged cache really holds e4m3 (its logits are a dense
forward's whose K and V went through the same rounding), greedy outputs are deterministic, agree
mostly with the full-precision cache's, and equal the dense reference's; the Triton backend stores
the same bytes and gives the same tokens; bad settings are refused; the block budget counts one byte
per element.

Measured (tiny-llama, float32 on CPU, 16 held-out prompts of 32 tokens, 32 greedy tokens each):
fp8 KV agrees with "auto" on 0.80 of positions before the first difference, 10 of 16 continuations
identical; the paged fp8 logits are within 1e-5 (7.6e-6) of the e4m3-rounded dense forward's, and up
to 0.44 away from the unrounded one.
"""

import copy
import os

import pytest
import torch

from course_lib.engine.llm import LLM
from course_lib.engine.model_runner import StepBatch
from course_lib.engine.sampling_params import SamplingParams
from course_lib.models.generate import greedy_reference
from course_lib.quant import gate
from course_lib.quant.kv_fp8 import set_kv_scales_

GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


@pytest.fixture(scope="module")
def prompts():
    return gate.continuation_prompts(gate.held_out(), 16).tolist()


@pytest.fixture(scope="module")
def fp8_llm():
    return LLM("tiny-llama", max_model_len=256, kv_cache_dtype="fp8")


def first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))


def test_the_cache_is_fp8_with_a_scale_pair_per_layer(fp8_llm):
    auto = LLM("tiny-llama", max_model_len=256)
    assert all(cache.dtype == torch.float8_e4m3fn for cache in fp8_llm.runner.kv_caches)
    assert fp8_llm.runner.kv_caches[0].shape == auto.runner.kv_caches[0].shape
    assert fp8_llm.runner.kv_caches[0].nbytes * 4 == auto.runner.kv_caches[0].nbytes  # float32 model
    assert auto.kv_scales is None
    assert len(fp8_llm.kv_scales) == 6 and all(k > 0 and v > 0 for k, v in fp8_llm.kv_scales)


def test_paged_logits_are_the_dense_forward_with_e4m3_rounded_kv(fp8_llm, prompts):
    """One request in four steps (a 20-token prefill, a 10-token chunk, 3 tokens, 1 token): every
    bucket of the PyTorch backend writes and reads the fp8 cache."""
    ids = (prompts[0] + prompts[1])[:34]
    logits, start = [], 0
    for count in (20, 10, 3, 1):
        end = start + count
        batch = StepBatch(input_ids=ids[start:end], positions=list(range(start, end)), slots=list(range(start, end)),
                          query_lens=[count], seq_lens=[end], block_tables=[[0, 1, 2]],
                          logits_indices=list(range(count)), swap_out=[], swap_in=[])
        logits.append(fp8_llm.runner.forward(batch))
        start = end
    paged = torch.cat(logits)
    model = fp8_llm.model
    with torch.inference_mode():
        rounded = model.forward_dense(torch.tensor([ids]))[0]  # the layers carry the engine's kv_scales
        scales = fp8_llm.kv_scales
        set_kv_scales_(model, None)
        try:
            unrounded = model.forward_dense(torch.tensor([ids]))[0]
        finally:
            set_kv_scales_(model, scales)
    assert (paged - rounded).abs().max() < 1e-4
    assert (paged - unrounded).abs().max() > 1e-2  # the rounding is really there


def test_greedy_outputs_are_deterministic_equal_the_reference_and_mostly_agree_with_auto(fp8_llm, prompts):
    first = [o.outputs[0].token_ids for o in fp8_llm.generate(prompts, GREEDY)]
    chunked = LLM("tiny-llama", max_model_len=256, kv_cache_dtype="fp8", max_num_batched_tokens=8, block_size=8)
    assert [o.outputs[0].token_ids for o in chunked.generate(prompts, GREEDY)] == first
    for prompt, tokens in zip(prompts[:4], first):
        assert tokens == greedy_reference(fp8_llm.model, prompt, GREEDY.max_tokens)
    auto = [o.outputs[0].token_ids for o in LLM("tiny-llama", max_model_len=256).generate(prompts, GREEDY)]
    agreement = sum(first_difference(a, b) for a, b in zip(auto, first)) / (len(prompts) * GREEDY.max_tokens)
    identical = sum(a == b for a, b in zip(auto, first))
    assert agreement >= 0.6 and identical >= 6, (agreement, identical)  # measured 0.80 and 10 of 16


def test_int8_weights_with_an_fp8_cache(prompts):
    llm = LLM("tiny-llama", max_model_len=256, quantization="int8", kv_cache_dtype="fp8")
    assert llm.quantization_summary["num_layers_replaced"] == 42
    assert llm.runner.kv_caches[0].dtype == torch.float8_e4m3fn
    outputs = llm.generate(prompts[:3], GREEDY)
    for prompt, output in zip(prompts[:3], outputs):
        assert output.outputs[0].token_ids == greedy_reference(llm.model, prompt, GREEDY.max_tokens)


def test_swapped_fp8_blocks_come_back_unchanged(tiny_model):
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    prompts = [[2 + (7 * i + j) % 60 for j in range(20)] for i in range(4)]
    roomy = LLM(tiny_model, max_model_len=64, num_gpu_blocks=64, block_size=16, kv_cache_dtype="fp8")
    tight = LLM(tiny_model, max_model_len=64, num_gpu_blocks=8, block_size=16, kv_cache_dtype="fp8",
                preemption_mode="swap")
    want = [o.outputs[0].token_ids for o in roomy.generate(prompts, params)]
    assert [o.outputs[0].token_ids for o in tight.generate(prompts, params)] == want
    assert any(step.preempted for step in tight.step_trace)
    assert tight.runner.cpu_caches[0].dtype == torch.float8_e4m3fn


def test_a_model_object_keeps_its_own_attention(tiny_model):
    llm = LLM(tiny_model, max_model_len=64, kv_cache_dtype="fp8")
    assert llm.model is not tiny_model
    assert all(layer.self_attn.kv_scales is None for layer in tiny_model.model.layers)
    assert all(layer.self_attn.kv_scales is not None for layer in llm.model.model.layers)


def test_a_second_engine_on_the_same_model_leaves_the_first_intact(tiny_model):
    """An "auto" engine built on an fp8 engine's model must not clear the scales that engine serves with."""
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    fp8 = LLM(tiny_model, max_model_len=64, kv_cache_dtype="fp8")
    before = [layer.self_attn.kv_scales for layer in fp8.model.model.layers]
    first = fp8.generate([[5, 6, 7, 8]], params)[0].outputs[0].token_ids
    LLM(fp8.model, max_model_len=64)
    assert [layer.self_attn.kv_scales for layer in fp8.model.model.layers] == before
    assert fp8.generate([[5, 6, 7, 8]], params)[0].outputs[0].token_ids == first


def test_an_fp8_cache_without_scales_fails_loudly(tiny_model):
    fp8 = LLM(tiny_model, max_model_len=64, kv_cache_dtype="fp8")
    for layer in fp8.model.model.layers:
        layer.self_attn.kv_scales = None
    with pytest.raises(RuntimeError, match="carries no kv_scales"):
        fp8.generate([[5, 6, 7, 8]], SamplingParams(temperature=0, max_tokens=2))


@pytest.mark.skipif(not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
                    reason="needs a GPU or Triton's interpreter")
def test_the_triton_backend_serves_the_fp8_cache_as_the_pytorch_backend_does(tiny_model):
    pytest.importorskip("triton")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = copy.deepcopy(tiny_model).float().to(device)
    prompts = [[5, 6, 7, 8, 9], list(range(10, 28)), [30, 31]]  # a prefill in chunks, short ones, decodes
    outputs, caches = {}, {}
    for backend in ("torch", "triton"):
        llm = LLM(model, max_model_len=64, num_gpu_blocks=32, block_size=4, max_num_batched_tokens=8,
                  attention_backend=backend, dtype=torch.float32, device=device, kv_cache_dtype="fp8")
        assert llm.attention_backend == backend
        result = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
        outputs[backend] = [r.outputs[0].token_ids for r in result]
        caches[backend] = llm.runner.kv_caches[0].view(torch.uint8)
    assert outputs["triton"] == outputs["torch"]
    assert torch.equal(caches["triton"], caches["torch"])  # the same e4m3 bytes in the same slots


def test_bad_settings_are_refused_with_what_to_change(tiny_model):
    with pytest.raises(ValueError, match=r"kv_cache_dtype must be one of \('auto', 'fp8', 'fp8_e4m3'\)"):
        LLM(tiny_model, max_model_len=64, kv_cache_dtype="fp16")
    with pytest.raises(ValueError, match="tensor_parallel_size=1 only"):
        LLM(tiny_model, max_model_len=64, kv_cache_dtype="fp8", tensor_parallel_size=2)


def test_the_gpu_block_budget_counts_one_byte_per_element(fp8_llm, monkeypatch):
    """The CUDA budget rule, with the device's memory faked: 4x float32's blocks, 2x bf16's."""
    class Properties:
        total_memory = 80 * 2 ** 30

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Properties())
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 2 ** 30)
    c = fp8_llm.model.config
    per_token = {size: 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * size for size in (1, 2, 4)}
    blocks = {size: fp8_llm._default_num_blocks("cuda", 0.9, 16, 32, 256, per_token[size], 0) for size in (1, 2, 4)}
    assert blocks[1] // 4 == blocks[4] and blocks[1] // 2 == blocks[2]
    assert fp8_llm.kv_cache_bytes.target_token_bytes == per_token[1]  # the engine counts its fp8 cache at 1 byte
