"""Issue 31: a bad request is refused up front (ValueError naming the field) and costs nothing
else; a failure inside a step, or an exception out of ``generate`` (Ctrl-C, ``on_step``), aborts
the requests concerned and frees their blocks, so the next call on the same ``LLM`` is correct."""

import math

import pytest
import torch

from course_lib.engine import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], [20, 21, 22, 23, 24, 25, 26]]


def engine(model, **kwargs) -> LLM:
    options = dict(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=96, block_size=4, dtype=torch.float64)
    return LLM(model, **{**options, **kwargs})


def token_ids(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


@pytest.fixture(scope="module")
def expected(tiny_model) -> list[list[int]]:
    return token_ids(engine(tiny_model).generate(PROMPTS, GREEDY))


def assert_healthy(llm: LLM, expected) -> None:
    """Nothing left queued or holding blocks, and the same LLM serves as a fresh one does."""
    pool = llm.kv_cache_manager.block_pool
    assert not llm.scheduler.has_unfinished_requests() and not llm.scheduler.requests
    assert pool.num_free_blocks == pool.num_blocks
    assert token_ids(llm.generate(PROMPTS, GREEDY)) == expected
    assert pool.num_free_blocks == pool.num_blocks


@pytest.mark.parametrize("bad", [[60, 64], [60, 1000], [-1, 5]])
def test_prompt_ids_outside_the_vocabulary_are_refused(tiny_model, expected, bad):
    llm = engine(tiny_model)
    with pytest.raises(ValueError, match=r"(?i)prompt.*\[0, 64\)"):
        llm.generate([PROMPTS[0], bad], GREEDY)
    with pytest.raises(ValueError, match=r"(?i)prompt.*\[0, 64\)"):
        llm.add_request(bad, GREEDY)
    assert_healthy(llm, expected)


@pytest.mark.parametrize("field, value, match", [
    ("temperature", math.nan, "temperature"), ("temperature", math.inf, "temperature"),
    ("top_p", math.nan, "top_p"), ("top_k", 2.5, "top_k"), ("logprobs", 2.5, "logprobs"),
    ("max_tokens", 2.5, "max_tokens"), ("min_tokens", 1.5, "min_tokens"), ("n", 1.5, "n"),
    ("seed", 1.5, "seed"), ("stop_token_ids", (3, 2.5), "stop_token_ids"), ("top_k", True, "top_k"),
])
def test_sampling_params_refuse_bad_values_in_the_constructor(field, value, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**{field: value})


def test_sampling_params_still_take_integral_values():
    params = SamplingParams(temperature=0.5, top_k=3, logprobs=2, max_tokens=4, seed=7, stop_token_ids=[3])
    assert (params.top_k, params.logprobs, params.stop_token_ids) == (3, 2, (3,))


def test_stop_token_ids_outside_the_vocabulary_are_refused(tiny_model, expected):
    llm = engine(tiny_model)
    params = SamplingParams(temperature=0, max_tokens=6, min_tokens=3, stop_token_ids=[3, 1000])
    with pytest.raises(ValueError, match=r"stop_token_ids.*\[0, 64\)"):
        llm.generate(PROMPTS, [GREEDY, params, GREEDY])
    with pytest.raises(ValueError, match="stop_token_ids"):
        llm.add_request(PROMPTS[0], params)
    assert_healthy(llm, expected)


def test_a_request_id_in_flight_is_refused_and_generate_numbers_around_it(tiny_model, expected):
    llm = engine(tiny_model)
    assert llm.add_request(PROMPTS[1], GREEDY, request_id="0") == ["0"]
    with pytest.raises(ValueError, match="request id '0'"):
        llm.add_request(PROMPTS[0], GREEDY, request_id="0")
    outputs = llm.generate(PROMPTS, GREEDY)  # numbers its own requests, skipping the "0" in flight
    assert token_ids(outputs) == expected and "0" not in [o.request_id for o in outputs]
    two = SamplingParams(n=2, temperature=0, max_tokens=2)
    assert llm.add_request(PROMPTS[0], two, request_id="a") == ["a.0", "a.1"]
    with pytest.raises(ValueError, match="request id 'a.1'"):
        llm.add_request(PROMPTS[0], GREEDY, request_id="a.1")
    while llm.scheduler.has_unfinished_requests():
        llm.step()
    assert llm.add_request(PROMPTS[0], GREEDY, request_id="a.1") == ["a.1"]  # free again once finished
    llm.abort_request("a.1")
    assert_healthy(llm, expected)


def test_a_failure_inside_a_step_aborts_that_steps_requests_once(tiny_model, expected, monkeypatch):
    llm = engine(tiny_model, max_num_seqs=2)  # the third prompt waits: the failure must not touch it either
    real, calls = llm.runner.execute, []

    def fail_on_third_call(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("boom")
        return real(*args, **kwargs)

    monkeypatch.setattr(llm.runner, "execute", fail_on_third_call)
    with pytest.raises(RuntimeError, match="boom"):
        llm.generate(PROMPTS, GREEDY)
    assert_healthy(llm, expected)


def test_a_failure_inside_step_called_directly_aborts_only_that_steps_requests(tiny_model, expected, monkeypatch):
    llm = engine(tiny_model, max_num_seqs=2)
    ids = [llm.add_request(p, GREEDY)[0] for p in PROMPTS]
    llm.step()
    monkeypatch.setattr(llm.runner, "execute", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        llm.step()
    monkeypatch.undo()
    assert sorted(llm.scheduler.requests) == [ids[2]]  # the waiting request was not in the failed step
    finished = []
    while llm.scheduler.has_unfinished_requests():
        finished += llm.step()
    assert [r.output_token_ids for r in finished] == [expected[2]]
    assert_healthy(llm, expected)


@pytest.mark.parametrize("at_step", [1, 3, 5])
@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_an_exception_out_of_generate_aborts_what_it_queued(tiny_model, expected, at_step, error):
    llm = engine(tiny_model, max_num_seqs=2)

    def on_step(step):
        if step == at_step:
            raise error("stop")

    with pytest.raises(error):
        llm.generate(PROMPTS, GREEDY, on_step=on_step)
    pool = llm.kv_cache_manager.block_pool
    assert pool.num_free_blocks == pool.num_blocks and not llm.scheduler.has_unfinished_requests()
    assert llm.reset_prefix_cache()
    before = len(llm.step_trace)
    llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=1))
    assert len(llm.step_trace) == before + 1  # no orphans finished on the way
    assert_healthy(llm, expected)


def test_abort_request_frees_running_waiting_and_sibling_requests(tiny_model, expected):
    llm = engine(tiny_model, max_num_seqs=2, scheduling_policy="priority")
    first = llm.add_request(PROMPTS[0], SamplingParams(n=2, temperature=0, max_tokens=6))
    second = llm.add_request(PROMPTS[2], GREEDY, priority=1)
    llm.step()
    llm.step()
    assert [r.request_id for r in llm.scheduler.waiting] == second
    llm.abort_request(second + ["not-a-request"])  # unknown ids are ignored, as in vLLM
    assert sorted(llm.scheduler.requests) == first
    llm.abort_request("0")  # a parent id aborts all its samples
    assert not llm.scheduler.requests and llm.reset_prefix_cache()
    assert_healthy(llm, expected)


@pytest.mark.parametrize("options", [
    dict(num_gpu_blocks=24, preemption_mode="swap"),  # 96 tokens of KV for 3 growing requests: swaps
    dict(num_gpu_blocks=24, preemption_mode="recompute", kv_offload_blocks=16),
    dict(speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2}),
    "draft_model",
])
def test_interrupting_generate_at_every_step_leaves_a_correct_engine(tiny_model, options):
    """Ctrl-C at each step in turn, under preemption by swap, the offload tier and speculation:
    every time the pool ends full and the next call equals a fresh engine's output."""
    if options == "draft_model":  # the model drafts for itself: its KV rows must follow every abort
        options = dict(speculative_config={"method": "draft_model", "model": tiny_model, "num_speculative_tokens": 2})
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6], [10, 11, 12, 10, 11], [20, 21, 22, 23, 24, 25, 26]]
    want = token_ids(engine(tiny_model, **options).generate(prompts, params))
    llm = engine(tiny_model, **options)
    pool, step = llm.kv_cache_manager.block_pool, 0
    while True:
        step += 2  # every other step: the same coverage of states at half the cost

        def on_step(at, stop=len(llm.step_trace) + step):
            if at == stop:
                raise KeyboardInterrupt

        try:
            got = token_ids(llm.generate(prompts, params, on_step=on_step))
        except KeyboardInterrupt:
            assert pool.num_free_blocks == pool.num_blocks and not llm.scheduler.requests
            assert not llm.scheduler.swapped and llm.reset_prefix_cache()
            continue
        assert got == want and pool.num_free_blocks == pool.num_blocks
        break
    assert step > 10 and (options.get("preemption_mode") != "swap" or llm.scheduler.total_preemptions)


def test_abort_forgets_the_draft_models_kv_before_the_id_can_be_reused(tiny_model):
    spec = {"method": "draft_model", "model": tiny_model, "num_speculative_tokens": 2}
    llm = engine(tiny_model, speculative_config=spec)
    llm.add_request(PROMPTS[0], GREEDY, request_id="x")
    llm.step()
    llm.step()
    assert "x" in llm.proposer.num_valid
    llm.abort_request(["x"])
    assert "x" not in llm.proposer.num_valid and not llm.scheduler.requests
    llm.add_request(PROMPTS[2], GREEDY, request_id="x")
    finished = []
    while llm.scheduler.has_unfinished_requests():
        finished += llm.step()
    assert [r.output_token_ids for r in finished] == [token_ids(engine(tiny_model).generate([PROMPTS[2]], GREEDY))[0]]


def test_at_tensor_parallel_size_two_bad_input_and_an_interrupt_cost_the_ranks_nothing():
    """The shipped 258-token model over two gloo ranks: every bad request is refused before a rank
    sees it, an interrupt between steps aborts the call's requests, and the same workers then
    serve exactly what one rank serves."""
    prompts, params = ["The for statement", "Lists are mutable"], SamplingParams(temperature=0, max_tokens=8)
    want = token_ids(LLM("tiny-llama", max_num_seqs=4).generate(prompts, params))
    with LLM("tiny-llama", tensor_parallel_size=2, max_num_seqs=4) as llm:
        processes = llm.runner.pool._ranks.processes
        with pytest.raises(ValueError, match=r"(?i)prompt.*\[0, 258\)"):
            llm.generate([[256, 1000]], params)
        with pytest.raises(ValueError, match="stop_token_ids"):
            llm.generate(prompts, SamplingParams(min_tokens=2, stop_token_ids=[300]))
        llm.add_request(prompts[0], params, request_id="0")
        with pytest.raises(ValueError, match="request id '0'"):
            llm.add_request(prompts[1], params, request_id="0")
        llm.abort_request("0")

        def on_step(step):
            if step == 2:
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            llm.generate(prompts, params, on_step=on_step)
        pool = llm.kv_cache_manager.block_pool
        assert pool.num_free_blocks == pool.num_blocks and llm.reset_prefix_cache()
        assert token_ids(llm.generate(prompts, params)) == want
        assert all(process.is_alive() for process in processes)
