"""Penalties and min-p, as vLLM V1 applies them, checked against sums done by hand.

Unit cases work on small logits vectors whose penalised values are written out below. Engine
cases compare every path that samples (plain decode, n > 1, preemption, chunked prefill,
speculation, tensor parallelism) with a greedy loop over the plain model that applies the
penalties itself, and sampled speculation with the exact distribution of a model whose logits
are fixed, computed here token by token.
"""

import math
from collections import Counter
from dataclasses import replace

import pytest
import torch
from torch import nn

from course_lib.engine.llm import LLM
from course_lib.engine.sampler import apply_penalties, probabilities
from course_lib.engine.sampling_params import SamplingParams
from course_lib.models.llama import LlamaConfig, LlamaForCausalLM

PENALISED = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True,
                           repetition_penalty=1.6, frequency_penalty=0.4, presence_penalty=0.3)
ENCOURAGED = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True,  # repeats: n-gram drafts get accepted
                            repetition_penalty=0.7, frequency_penalty=-0.3, presence_penalty=-0.5)


def test_penalties_on_a_known_logits_vector_match_a_hand_computation():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0]])
    params = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    got = apply_penalties(logits, params, prompt_token_ids=[0], output_token_ids=[1, 3, 3])
    # token 0: prompt only, positive: 2 / 2.            token 1: output once, negative: -1 * 2 - 0.5 - 0.25
    # token 2: never seen, unchanged.                   token 3: output twice: 3 / 2 - 2 * 0.5 - 0.25
    # token 4: never seen, unchanged.
    assert got.tolist() == [[1.0, -2.75, 0.5, 0.25, -2.0]]


def test_each_draft_row_counts_the_drafts_before_it_as_output():
    logits = torch.ones(3, 4)
    params = SamplingParams(frequency_penalty=1.0, presence_penalty=0.5)
    got = apply_penalties(logits, params, prompt_token_ids=[3], output_token_ids=[0], draft_token_ids=[2, 2])
    assert got.tolist() == [[-0.5, 1.0, 1.0, 1.0],  # after the output [0]
                            [-0.5, 1.0, -0.5, 1.0],  # ... and draft 2 once
                            [-0.5, 1.0, -1.5, 1.0]]  # ... and draft 2 twice


def test_min_p_drops_tokens_below_min_p_times_the_top_probability():
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    got = probabilities(logits, SamplingParams(min_p=0.2))  # floor 0.2 * 0.5 = 0.1: only 0.05 goes
    assert torch.allclose(got, torch.tensor([0.5, 0.3, 0.15, 0.0]) / 0.95)


def test_min_p_compares_probabilities_after_temperature():
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    # At T=2 the probabilities are proportional to sqrt(p): the floor 0.35 * sqrt(0.5) = 0.247 drops only
    # sqrt(0.05) = 0.224 (at T=1 the floor 0.175 would drop 0.15 as well).
    kept = [math.sqrt(p) for p in (0.5, 0.3, 0.15)]
    expected = torch.tensor([*kept, 0.0]) / sum(kept)
    assert torch.allclose(probabilities(logits, SamplingParams(temperature=2.0, min_p=0.35)), expected)


def test_min_p_comes_before_top_p():
    logits = torch.tensor([0.4, 0.3, 0.2, 0.1]).log()
    # min_p 0.3: floor 0.12 drops 0.1, leaving [4, 3, 2] / 9; top_p 0.75 on that keeps 4/9 and 3/9
    # (4/9 + 3/9 = 0.78 reaches 0.75). top_p first would keep three tokens (0.4 + 0.3 = 0.7 < 0.75).
    got = probabilities(logits, SamplingParams(min_p=0.3, top_p=0.75))
    assert torch.allclose(got / got.sum(), torch.tensor([4 / 7, 3 / 7, 0.0, 0.0]))  # top-p leaves it unnormalised


def penalised_by_hand(logits: list[float], prompt: list[int], output: list[int], params: SamplingParams) -> list[float]:
    """vLLM's penalties on one row, token by token in plain Python."""
    out = list(logits)
    for token in range(len(out)):
        count = output.count(token)
        if token in prompt or count:
            r = params.repetition_penalty
            out[token] = out[token] / r if out[token] > 0 else out[token] * r
        out[token] -= params.frequency_penalty * count + params.presence_penalty * (count > 0)
    return out


@torch.inference_mode()
def greedy_with_penalties(model, prompt: list[int], params: SamplingParams) -> list[int]:
    """The plain model, no KV cache, the whole sequence each step; argmax of the penalised logits."""
    output = []
    while len(output) < params.max_tokens:
        logits = model.forward_dense(torch.tensor([prompt + output]))[0, -1].tolist()
        row = penalised_by_hand(logits, prompt, output, params)
        output.append(max(range(len(row)), key=lambda t: (row[t], -t)))
    return output


PROMPTS = [[62, 34, 13, 50, 62, 34], [9, 9, 9, 3], [24, 52, 27, 8]]


@pytest.mark.parametrize("params", [PENALISED, ENCOURAGED])
def test_the_hand_loop_differs_from_plain_greedy(tiny_model, params):
    """Else the engine tests below would pass with penalties ignored."""
    plain = SamplingParams(temperature=0, max_tokens=params.max_tokens, ignore_eos=True)
    for prompt in PROMPTS:
        assert greedy_with_penalties(tiny_model, prompt, params) != greedy_with_penalties(tiny_model, prompt, plain)


@pytest.mark.parametrize("settings, params", [
    ({}, PENALISED),  # every request decodes together
    ({}, ENCOURAGED),
    ({"max_num_batched_tokens": 4, "max_num_seqs": 2}, PENALISED),  # chunked prefill, requests interleaved
    ({"num_gpu_blocks": 7, "block_size": 4, "max_model_len": 28}, PENALISED),  # preemption by recompute
    ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}}, ENCOURAGED),
    ({"speculative_config": "self_draft"}, PENALISED),  # a draft that proposes the unpenalised target's argmax
])
def test_greedy_with_penalties_equals_the_hand_loop_on_every_path(tiny_model, settings, params):
    if settings.get("speculative_config") == "self_draft":
        settings = {"speculative_config": {"method": "draft_model", "model": tiny_model, "num_speculative_tokens": 3}}
    llm = LLM(tiny_model, dtype=torch.float64, **{"num_gpu_blocks": 64, "block_size": 4, "max_model_len": 64,
                                                    **settings})
    outputs = llm.generate(PROMPTS, replace(params, n=2))  # two siblings, each with its own output counts
    for prompt, output in zip(PROMPTS, outputs):
        expected = greedy_with_penalties(tiny_model, prompt, params)
        assert [c.token_ids for c in output.outputs] == [expected, expected]
    if "num_gpu_blocks" in settings:
        assert any(record.preempted for record in llm.step_trace)
    if "speculative_config" in settings:
        assert llm.spec_decode_stats.num_accepted_tokens > 0


def test_greedy_with_penalties_at_tensor_parallel_size_2_equals_the_hand_loop():
    torch.manual_seed(3)
    config = LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128,
                         bos_token_id=0, eos_token_id=1)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8)  # well-separated logits: float32 sums over two ranks keep the argmax
    with LLM(model, tensor_parallel_size=2, max_model_len=64) as llm:
        outputs = llm.generate(PROMPTS, PENALISED)
    assert [o.outputs[0].token_ids for o in outputs] == [greedy_with_penalties(model, p, PENALISED) for p in PROMPTS]


def fixed_logits_model(logits: dict[int, float], vocab_size: int = 16) -> LlamaForCausalLM:
    """A model whose logits are ``logits`` (others -30) whatever the input: the LM head's weights are
    zero and its bias holds them. Its last two ids are BOS and EOS, as in the byte tokenizer."""
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, intermediate_size=16, max_position_embeddings=64,
                         bos_token_id=vocab_size - 2, eos_token_id=vocab_size - 1)
    model = LlamaForCausalLM(config).double().eval()
    model.lm_head = nn.Linear(8, vocab_size, bias=True).double()
    with torch.no_grad():
        model.lm_head.weight.zero_()
        model.lm_head.bias.fill_(-30.0)
        for token, value in logits.items():
            model.lm_head.bias[token] = value
    return model


def sequence_probabilities(logits: dict[int, float], prompt: list[int], params: SamplingParams,
                           length: int) -> dict[tuple[int, ...], float]:
    """The exact probability of every output of ``length`` tokens drawn from ``logits`` (the rest
    have probability < 1e-12), penalised after each token, at temperature 1."""
    tokens = sorted(logits)
    result = {(): 1.0}
    for _ in range(length):
        longer = {}
        for output, p in result.items():
            row = penalised_by_hand([logits[t] for t in tokens], [tokens.index(t) for t in prompt if t in tokens],
                                    [tokens.index(t) for t in output], params)
            total = sum(math.exp(v) for v in row)
            for i, token in enumerate(tokens):
                longer[output + (token,)] = p * math.exp(row[i]) / total
        result = longer
    return result


@pytest.mark.parametrize("spec", [
    None,
    {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1},
    {"method": "draft_model", "model": fixed_logits_model({2: 0.0, 3: 1.0, 4: 0.5}), "num_speculative_tokens": 2},
])
def test_sampled_penalised_outputs_follow_the_hand_computed_distribution(spec):
    """1,000 three-token samples from fixed logits over tokens 2, 3, 4, penalised as they grow:
    their 27 outcomes' counts pass a chi-square test against the exact probabilities. With
    speculation the target's row for draft i is penalised with drafts 0..i-1 counted."""
    logits = {2: 1.0, 3: 0.5, 4: 0.0}
    prompt = [0, 2, 3, 4, 2, 3, 4, 2]  # token 2 is in the prompt (repetition penalty); n-grams repeat
    params = SamplingParams(temperature=1.0, max_tokens=3, ignore_eos=True,
                            repetition_penalty=1.5, frequency_penalty=0.6, presence_penalty=0.4)
    exact = sequence_probabilities(logits, prompt, params, 3)
    llm = LLM(fixed_logits_model(logits), dtype=torch.float64, max_model_len=16, block_size=4, max_num_seqs=128,
              max_num_batched_tokens=2048, seed=11, speculative_config=spec)
    n = 1000
    counts = Counter(tuple(o.outputs[0].token_ids) for o in llm.generate([prompt] * n, params))
    assert set(counts) <= set(exact)
    chi2 = sum((counts.get(seq, 0) - n * p) ** 2 / (n * p) for seq, p in exact.items())
    assert chi2 < 54.1, chi2  # the 0.1% tail of chi-square with 26 degrees of freedom
    if spec is not None:
        assert llm.spec_decode_stats.num_accepted_tokens > 0
