"""Issue 31 at ``tensor_parallel_size=2``: an exception inside a step costs that step's requests,
not the rank workers; Ctrl-C while the ranks are mid-step leaves no reply for the next step to
take as its own. Only a rank left waiting inside a collective (or dead, or hung) stops the workers.
At either size, the KV offload tier's copies of a failed step never serve a later prefix hit."""

import math

import _thread
import threading
import time

import pytest
import torch

from course_lib.collectives.launch import RankFailure
from course_lib.engine import tensor_parallel_runner
from course_lib.engine.llm import LLM
from course_lib.engine.sampling_params import SamplingParams
from tests.engine.test_bad_input import engine, token_ids

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], [20, 21, 22, 23, 24, 25, 26]]
FORWARD = tensor_parallel_runner._forward


@pytest.fixture(scope="module")
def expected(tiny_model) -> list[list[int]]:
    return token_ids(engine(tiny_model).generate(PROMPTS, GREEDY))


@pytest.fixture(scope="module")
def llm(tiny_model):
    """One TP=2 engine for the tests whose failures must not stop its workers."""
    with engine(tiny_model, max_num_seqs=2, tensor_parallel_size=2, distributed_timeout_s=20) as shared:
        yield shared


def every_rank_refuses_the_batch(worker, batch):
    raise ValueError("this batch is bad")


def rank_one_fails_after_its_forward(worker, batch):
    result = FORWARD(worker, batch)  # every all-reduce of the step is done on both ranks
    if torch.distributed.get_rank() == 1:
        raise ValueError("rank 1 failed after its forward")
    return result


def rank_one_fails_before_its_forward(worker, batch):
    if torch.distributed.get_rank() == 1:
        raise ValueError("rank 1 failed before its forward")
    return FORWARD(worker, batch)  # rank 0 waits in the first all-reduce for a peer that never comes


def slow_forward(worker, batch):
    time.sleep(0.6)
    return FORWARD(worker, batch)


def replace_the_forward_of_step(monkeypatch, llm: LLM, step: int, replacement) -> None:
    """The ``step``-th call the runner makes from now runs ``replacement`` on the ranks instead."""
    pool, calls = llm.runner.pool, []
    real_call = pool.call

    def call(fn, *args, **kwargs):
        calls.append(fn)
        return real_call(replacement if len(calls) == step else fn, *args, **kwargs)

    monkeypatch.setattr(pool, "call", call)


def assert_healthy(llm: LLM, expected, pids) -> None:
    """Nothing queued or holding blocks, and the same rank processes serve what one rank serves."""
    pool = llm.kv_cache_manager.block_pool
    assert not llm.scheduler.requests and pool.num_free_blocks == pool.num_blocks and llm.reset_prefix_cache()
    assert token_ids(llm.generate(PROMPTS, GREEDY)) == expected
    assert [p.pid for p in llm.runner.pool._ranks.processes] == pids and not llm.runner.pool.closed


def pids_of(llm: LLM) -> list[int]:
    return [p.pid for p in llm.runner.pool._ranks.processes]


@pytest.mark.parametrize("failure, message", [(every_rank_refuses_the_batch, "this batch is bad"),
                                              (rank_one_fails_after_its_forward, "rank 1 failed after")])
def test_an_exception_inside_a_step_aborts_its_requests_and_the_ranks_serve_on(llm, expected, monkeypatch,
                                                                                failure, message):
    pids = pids_of(llm)
    replace_the_forward_of_step(monkeypatch, llm, 3, failure)
    with pytest.raises(RankFailure, match=message):
        llm.generate(PROMPTS, GREEDY)
    monkeypatch.undo()
    assert_healthy(llm, expected, pids)


def test_a_failing_step_called_directly_costs_only_its_requests(llm, expected, monkeypatch):
    pids = pids_of(llm)
    ids = [llm.add_request(p, GREEDY)[0] for p in PROMPTS]  # max_num_seqs=2: the third waits
    llm.step()
    replace_the_forward_of_step(monkeypatch, llm, 1, every_rank_refuses_the_batch)
    with pytest.raises(RankFailure, match="this batch is bad"):
        llm.step()
    monkeypatch.undo()
    assert sorted(llm.scheduler.requests) == [ids[2]]
    finished = []
    while llm.scheduler.has_unfinished_requests():
        finished += llm.step()
    assert [r.output_token_ids for r in finished] == [expected[2]]
    assert_healthy(llm, expected, pids)


def test_ctrl_c_while_the_ranks_are_mid_step(llm, expected, monkeypatch):
    pids = pids_of(llm)
    replace_the_forward_of_step(monkeypatch, llm, 2, slow_forward)
    timer = threading.Timer(0.3, _thread.interrupt_main)  # lands while both ranks sleep in step 2
    real_execute, steps = llm.runner.execute, []

    def start_timer_on_step_two(*args, **kwargs):
        steps.append(1)
        if len(steps) == 2:
            timer.start()
        return real_execute(*args, **kwargs)

    monkeypatch.setattr(llm.runner, "execute", start_timer_on_step_two)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(PROMPTS, GREEDY)
    monkeypatch.undo()
    assert len(steps) == 2 and timer.finished.is_set()
    assert_healthy(llm, expected, pids)


def test_ctrl_c_right_after_the_step_is_sent(llm, expected, monkeypatch):
    pids = pids_of(llm)
    ranks, calls = llm.runner.pool._ranks, []
    real_collect = ranks.collect

    def interrupted_on_the_third(timeout_s):
        calls.append(timeout_s)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_collect(timeout_s)

    monkeypatch.setattr(ranks, "collect", interrupted_on_the_third)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(PROMPTS, GREEDY)
    assert_healthy(llm, expected, pids)  # its first step reads (and drops) the interrupted step's replies


def test_a_rank_left_inside_an_all_reduce_stops_the_workers_at_once_naming_why(tiny_model, monkeypatch):
    llm = engine(tiny_model, max_num_seqs=2, tensor_parallel_size=2, distributed_timeout_s=60)
    replace_the_forward_of_step(monkeypatch, llm, 2, rank_one_fails_before_its_forward)
    started = time.monotonic()
    with pytest.raises(RankFailure, match=r"rank 1 failed before(.|\n)*rank 0: still running.*inside all_reduce"):
        llm.generate(PROMPTS, GREEDY)
    assert time.monotonic() - started < 20  # the stuck rank is seen, not waited for until the timeout
    pool = llm.kv_cache_manager.block_pool
    assert not llm.scheduler.requests and pool.num_free_blocks == pool.num_blocks
    with pytest.raises(RuntimeError, match=r"stopped after a RankFailure while running rank_one_fails_before_its_"
                                           r"forward \(ValueError: rank 1 failed before its forward\).*new LLM"):
        llm.generate(PROMPTS, GREEDY)


@pytest.mark.parametrize("tensor_parallel_size", [1, 2])
@pytest.mark.parametrize("copies", ["offload", "reload"])
def test_the_copies_of_a_failed_step_never_serve_a_prefix_hit(tiny_model, monkeypatch, tensor_parallel_size, copies):
    """One request at a time in 10 blocks: B's prefill evicts A's 6 blocks (offloaded to the CPU
    tier), A's next prefill reloads them. The step making those copies fails; A's logprobs later
    must still be the reference's (before: the tier kept blocks never copied to, zeros)."""
    options = dict(max_num_seqs=1, max_model_len=40, num_gpu_blocks=10, kv_offload_blocks=20)
    a, b = list(range(2, 26)), list(range(30, 54))
    scored = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0)
    want = engine(tiny_model, **options).generate([a], scored)[0].outputs[0]
    llm = engine(tiny_model, tensor_parallel_size=tensor_parallel_size, **options)
    llm.generate([a], GREEDY)
    if copies == "reload":
        llm.generate([b], GREEDY)  # A's blocks go to the CPU tier, copied for real
    plans, schedule = [], llm.scheduler.schedule
    monkeypatch.setattr(llm.scheduler, "schedule", lambda: plans.append(schedule()) or plans[-1])
    if tensor_parallel_size == 1:
        monkeypatch.setattr(llm.runner, "execute", lambda *args: (_ for _ in ()).throw(RuntimeError("boom")))
    else:
        replace_the_forward_of_step(monkeypatch, llm, 1, every_rank_refuses_the_batch)
    with pytest.raises((RuntimeError, RankFailure)):
        llm.generate([b if copies == "offload" else a], GREEDY)
    monkeypatch.undo()
    assert getattr(plans[0], f"kv_{copies}")  # the failed step did plan copies of that kind
    got = llm.generate([a], scored)[0].outputs[0]
    assert got.token_ids == want.token_ids
    assert math.isclose(got.cumulative_logprob, want.cumulative_logprob, rel_tol=1e-9)
    llm.close()
