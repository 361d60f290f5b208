"""``LLM.get_metrics()`` reports vLLM's speculative decoding counters, counted per step, so vLLM's
own recipe (examples/offline_inference/spec_decode.py) computes the acceptance rate from them."""

import torch

from course_lib.engine.engine_metrics import Counter, Vector
from course_lib.engine.llm import LLM
from course_lib.engine.sampling_params import SamplingParams

K = 3
NGRAM = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
PROMPTS = ([5, 6, 7, 5, 6, 7, 5, 6], [1, 2, 3, 1, 2, 3, 1, 2], [9, 8, 7, 9, 8], [4, 4, 4, 4])
SPEC_NAMES = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
              "vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_accepted_tokens_per_pos")


def engine(model, spec) -> LLM:
    return LLM(model, max_model_len=64, num_gpu_blocks=64, block_size=4, dtype=torch.float64,
               speculative_config=spec)


def vllm_recipe(metrics) -> tuple[int, int, int, list[int]]:
    """What vLLM's spec_decode example reads from ``llm.get_metrics()``."""
    drafts = draft_tokens = accepted = 0
    per_pos = [0] * K
    for metric in metrics:
        if metric.name == "vllm:spec_decode_num_drafts":
            assert isinstance(metric, Counter)
            drafts += metric.value
        elif metric.name == "vllm:spec_decode_num_draft_tokens":
            assert isinstance(metric, Counter)
            draft_tokens += metric.value
        elif metric.name == "vllm:spec_decode_num_accepted_tokens":
            assert isinstance(metric, Counter)
            accepted += metric.value
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            assert isinstance(metric, Vector)
            for pos in range(len(metric.values)):
                per_pos[pos] += metric.values[pos]
    return drafts, draft_tokens, accepted, per_pos


def test_spec_decode_counters_equal_a_hand_count_of_every_step(tiny_model):
    llm = engine(tiny_model, NGRAM)
    assert vllm_recipe(llm.get_metrics()) == (0, 0, 0, [0] * K)  # present, at zero, before any step
    params = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)  # no stop cuts an accepted run
    for prompt in PROMPTS:
        llm.add_request(prompt, params)
    requests = dict(llm.scheduler.requests)
    drafts = draft_tokens = accepted = 0
    per_pos = [0] * K
    while llm.scheduler.requests:
        before = {rid: len(r.output_token_ids) for rid, r in requests.items()}
        llm.step()
        for rid, scheduled in llm.step_trace[-1].scheduled.items():
            if before[rid] == 0:
                continue  # a prefill: no drafts
            sent = scheduled - 1  # a decoding request with j drafts is scheduled 1 + j tokens
            if sent:
                kept = len(requests[rid].output_token_ids) - before[rid] - 1
                drafts, draft_tokens, accepted = drafts + 1, draft_tokens + sent, accepted + kept
                for pos in range(kept):
                    per_pos[pos] += 1
        # counted per step, not when a request finishes
        assert vllm_recipe(llm.get_metrics()) == (drafts, draft_tokens, accepted, per_pos)
    assert drafts > 0 and 0 < accepted < draft_tokens  # some drafts accepted, some rejected
    assert not any(record.preempted for record in llm.step_trace)  # so the hand count above holds
    totals = llm.spec_decode_stats  # the engine's own per-request stats, merged at finish, agree
    assert (totals.num_drafts, totals.num_draft_tokens, totals.num_accepted_tokens) == (drafts, draft_tokens, accepted)
    # vLLM's documented readings
    assert 1 + accepted / drafts == totals.mean_tokens_per_step
    assert [a / drafts for a in per_pos] == totals.acceptance_rate_per_pos
    metrics = {m.name: m for m in llm.get_metrics()}
    assert metrics["vllm:spec_decode_num_accepted_tokens_per_pos"].kind == "vector"
    assert len(metrics["vllm:spec_decode_num_accepted_tokens_per_pos"].values) == K
    assert all(metrics[name].kind == "counter" for name in SPEC_NAMES[:3])


def test_spec_decode_counters_keep_counting_across_generate_calls(tiny_model):
    llm = engine(tiny_model, NGRAM)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    llm.generate(list(PROMPTS), params)
    first = vllm_recipe(llm.get_metrics())
    llm.generate(list(PROMPTS), params)
    second = vllm_recipe(llm.get_metrics())
    assert first[0] > 0 and second[:3] == tuple(2 * v for v in first[:3]) and second[3] == [2 * v for v in first[3]]


def test_without_speculation_there_are_no_spec_decode_counters(tiny_model):
    llm = engine(tiny_model, None)
    llm.generate([[5, 6, 7, 5, 6, 7]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    names = {m.name for m in llm.get_metrics()}
    assert names and not names & set(SPEC_NAMES)  # as vLLM registers them only with a speculative_config
