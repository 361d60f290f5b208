"""vLLM's everyday API on the engine: imports, SamplingParams (validation, stop conditions,
min_tokens, logprobs), one SamplingParams per prompt, priority scheduling, reset_prefix_cache and
get_metrics. Stop conditions are checked against an independent greedy oracle on the plain model."""

import math
import random
from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from course_lib.engine import LLM, SamplingParams
from course_lib.engine.request import Request
from course_lib.models.llama import LlamaForCausalLM
from course_lib.models.tokenizer import ByteTokenizer

DECODE = ByteTokenizer().decode


def engine(model, **kwargs) -> LLM:
    options = dict(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=96, block_size=4, dtype=torch.float64)
    return LLM(model, **{**options, **kwargs})


@torch.inference_mode()
def oracle(model, prompt: list[int], params: SamplingParams, eos_ids=(1,), max_model_len: int = 96):
    """vLLM V1's stop rules, re-stated plainly on the dense model: (tokens, finish_reason,
    stop_reason, text). Until ``min_tokens`` tokens are out, EOS and stop ids are masked and only
    the context limit stops it; then EOS, a stop id, a stop string (the first in list order that
    ends in text added after the first ``min_tokens`` tokens) and only then the length limits."""
    tokens, out = list(prompt), []
    masked = sorted(set(eos_ids) | set(params.stop_token_ids))
    while True:
        logits = model.forward_dense(torch.tensor([tokens]))[0, -1].clone()
        if len(out) < params.min_tokens:
            logits[masked] = float("-inf")
        token = int(torch.argmax(logits))
        out.append(token)
        tokens.append(token)
        too_long = len(out) >= params.max_tokens or len(tokens) >= max_model_len
        if len(out) < params.min_tokens:
            if too_long:
                return out, "length", None, DECODE(out)
            continue
        if not params.ignore_eos and token in eos_ids:
            return out, "stop", None if token == eos_ids[0] else token, DECODE(out[:-1])
        if token in params.stop_token_ids:
            return out, "stop", token, DECODE(out[:-1])
        text, settled = DECODE(out), len(DECODE(out[:params.min_tokens]))
        if len(out) > params.min_tokens:
            for stop in params.stop:
                at = text.find(stop, max(0, settled - len(stop) + 1))
                if at >= 0:
                    return out, "stop", stop, text[:at]
        if too_long:
            return out, "length", None, text


def completion(llm: LLM, prompt, params):
    output = llm.generate([prompt], params)[0].outputs[0]
    return output.token_ids, output.finish_reason, output.stop_reason, output.text


def test_the_vllm_imports_work():
    import course_lib.engine as engine_package
    from course_lib.engine.llm import LLM as Direct

    assert LLM is Direct and set(engine_package.__all__) == {"LLM", "SamplingParams"}
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        engine_package.Nope


@pytest.mark.parametrize("kwargs, message", [
    (dict(n=0), "n must be at least 1, got 0."),
    (dict(temperature=-0.5), "temperature must be non-negative, got -0.5."),
    (dict(top_p=0), r"top_p must be in \(0, 1\], got 0."),
    (dict(top_p=1.5), r"top_p must be in \(0, 1\], got 1.5."),
    (dict(top_k=-2), r"top_k must be 0 \(disable\), or at least 1, got -2."),
    (dict(max_tokens=0), "max_tokens must be at least 1, got 0."),
    (dict(min_tokens=-1), "min_tokens must be greater than or equal to 0, got -1."),
    (dict(max_tokens=4, min_tokens=5), "min_tokens must be less than or equal to max_tokens=4, got 5."),
    (dict(logprobs=-2), "logprobs must be non-negative or -1, got -2."),
    (dict(stop=["ok", ""]), "stop cannot contain an empty string."),
    (dict(stop_token_ids=[3, -1]), "stop_token_ids must be non-negative token ids"),
])
def test_bad_sampling_params_get_vllms_messages(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_stop_accepts_one_string_or_a_list():
    assert SamplingParams(top_k=-1).top_k == 0  # vLLM's older "off"
    assert SamplingParams(stop="\n").stop == ("\n",)
    assert SamplingParams(stop=["a", "b"], stop_token_ids=[4]).stop == ("a", "b")
    assert SamplingParams().stop == () and SamplingParams().stop_token_ids == ()


def test_a_stop_string_cuts_the_text_and_names_itself(tiny_model):
    free = oracle(tiny_model, [5, 6, 7], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    text = free[3]
    stop = text[6:8]  # two characters the model writes at its 7th and 8th tokens
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=["never there", stop])
    tokens, reason, stop_reason, out_text = completion(engine(tiny_model), [5, 6, 7], params)
    assert (reason, stop_reason) == ("stop", stop)
    assert out_text == text[:text.index(stop)] and stop not in out_text
    assert tokens == free[0][:len(tokens)] and DECODE(tokens).endswith(stop)  # ids are not cut
    assert (tokens, reason, stop_reason, out_text) == oracle(tiny_model, [5, 6, 7], params)


def test_a_stop_token_is_kept_in_the_ids_but_not_the_text(tiny_model):
    free = oracle(tiny_model, [9, 3], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0]
    stop_id = free[4]
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop_token_ids=[stop_id])
    tokens, reason, stop_reason, text = completion(engine(tiny_model), [9, 3], params)
    assert tokens == free[:free.index(stop_id) + 1]
    assert (reason, stop_reason, text) == ("stop", stop_id, DECODE(tokens[:-1]))


def test_min_tokens_masks_eos_and_stop_ids_until_reached(tiny_model):
    free = oracle(tiny_model, [5, 6, 7], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))[0]
    model = LlamaForCausalLM(replace(tiny_model.config, eos_token_id=free[1], eos_token_ids=(free[1], free[2])))
    model.load_state_dict(tiny_model.state_dict())
    model = model.double().eval()
    eos = (free[1], free[2])
    early = completion(engine(model), [5, 6, 7], SamplingParams(temperature=0, max_tokens=30))
    assert early[0] == free[:2] and early[1:3] == ("stop", None)  # its main EOS id stops it
    params = SamplingParams(temperature=0, max_tokens=30, min_tokens=6)
    tokens, reason, _, _ = completion(engine(model), [5, 6, 7], params)
    assert not set(tokens[:6]) & set(eos) and len(tokens) > 6
    assert (tokens, reason) == oracle(model, [5, 6, 7], params, eos_ids=eos)[:2]


def test_logprobs_are_the_raw_model_log_softmax(tiny_model):
    prompt = [4, 8, 15, 16]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=3)
    output = engine(tiny_model).generate([prompt], params)[0].outputs[0]
    assert len(output.logprobs) == len(output.token_ids) == 6
    sequence = prompt + output.token_ids
    with torch.inference_mode():
        logits = tiny_model.forward_dense(torch.tensor([sequence]))[0]
    for i, (token, entry) in enumerate(zip(output.token_ids, output.logprobs)):
        expected = torch.log_softmax(logits[len(prompt) - 1 + i].float(), -1)
        assert next(iter(entry)) == token and entry[token].rank == 1  # greedy: the top token, listed first
        top = torch.topk(expected, 3)
        assert list(entry) == top.indices.tolist()
        for rank, (value, other) in enumerate(zip(top.values.tolist(), top.indices.tolist()), 1):
            assert math.isclose(entry[other].logprob, value, abs_tol=1e-5) and entry[other].rank == rank
            assert entry[other].decoded_token == DECODE([other])
    assert math.isclose(output.cumulative_logprob, sum(e[t].logprob for e, t in zip(output.logprobs, output.token_ids)))


def test_logprobs_of_sampled_tokens_come_from_the_raw_logits(tiny_model):
    prompt = [2, 3]
    params = SamplingParams(temperature=5.0, top_k=10, max_tokens=12, ignore_eos=True, logprobs=1, seed=3)
    output = engine(tiny_model).generate([prompt], params)[0].outputs[0]
    with torch.inference_mode():
        logits = tiny_model.forward_dense(torch.tensor([prompt + output.token_ids]))[0]
    raw = torch.log_softmax(logits[len(prompt) - 1:-1].float(), -1)  # not divided by 5, not top-k filtered
    ranks = []
    for i, (entry, token) in enumerate(zip(output.logprobs, output.token_ids)):
        assert next(iter(entry)) == token and math.isclose(entry[token].logprob, float(raw[i, token]), abs_tol=1e-5)
        ranks.append(entry[token].rank)
        assert ranks[-1] == 1 + int((raw[i] > raw[i, token]).sum())
        assert len(entry) == (1 if ranks[-1] == 1 else 2)  # the top token joins a sampled token outside it
    assert any(rank > 1 for rank in ranks)  # a hot temperature picks unlikely tokens
    assert math.isclose(output.cumulative_logprob, float(raw[range(len(ranks)), output.token_ids].sum()), abs_tol=1e-4)
    quiet = engine(tiny_model).generate([prompt], replace(params, logprobs=None))[0].outputs[0]
    assert quiet.logprobs is None and quiet.cumulative_logprob is None and quiet.token_ids == output.token_ids


def test_logprobs_under_min_tokens_are_unmasked_and_all_means_the_vocabulary(tiny_model):
    prompt, eos = [5, 6, 7], tiny_model.config.eos_token_id
    params = SamplingParams(temperature=0, max_tokens=3, min_tokens=3, logprobs=-1)
    output = engine(tiny_model, max_logprobs=-1).generate([prompt], params)[0].outputs[0]
    assert all(len(entry) == tiny_model.config.vocab_size for entry in output.logprobs)
    with torch.inference_mode():
        logits = tiny_model.forward_dense(torch.tensor([prompt + output.token_ids]))[0]
    raw = torch.log_softmax(logits[len(prompt) - 1], -1)
    assert math.isfinite(output.logprobs[0][eos].logprob)  # masked for sampling, reported raw
    assert math.isclose(output.logprobs[0][eos].logprob, float(raw[eos]), abs_tol=1e-5)


def test_more_logprobs_than_max_logprobs_are_refused_before_queueing(tiny_model):
    llm = engine(tiny_model)
    with pytest.raises(ValueError, match="Requested sample logprobs of 21, which is greater than max allowed: 20"):
        llm.generate([[5], [6]], [SamplingParams(logprobs=2), SamplingParams(logprobs=21)])
    with pytest.raises(ValueError, match="Requested sample logprobs of 64, which is greater than max allowed: 20"):
        llm.add_request([5], SamplingParams(logprobs=-1))
    assert not llm.scheduler.has_unfinished_requests()
    wide = engine(tiny_model, max_logprobs=-1).generate([[5]], SamplingParams(max_tokens=1, logprobs=-1))
    assert len(wide[0].outputs[0].logprobs[0]) == 64


def test_one_sampling_params_per_prompt(tiny_model):
    llm = engine(tiny_model)
    short, long = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True), SamplingParams(
        temperature=0, max_tokens=7, ignore_eos=True)
    outputs = llm.generate([[5, 6], [7, 8], [9]], [short, long, short])
    assert [len(o.outputs[0].token_ids) for o in outputs] == [2, 7, 2]
    with pytest.raises(ValueError, match="sampling_params has 2 entries for 3 prompts"):
        llm.generate([[5], [6], [7]], [short, long])
    assert not llm.scheduler.has_unfinished_requests()  # refused before anything was queued


def test_priority_orders_admission_lower_first(tiny_model):
    llm = engine(tiny_model, max_num_seqs=1, scheduling_policy="priority")
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    outputs = llm.generate([[5, 6], [7, 8], [9, 10]], params, priority=[2, 0, 1])
    first_step = {rid: next(r.step for r in llm.step_trace if rid in r.scheduled) for rid in ("0", "1", "2")}
    assert sorted(first_step, key=first_step.get) == ["1", "2", "0"]
    plain = engine(tiny_model).generate([[5, 6], [7, 8], [9, 10]], params)
    assert [o.outputs[0].token_ids for o in outputs] == [o.outputs[0].token_ids for o in plain]  # order is not output
    plain_llm = engine(tiny_model)
    with pytest.raises(ValueError, match='scheduling_policy="priority"'):
        plain_llm.generate([[5], [6]], params, priority=[0, 1])
    assert not plain_llm.scheduler.has_unfinished_requests()  # the first prompt was not queued either


def test_a_victim_scheduled_earlier_in_its_step_leaves_no_unwritten_block_cached(tiny_model):
    low_prompt, high_prompt = [2 + (i * 7) % 60 for i in range(24)], [3, 9, 27, 17, 51, 25, 11, 33]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=0)
    clean = engine(tiny_model, max_model_len=32).generate([low_prompt], params)[0].outputs[0]
    llm = engine(tiny_model, max_model_len=32, num_gpu_blocks=8, long_prefill_token_threshold=8,
                 scheduling_policy="priority")
    low = llm.add_request(low_prompt, params, priority=1)[0]
    llm.step()  # low is running, first in the batch
    llm.add_request(high_prompt, replace(params, max_tokens=3), priority=0)
    done = {}
    while llm.scheduler.has_unfinished_requests():
        done.update({r.request_id: r for r in llm.step()})
    victim_step = next(r for r in llm.step_trace if low in r.preempted)
    assert low not in victim_step.scheduled and victim_step.scheduled  # its tokens went back to the budget
    assert done[low].output_token_ids == clean.token_ids
    assert [e[t].logprob for e, t in zip(done[low].logprobs, clean.token_ids)] == \
        [e[t].logprob for e, t in zip(clean.logprobs, clean.token_ids)]


def test_priority_preempts_the_lowest_priority_running_request(tiny_model):
    rng = random.Random(3)
    prompts = [[rng.randrange(2, 64) for _ in range(12)] for _ in range(4)]
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    llm = engine(tiny_model, num_gpu_blocks=24, enable_prefix_caching=False, scheduling_policy="priority")
    ids = [llm.add_request(p, params, priority=rank)[0] for p, rank in zip(prompts, [3, 0, 2, 1])]
    while llm.scheduler.has_unfinished_requests():
        llm.step()
    victims = [rid for record in llm.step_trace for rid in record.preempted]
    assert victims and victims[0] == ids[0]  # priority 3: the lowest, although it arrived first
    fifo = engine(tiny_model, num_gpu_blocks=24, enable_prefix_caching=False)
    for p in prompts:
        fifo.add_request(p, params)
    while fifo.scheduler.has_unfinished_requests():
        fifo.step()
    assert next(rid for r in fifo.step_trace for rid in r.preempted) == "3"  # first-come: the last to arrive


def test_reset_prefix_cache_forgets_hits_and_is_refused_mid_run(tiny_model):
    llm = engine(tiny_model)
    prompt, params = list(range(2, 30)), SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    llm.generate([prompt], params)
    assert llm.generate([prompt], params)[0].num_cached_tokens == 24
    llm.add_request(prompt, params)
    llm.step()
    assert llm.reset_prefix_cache() is False  # a request still holds blocks
    while llm.scheduler.has_unfinished_requests():
        llm.step()
    assert llm.reset_prefix_cache() is True
    assert llm.generate([prompt], params)[0].num_cached_tokens == 0
    metrics = {m.name: m.value for m in llm.get_metrics()}
    assert (metrics["vllm:prefix_cache_queries"], metrics["vllm:prefix_cache_hits"]) == (4 * 28, 2 * 24)  # still counting


def test_get_metrics_counts_as_vllm_does(tiny_model):
    llm = engine(tiny_model, num_gpu_blocks=24)
    prompt, params = list(range(2, 30)), SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    llm.generate([prompt, prompt], params)  # both looked up once; the second finds 24 of its 28 tokens
    for _ in range(3):
        llm.add_request(list(range(30, 50)), params)
    llm.step()
    metrics = {m.name: (m.kind, m.value) for m in llm.get_metrics()}
    assert metrics["vllm:prefix_cache_queries"] == ("counter", 2 * 28 + 3 * 20)
    assert metrics["vllm:prefix_cache_hits"] == ("counter", 24 + 2 * 16)  # later copies hit the first's blocks
    assert metrics["vllm:num_requests_running"] == ("gauge", 3) and metrics["vllm:num_requests_waiting"] == ("gauge", 0)
    held = {id(b) for blocks in llm.kv_cache_manager.req_to_blocks.values() for b in blocks}
    assert metrics["vllm:kv_cache_usage_perc"][0] == "gauge"
    assert math.isclose(metrics["vllm:kv_cache_usage_perc"][1], len(held) / 24)
    assert metrics["vllm:num_preemptions"] == ("counter", 0)
    assert "vllm:external_prefix_cache_hits" not in metrics  # no offload tier


def test_a_preempted_requests_lookups_are_counted_apart(tiny_model):
    rng = random.Random(3)
    prompts = [[rng.randrange(2, 64) for _ in range(12)] for _ in range(4)]
    llm = engine(tiny_model, num_gpu_blocks=24)
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    metrics = {m.name: m.value for m in llm.get_metrics()}
    stats = llm.kv_cache_manager.prefix_cache_stats
    assert metrics["vllm:num_preemptions"] > 0 and stats.preempted_queried_tokens > 0
    assert metrics["vllm:prefix_cache_queries"] == sum(map(len, prompts))  # each new prompt once


def test_a_stop_on_the_last_allowed_token_is_a_stop(tiny_model):
    free = oracle(tiny_model, [5, 6, 7], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    k = next(i for i in range(1, len(free)) if free[i] not in free[:i])
    by_id = completion(engine(tiny_model), [5, 6, 7], SamplingParams(temperature=0, max_tokens=k + 1,
                                                                     ignore_eos=True, stop_token_ids=[free[k]]))
    assert by_id == (free[:k + 1], "stop", free[k], DECODE(free[:k]))
    stop = DECODE(free[k - 1:k + 1])
    by_text = completion(engine(tiny_model), [5, 6, 7], SamplingParams(temperature=0, max_tokens=k + 1,
                                                                       ignore_eos=True, stop=[stop]))
    text = DECODE(free[:k + 1])
    assert by_text == (free[:k + 1], "stop", stop, text[:text.find(stop)])


def test_the_first_stop_string_in_list_order_wins():
    text = "xab"
    request = Request("r", [1], SamplingParams(max_tokens=10, stop=["ab", "b"]), [1], 0.0, 4, 96, detokenize=DECODE)
    first = Request("r", [1], SamplingParams(max_tokens=10, stop=["b", "ab"]), [1], 0.0, 4, 96, detokenize=DECODE)
    for r in (request, first):
        for token in text.encode():
            r.append_output_token(token, 0.0)
            if r.check_stop():
                break
    assert (request.stop_reason, request.stop_text_end) == ("ab", 1)
    assert (first.stop_reason, first.stop_text_end) == ("b", 2)


@pytest.mark.parametrize("stop", ["é", "éa", "€"])
def test_a_stop_string_made_of_multibyte_characters_is_found(stop):
    request = Request("r", [1], SamplingParams(max_tokens=20, stop=[stop]), [257], 0.0, 4, 96, detokenize=DECODE)
    for token in ("x" + stop + "yz").encode():
        request.append_output_token(token, 0.0)
        if request.check_stop():
            break
    assert request.stop_reason == stop and request.stop_text_end == 1 and DECODE(request.output_token_ids).endswith(stop)


def test_the_models_extra_eos_ids_are_reported_as_stop_reasons(tiny_model):
    free = oracle(tiny_model, [5, 6, 7], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))[0]
    model = LlamaForCausalLM(replace(tiny_model.config, eos_token_ids=(1, free[2])))
    model.load_state_dict(tiny_model.state_dict())
    out = completion(engine(model.double().eval()), [5, 6, 7], SamplingParams(temperature=0, max_tokens=30))
    assert out[0] == free[:free.index(free[2]) + 1] and out[1:3] == ("stop", free[2])  # not the main EOS: named


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), min_tokens=st.integers(0, 6), ignore_eos=st.booleans(),
       num_stop_ids=st.integers(0, 3), stop_len=st.sampled_from([0, 1, 2]), block_size=st.sampled_from([1, 4, 8]),
       max_num_batched_tokens=st.integers(4, 48), spare_blocks=st.integers(0, 20),
       policy=st.sampled_from(["continuous", "priority"]), prefix_caching=st.booleans())
def test_stop_conditions_match_the_oracle_under_any_schedule(
    tiny_model, seed, min_tokens, ignore_eos, num_stop_ids, stop_len, block_size, max_num_batched_tokens,
    spare_blocks, policy, prefix_caching,
):
    rng = random.Random(seed)
    stop_ids = rng.sample(range(2, 64), num_stop_ids)
    stop = ["".join(chr(rng.randrange(2, 64)) for _ in range(stop_len))] if stop_len else []
    params = SamplingParams(temperature=0, max_tokens=rng.randint(max(1, min_tokens), 14), min_tokens=min_tokens,
                            ignore_eos=ignore_eos, stop_token_ids=stop_ids, stop=stop)
    prompts = [[rng.randrange(2, 64) for _ in range(rng.randint(1, 20))] for _ in range(rng.randint(1, 5))]
    llm = engine(tiny_model, max_num_batched_tokens=max_num_batched_tokens, block_size=block_size,
                 num_gpu_blocks=-(-96 // block_size) + spare_blocks, enable_prefix_caching=prefix_caching,
                 scheduling_policy=policy)
    outputs = llm.generate(prompts, params, priority=[rng.randint(0, 3) for _ in prompts] if policy == "priority"
                           else None)
    for prompt, output in zip(prompts, outputs):
        got = output.outputs[0]
        assert (got.token_ids, got.finish_reason, got.stop_reason, got.text) == oracle(tiny_model, prompt, params)


@pytest.mark.parametrize("seed", range(6))
def test_speculation_changes_no_stop_text_or_logprob(tiny_model, seed):
    rng = random.Random(seed)
    prompt = [rng.randrange(2, 64) for _ in range(rng.randint(3, 12))] * 2  # repeats: n-gram drafts hit
    free = oracle(tiny_model, prompt, SamplingParams(temperature=0, max_tokens=14, ignore_eos=True))[0]
    params = SamplingParams(temperature=0, max_tokens=14, min_tokens=rng.randint(0, 6), n=2, logprobs=2,
                            stop_token_ids=[rng.choice(free)] if seed % 2 else None,
                            stop=[chr(rng.choice(free))] if seed % 3 else None)
    plain = engine(tiny_model).generate([prompt], params)[0].outputs
    verified = 0
    for spec in ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3},
                 {"method": "draft_model", "model": tiny_model, "num_speculative_tokens": 3}):
        llm = engine(tiny_model, speculative_config=spec)
        speculated = llm.generate([prompt], params)[0].outputs
        for a, b in zip(plain, speculated):
            assert (a.token_ids, a.finish_reason, a.stop_reason, a.text) == (b.token_ids, b.finish_reason, b.stop_reason, b.text)
            for x, y in zip(a.logprobs, b.logprobs):
                assert list(x) == list(y) and all(math.isclose(x[t].logprob, y[t].logprob, abs_tol=1e-9) for t in x)
        verified += llm.spec_decode_stats.num_draft_tokens
    assert verified > 0  # drafts were really verified
