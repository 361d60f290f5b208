"""Speculative decoding's parts: n-gram lookup, budget (1 + k), rollback, stops, stats, config."""

from dataclasses import replace

import pytest
import torch

from course_lib.engine.llm import LLM
from course_lib.engine.metrics import SpecDecodeStats
from course_lib.engine.proposers import ngram_lookup
from course_lib.engine.sampling_params import SamplingParams
from course_lib.models.generate import greedy_reference
from course_lib.models.llama import LlamaForCausalLM

GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


def engine(model, spec, **kwargs) -> LLM:
    settings = dict(max_model_len=64, num_gpu_blocks=64, block_size=4, dtype=torch.float64, speculative_config=spec)
    settings.update(kwargs)
    return LLM(model, **settings)


def self_draft(model, k):
    return {"method": "draft_model", "model": model, "num_speculative_tokens": k}


def test_ngram_lookup_proposes_what_followed_the_earliest_match_of_the_longest_ngram():
    """vLLM's choice: the longest n-gram (max_n down to min_n), and among its earlier
    occurrences the earliest (vLLM's KMP on the reversed sequence keeps the last hit it sees)."""
    tokens = [1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3]
    assert ngram_lookup(tokens, 2, 1, 4) == [9, 1]  # "1 2 3" first seen before "9 1"
    assert ngram_lookup(tokens, 5, 1, 4) == [9, 1, 2, 3, 7]
    assert ngram_lookup([5, 6, 7, 5, 6], 3, 1, 3) == [7, 5, 6]
    assert ngram_lookup([4, 5, 6, 7], 3, 1, 4) == []  # no suffix occurs earlier
    assert ngram_lookup([4, 5, 9, 5], 3, 2, 4) == []  # only a 1-gram matches, below prompt_lookup_min
    assert ngram_lookup([4, 5, 9, 5], 3, 1, 4) == [9, 5]  # the continuation may be shorter than k
    assert ngram_lookup([1, 2, 8, 1, 2, 9, 2], 1, 1, 4) == [8]  # "9 2" never occurred; then the earliest "2"
    assert ngram_lookup([3], 2, 1, 4) == []


def test_ngram_lookup_takes_the_earliest_occurrence_as_vllm_does():
    assert ngram_lookup([1, 2, 3, 1, 2, 4, 1, 2], 3, 1, 3) == [3, 1, 2]  # not the latest "1 2": [4, 1, 2]
    assert ngram_lookup([1, 2, 3, 1, 2, 4, 1, 2], 3, 2, 2) == [3, 1, 2]
    # a longer n-gram wins over an earlier shorter one: "7 2" at 2, although "2" occurs at 0
    assert ngram_lookup([2, 9, 7, 2, 5, 7, 2], 2, 1, 4) == [5, 7]
    assert ngram_lookup([5, 5, 5, 5], 2, 1, 4) == [5]  # "5 5 5" at 0 overlaps the suffix; what follows: one 5


def _vllm_style_lookup(tokens, k, min_n, max_n):
    """An independent oracle in vLLM's manner (vLLM runs KMP; this scans directly): over the
    reversed sequence, for every earlier end position, the longest match (capped at max_n) of a
    prefix of the reversed text, i.e. of a suffix of the original; ties keep the position seen
    last, which is the earliest in the original."""
    rev = tokens[::-1]
    best, best_end = 0, -1
    for i in range(1, len(rev)):  # rev[i] is original position len-1-i: every candidate ends before the last token
        length = 0
        while length < max_n and i + length < len(rev) and rev[length] == rev[i + length]:
            length += 1
        if length >= best and length > 0:
            best, best_end = length, i
    if best < min_n:
        return []
    start = len(tokens) - best_end  # original index just after the occurrence
    return tokens[start:start + k]


def test_ngram_lookup_equals_a_vllm_style_oracle_on_random_sequences():
    import random
    rng = random.Random(0)
    for _ in range(2000):
        tokens = [rng.randrange(3) for _ in range(rng.randrange(1, 14))]
        k, min_n = rng.randrange(1, 5), rng.randrange(1, 4)
        max_n = rng.randrange(min_n, 5)
        assert ngram_lookup(tokens, k, min_n, max_n) == _vllm_style_lookup(tokens, k, min_n, max_n), (tokens, k, min_n, max_n)


def test_a_decoding_request_with_k_drafts_costs_one_plus_k_tokens(tiny_model):
    llm = engine(tiny_model, self_draft(tiny_model, 4))
    llm.generate([[5, 6, 7]], GREEDY)
    # prefill emits token 1; then 1 + 4 drafts emit 5; then room for 4 more: 1 + 3 drafts
    assert [r.scheduled["0"] for r in llm.step_trace] == [3, 5, 4]
    assert llm.spec_decode_stats.num_accepted_tokens == 4 + 3


def test_the_budget_and_max_tokens_cut_the_drafts(tiny_model):
    llm = engine(tiny_model, self_draft(tiny_model, 4), max_num_batched_tokens=3)
    llm.generate([[5, 6, 7]], GREEDY)
    assert all(n <= 3 for r in llm.step_trace for n in r.scheduled.values())
    assert [r.scheduled["0"] for r in llm.step_trace][1:] == [3, 3, 3]  # 1 + 2 drafts, 3 tokens each
    short = engine(tiny_model, self_draft(tiny_model, 4))
    out = short.generate([[5, 6, 7]], replace(GREEDY, max_tokens=3))[0]
    assert [r.scheduled["0"] for r in short.step_trace] == [3, 2]  # room for 2 more tokens: 1 + 1 draft
    assert len(out.outputs[0].token_ids) == 3
    near_end = engine(tiny_model, self_draft(tiny_model, 4), max_model_len=8, num_gpu_blocks=2, block_size=4)
    near_end.generate([[5, 6, 7, 8, 9]], GREEDY)  # 6 tokens after prefill, 2 to max_model_len
    assert [r.scheduled["0"] for r in near_end.step_trace] == [5, 2]  # room for 2: 1 + 1 draft


def test_rejected_drafts_are_rolled_back_with_their_blocks(tiny_model):
    llm = engine(tiny_model, {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1},
                 num_gpu_blocks=16)
    prompt = [5, 6, 7, 8, 9, 10, 11]
    truth = greedy_reference(tiny_model, prompt, 3)
    llm.add_request(prompt, GREEDY)
    llm.step()  # prefill: 7 tokens computed, 1 sampled -> 8 tokens in 2 blocks
    request = llm.scheduler.running[0]
    wrong = (truth[1] + 1) % 64
    request.spec_token_ids = [truth[1], wrong, 20, 21]  # draft 1 right, draft 2 wrong
    free_before = llm.kv_cache_manager.block_pool.num_free_blocks
    llm.step()
    record = llm.step_trace[-1]
    assert record.scheduled == {"0": 5}  # positions 7..11 need a third block during the step
    assert request.output_token_ids == truth[:3]  # the accepted draft and the target's correction
    assert request.num_computed_tokens == 9 and request.num_tokens == 10
    assert len(llm.kv_cache_manager.req_to_blocks["0"]) == 3  # exactly what 9 tokens need ...
    assert record.blocks_free == free_before - 1
    assert len(request.block_hashes) == 2  # ... and hashes only for the 8 verified tokens' full blocks
    request.spec_token_ids = [1, 2, 3, 4]
    llm.step()  # all rejected: nothing kept past the verified tokens
    assert request.num_computed_tokens == 10
    assert len(llm.kv_cache_manager.req_to_blocks["0"]) == 3


def test_a_stop_token_inside_an_accepted_run_truncates_it(tiny_model):
    tokens = engine(tiny_model, None).generate([[5, 6, 7]], replace(GREEDY, max_tokens=30))[0].outputs[0].token_ids
    stop_at = tokens[3]
    model = LlamaForCausalLM(replace(tiny_model.config, eos_token_id=stop_at, eos_token_ids=(stop_at,))).double().eval()
    model.load_state_dict(tiny_model.state_dict())
    llm = engine(model, self_draft(model, 4))
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=30))[0].outputs[0]
    assert out.token_ids == tokens[: tokens.index(stop_at) + 1] and out.finish_reason == "stop"
    pool = llm.kv_cache_manager.block_pool
    assert pool.num_free_blocks == len(pool.blocks)


def test_stats_per_request_and_overall(tiny_model):
    llm = engine(tiny_model, self_draft(tiny_model, 2))
    outs = llm.generate([[5, 6, 7], [9, 10]], GREEDY)
    for out in outs:
        stats = out.metrics[0].spec_decode_stats
        # 10 tokens: the first from prefill, then steps of 1 + 2 drafts: 3, 3, 3
        assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (3, 6, 6)
        assert stats.acceptance_rate == 1.0 and stats.acceptance_rate_per_pos == [1.0, 1.0]
        assert stats.mean_tokens_per_step == 3.0 == stats.predicted_tokens_per_step()
        assert stats.num_decode_tokens == 9
    total = llm.spec_decode_stats
    assert (total.num_drafts, total.num_accepted_tokens, total.num_proposed_tokens) == (6, 12, 12)


def test_stats_arithmetic():
    stats = SpecDecodeStats(3)
    stats.record(3, 1, 2)  # drafts 1 accepted, 2 rejected
    stats.record(3, 3, 4)
    stats.record(2, 0, 1)
    stats.record(0, 0, 1)  # a step without drafts
    assert stats.accepted_tokens_per_pos == [2, 1, 1] and stats.draft_tokens_per_pos == [3, 3, 2]
    assert stats.acceptance_rate == 4 / 8
    assert stats.conditional_acceptance_rate == 4 / (2 + 3 + 1)
    assert stats.mean_tokens_per_step == 1 + 4 / 3
    assert stats.tokens_per_decode_step == 8 / 4
    assert stats.acceptance_rate_per_pos == [2 / 3, 1 / 3, 1 / 3]  # vLLM's definition: over verification steps
    a = 4 / 6
    assert abs(stats.predicted_tokens_per_step() - (1 - a ** 4) / (1 - a)) < 1e-12


def test_no_drafts_are_proposed_when_no_step_could_send_them(tiny_model):
    """A prefill cap of 1 token leaves no room for drafts: the proposer must not run at all."""
    llm = engine(tiny_model, self_draft(tiny_model, 4), long_prefill_token_threshold=1)
    llm.generate([[5, 6, 7]], GREEDY)
    assert llm.spec_decode_stats.num_proposed_tokens == 0 and llm.spec_decode_stats.num_draft_tokens == 0


def test_seeded_sampling_with_speculation_is_reproducible(tiny_model):
    params = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, max_tokens=12, seed=4, ignore_eos=True)
    for spec in ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1},
                 {"method": "draft_model", "model": tiny_model, "num_speculative_tokens": 3}):
        runs = [[o.outputs[0].token_ids for o in engine(tiny_model, spec).generate([[5, 6, 5, 6, 5], [7]], params)]
                for _ in range(2)]
        assert runs[0] == runs[1] and all(len(t) == 12 for t in runs[0])


def test_speculative_config_errors_say_what_to_change(tiny_model):
    cases = [
        ({"method": "medusa", "num_speculative_tokens": 2}, "method must be one of"),
        ({"method": "ngram"}, "needs 'num_speculative_tokens'"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "must be a positive int"),
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3, "prompt_lookup_max": 2},
         "1 <= prompt_lookup_min <= prompt_lookup_max"),
        ({"method": "ngram", "num_speculative_tokens": 2, "model": "tiny-llama-draft"}, "takes no 'model'"),
        ({"method": "draft_model", "num_speculative_tokens": 2}, "needs 'model'"),
        ({"model": "tiny-llama-draft", "num_speculative_tokens": 2, "prompt_lookup_max": 3}, "belong to method='ngram'"),
        ({"method": "ngram", "num_speculative_tokens": 2, "lookahead": 3}, "unknown keys \\['lookahead'\\]"),
        ({"model": "tiny-llama-draft", "num_speculative_tokens": 2}, "vocabulary \\(258 tokens\\) differs"),
    ]
    for spec, message in cases:
        with pytest.raises(ValueError, match=message):
            engine(tiny_model, spec)
    llm = engine(tiny_model, {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3})
    assert (llm.speculative_config.prompt_lookup_min, llm.speculative_config.prompt_lookup_max) == (3, 3)
