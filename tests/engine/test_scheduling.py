"""Token budgets, chunked prefill, the long-prefill cap, static batching and bad input."""

from dataclasses import replace

import pytest
import torch

from course_lib.engine.llm import LLM
from course_lib.engine.sampling_params import SamplingParams
from course_lib.models.llama import LlamaForCausalLM

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def engine(model, **kwargs) -> LLM:
    settings = dict(max_model_len=128, num_gpu_blocks=64, dtype=torch.float64)
    settings.update(kwargs)
    return LLM(model, **settings)


def test_chunked_prefill_splits_a_long_prompt_by_the_budget(tiny_model):
    llm = engine(tiny_model, max_num_batched_tokens=16)
    llm.generate([list(range(2, 52))], GREEDY)  # 50 prompt tokens
    chunks = [r.scheduled["0"] for r in llm.step_trace if "0" in r.scheduled]
    assert chunks[:4] == [16, 16, 16, 2] and chunks[4:] == [1] * 5


def test_running_decodes_go_first_and_prefill_fills_the_rest(tiny_model):
    llm = engine(tiny_model, max_num_batched_tokens=16)
    llm.add_request([5, 6, 7], GREEDY)
    llm.step()  # prefill of request 0
    llm.add_request(list(range(2, 42)), GREEDY)
    llm.step()
    assert llm.step_trace[-1].scheduled == {"0": 1, "1": 15}


def test_long_prefill_threshold_caps_each_request_per_step(tiny_model):
    llm = engine(tiny_model, max_num_batched_tokens=64, long_prefill_token_threshold=8)
    llm.generate([list(range(2, 30)), list(range(3, 20))], GREEDY)
    first = llm.step_trace[0].scheduled
    assert first == {"0": 8, "1": 8}
    assert all(n <= 8 for r in llm.step_trace for n in r.scheduled.values())


def test_max_num_seqs_bounds_the_batch(tiny_model):
    llm = engine(tiny_model, max_num_seqs=2)
    llm.generate([[5, 6], [7, 8], [9, 10]], GREEDY)
    assert max(len(r.running) for r in llm.step_trace) == 2


def test_waiting_admission_stops_at_the_first_request_that_does_not_fit(tiny_model):
    llm = engine(tiny_model, max_model_len=64, num_gpu_blocks=5, block_size=16)
    llm.add_request(list(range(2, 50)), GREEDY)  # 48 tokens: 3 blocks
    llm.add_request(list(range(40, 2, -1)), GREEDY)  # 38 tokens: 3 blocks, does not fit beside it
    llm.add_request([5, 6], GREEDY)  # would fit, but waits behind the head of the line
    llm.step()
    assert llm.step_trace[0].scheduled == {"0": 48}
    assert llm.step_trace[0].waiting == ["1", "2"]


def test_static_batching_gives_the_same_tokens_in_more_steps(tiny_model):
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    lengths = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (2, 12, 3)]
    results = {}
    for policy in ("continuous", "static"):
        llm = engine(tiny_model, max_num_seqs=2, scheduling_policy=policy)
        ids = [llm.add_request(p, s)[0] for p, s in zip(prompts, lengths)]
        done = {}
        while llm.scheduler.has_unfinished_requests():
            done.update({r.request_id: r.output_token_ids for r in llm.step()})
        results[policy] = ([done[i] for i in ids], len(llm.step_trace))
    assert results["static"][0] == results["continuous"][0]
    assert results["static"][1] > results["continuous"][1]


def test_timing_metrics_are_ordered(tiny_model):
    out = engine(tiny_model).generate([[5, 6, 7]], GREEDY)[0]
    metrics = out.metrics[0]
    assert metrics.ttft > 0 and len(metrics.itl) == 5 and all(gap >= 0 for gap in metrics.itl)
    assert out.outputs[0].finish_reason == "length"


def test_eos_stops_a_request(tiny_model):
    free_run = engine(tiny_model).generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    tokens = free_run[0].outputs[0].token_ids
    stop_at = tokens[3]  # make the 4th generated token the model's EOS
    model = LlamaForCausalLM(replace(tiny_model.config, eos_token_id=stop_at, eos_token_ids=(stop_at,))).double().eval()
    model.load_state_dict(tiny_model.state_dict())
    out = engine(model).generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=30))[0].outputs[0]
    assert out.token_ids == tokens[: tokens.index(stop_at) + 1] and out.finish_reason == "stop"


def test_bad_input_gets_clear_errors_and_loses_nothing(tiny_model):
    llm = engine(tiny_model, max_model_len=32)
    with pytest.raises(ValueError, match="more than max_model_len=32; shorten the prompt or raise max_model_len"):
        llm.generate([[5, 6], list(range(40))], GREEDY)
    assert not llm.scheduler.has_unfinished_requests()  # the valid prompt was not queued and lost
    assert llm.generate([[5, 6]], GREEDY)[0].outputs[0].token_ids
    with pytest.raises(ValueError, match="cannot hold one request of max_model_len=128 tokens; raise num_gpu_blocks"):
        LLM(tiny_model, max_model_len=128, num_gpu_blocks=4, block_size=16)
    with pytest.raises(ValueError, match="max_tokens must be at least 1"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="preemption_mode must be one of"):
        engine(tiny_model, preemption_mode="evict")
    with pytest.raises(FileNotFoundError, match="pass one of the shipped models"):
        LLM("no-such-model")
