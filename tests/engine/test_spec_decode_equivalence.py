"""Speculative decoding is lossless: greedy outputs with drafts equal the plain model's, whatever
the proposer, k, budget, block size, preemption or cache hits; and no block leaks."""

import random

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from course_lib.engine.llm import LLM
from course_lib.models.llama import LlamaConfig, LlamaForCausalLM
from course_lib.engine.sampling_params import SamplingParams
from tests.engine.test_engine_equivalence import GREEDY, check_invariants, reference
from tests.engine.test_engine_equivalence import run as run_engine


def small_draft() -> LlamaForCausalLM:
    """A random 1-layer draft with the test model's vocabulary: it agrees with the target sometimes."""
    torch.manual_seed(99)
    config = LlamaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, intermediate_size=32, max_position_embeddings=256,
                         bos_token_id=0, eos_token_id=1)
    return LlamaForCausalLM(config).double().eval()


def check_spec_invariants(llm: LLM) -> None:
    check_invariants(llm)
    for request in llm.scheduler.requests.values():
        assert len(request.block_hashes) == request.num_tokens // llm.cache_config.block_size  # verified only
    k = llm.speculative_config.num_speculative_tokens
    for request in llm.scheduler.running:
        assert len(request.spec_token_ids) <= min(k, max(0, request.room() - 1))


def run(llm: LLM, prompts: list[list[int]], arrivals: list[int], params=GREEDY) -> dict[int, list[int]]:
    """The central test's run with the speculative invariants (its end: the pool is full again, a draft
    model's blocks too); a draft model keeps no state for finished requests."""
    outputs = run_engine(llm, prompts, arrivals, params, check=check_spec_invariants)
    assert not getattr(llm.proposer, "num_valid", None)
    return outputs


def workload(seed: int, num_prompts: int, shared_prefix: int, repetitive: bool) -> list[list[int]]:
    """Random prompts; ``repetitive`` ones repeat a short motif so the n-gram proposer finds matches."""
    rng = random.Random(seed)
    system = [rng.randrange(2, 64) for _ in range(shared_prefix)]
    prompts = []
    for _ in range(num_prompts):
        if repetitive:
            motif = [rng.randrange(2, 64) for _ in range(rng.randint(1, 5))]
            body = (motif * 10)[:rng.randint(3, 30)]
        else:
            body = [rng.randrange(2, 64) for _ in range(rng.randint(1, 30))]
        prompts.append(system + body)
    return prompts


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 10_000),
    method=st.sampled_from(["ngram", "draft_model", "draft_model_self"]),
    k=st.integers(1, 4),
    block_size=st.sampled_from([1, 2, 4, 8, 16]),
    max_num_batched_tokens=st.integers(4, 64),
    max_num_seqs=st.integers(1, 6),
    long_prefill=st.sampled_from([0, 0, 3]),
    spare_blocks=st.integers(0, 30),
    prefix_caching=st.booleans(),
    preemption_mode=st.sampled_from(["recompute", "swap"]),
    shared_prefix=st.sampled_from([0, 5, 17]),
    num_prompts=st.integers(1, 6),
    repetitive=st.booleans(),
    max_tokens=st.sampled_from([1, 10, 14]),
)
def test_greedy_outputs_with_speculation_match_the_plain_model(
    tiny_model, seed, method, k, block_size, max_num_batched_tokens, max_num_seqs, long_prefill, spare_blocks,
    prefix_caching, preemption_mode, shared_prefix, num_prompts, repetitive, max_tokens,
):
    max_model_len = 64
    if method == "ngram":
        spec = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1, "prompt_lookup_max": 4}
    else:  # the target as its own draft accepts every draft: exercises full runs and bonus tokens
        spec = {"method": "draft_model", "num_speculative_tokens": k,
                "model": tiny_model if method == "draft_model_self" else small_draft()}
    prompts = workload(seed, num_prompts, shared_prefix, repetitive)
    arrivals = sorted(random.Random(seed).randint(0, 12) for _ in prompts)
    llm = LLM(tiny_model, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
              max_model_len=max_model_len, block_size=block_size,
              num_gpu_blocks=-(-max_model_len // block_size) + spare_blocks,  # small pools force preemption
              enable_prefix_caching=prefix_caching, long_prefill_token_threshold=long_prefill,
              preemption_mode=preemption_mode, dtype=torch.float64, speculative_config=spec)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    outputs = run(llm, prompts, arrivals, params)
    for i, prompt in enumerate(prompts):
        assert tuple(outputs[i]) == reference(tiny_model, tuple(prompt), max_tokens), f"prompt {i}"
    stats = llm.spec_decode_stats
    assert stats.num_accepted_tokens <= stats.num_draft_tokens <= stats.num_proposed_tokens
    if method == "draft_model_self":
        assert stats.num_accepted_tokens == stats.num_draft_tokens  # same model: every draft is right


def test_speculation_with_preemption_and_a_tight_budget_changes_nothing(tiny_model):
    rng = random.Random(7)
    prompts = [[rng.randrange(2, 64) for _ in range(20)] for _ in range(6)]
    for mode in ("recompute", "swap"):
        for method in ("ngram", "draft_model"):
            spec = ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}
                    if method == "ngram" else {"model": tiny_model, "num_speculative_tokens": 3})
            llm = LLM(tiny_model, max_num_seqs=6, max_num_batched_tokens=20, max_model_len=64, block_size=4,
                      num_gpu_blocks=18, preemption_mode=mode, dtype=torch.float64, speculative_config=spec)
            outputs = run(llm, prompts, [0] * len(prompts))
            assert llm.scheduler.total_preemptions > 0
            assert llm.spec_decode_stats.num_draft_tokens > 0
            assert all(tuple(outputs[i]) == reference(tiny_model, tuple(p), 10) for i, p in enumerate(prompts))
