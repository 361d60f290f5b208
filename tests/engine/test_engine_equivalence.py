"""The engine's central property: greedy outputs equal the plain model's, whatever the schedule."""

import functools
import random

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from course_lib.engine.llm import LLM
from course_lib.engine.proposers import DraftModelProposer
from course_lib.engine.sampling_params import SamplingParams
from course_lib.models.generate import greedy_reference

GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


def check_invariants(llm: LLM) -> None:
    """Checked after every step of every run."""
    record, config = llm.step_trace[-1], llm.scheduler_config
    assert record.num_tokens <= config.max_num_batched_tokens
    assert len(record.scheduled) <= config.max_num_seqs and len(record.running) <= config.max_num_seqs
    pool = llm.kv_cache_manager.block_pool
    free = set(id(b) for b in pool.free_block_queue)
    assert len(free) == pool.num_free_blocks
    references = {}
    for blocks in llm.kv_cache_manager.req_to_blocks.values():
        for block in blocks:
            references[id(block)] = references.get(id(block), 0) + 1
    block_size = llm.cache_config.block_size
    drafts_hold_slots = isinstance(llm.proposer, DraftModelProposer)  # a draft model's KV sits in the pool
    for request in llm.scheduler.running:  # exactly the blocks its computed tokens (and a draft model's drafts) need
        held = len(llm.kv_cache_manager.req_to_blocks[request.request_id])
        lookahead = len(request.spec_token_ids) if drafts_hold_slots else 0
        assert held == -(-(request.num_computed_tokens + lookahead) // block_size), request.request_id
    for block in pool.blocks:
        assert block.ref_cnt >= 0
        assert (block.ref_cnt == 0) == (id(block) in free)  # free exactly when unreferenced
        assert block.ref_cnt == references.get(id(block), 0)
    if config.policy == "static" and len(llm.step_trace) > 1:
        before = set(llm.step_trace[-2].running)
        admitted = set(record.scheduled) - before
        assert not (admitted and before), "static batching admitted into a running batch"


def run(llm: LLM, prompts: list[list[int]], arrivals: list[int], params=GREEDY,
        check=check_invariants) -> dict[int, list[int]]:
    """Add prompt i at step arrivals[i]; step until everything finishes; ``check`` the invariants
    after each step; at the end, no block is leaked."""
    ids, outputs, step = {}, {}, 0
    while len(outputs) < len(prompts):
        for i, arrival in enumerate(arrivals):
            if arrival == step:
                ids[llm.add_request(prompts[i], params)[0]] = i
        for request in llm.step():
            outputs[ids[request.request_id]] = request.output_token_ids
        check(llm)
        step += 1
        assert step < 2000, "the engine stopped making progress"
    pool = llm.kv_cache_manager.block_pool
    assert pool.num_free_blocks == len(pool.blocks) and all(b.ref_cnt == 0 for b in pool.blocks)  # no leak
    return outputs


@functools.lru_cache(maxsize=None)
def reference(model, prompt: tuple[int, ...], max_tokens: int) -> tuple[int, ...]:
    return tuple(greedy_reference(model, list(prompt), max_tokens))


def workload(seed: int, num_prompts: int, shared_prefix: int) -> list[list[int]]:
    rng = random.Random(seed)
    system = [rng.randrange(2, 64) for _ in range(shared_prefix)]
    return [system + [rng.randrange(2, 64) for _ in range(rng.randint(1, 30))] for _ in range(num_prompts)]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 10_000),
    block_size=st.sampled_from([1, 2, 4, 8, 16]),
    max_num_batched_tokens=st.integers(4, 64),
    max_num_seqs=st.integers(1, 6),
    long_prefill=st.sampled_from([0, 3, 8]),
    spare_blocks=st.integers(0, 40),
    prefix_caching=st.booleans(),
    preemption_mode=st.sampled_from(["recompute", "swap"]),
    policy=st.sampled_from(["continuous", "continuous", "static"]),
    shared_prefix=st.sampled_from([0, 5, 17]),
    num_prompts=st.integers(1, 6),
)
def test_greedy_outputs_match_the_plain_model_under_any_schedule(
    tiny_model, seed, block_size, max_num_batched_tokens, max_num_seqs, long_prefill, spare_blocks,
    prefix_caching, preemption_mode, policy, shared_prefix, num_prompts,
):
    max_model_len = 64
    prompts = workload(seed, num_prompts, shared_prefix)
    arrivals = sorted(random.Random(seed).randint(0, 12) for _ in prompts)
    llm = LLM(tiny_model, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
              max_model_len=max_model_len, block_size=block_size,
              num_gpu_blocks=-(-max_model_len // block_size) + spare_blocks,  # small pools force preemption
              enable_prefix_caching=prefix_caching, long_prefill_token_threshold=long_prefill,
              preemption_mode=preemption_mode, scheduling_policy=policy, dtype=torch.float64)
    outputs = run(llm, prompts, arrivals)
    for i, prompt in enumerate(prompts):
        assert tuple(outputs[i]) == reference(tiny_model, tuple(prompt), GREEDY.max_tokens), f"prompt {i}"


def test_preemption_really_happens_and_changes_nothing(tiny_model):
    rng = random.Random(7)
    prompts = [[rng.randrange(2, 64) for _ in range(20)] for _ in range(6)]  # 6 x 30 tokens > 18 blocks of 4
    for mode in ("recompute", "swap"):
        llm = LLM(tiny_model, max_num_seqs=6, max_num_batched_tokens=64, max_model_len=64, block_size=4,
                  num_gpu_blocks=18, preemption_mode=mode, enable_prefix_caching=False, dtype=torch.float64)
        outputs = run(llm, prompts, [0] * len(prompts))
        assert llm.scheduler.total_preemptions > 0
        preempted_step = next(r for r in llm.step_trace if r.preempted)
        assert preempted_step.waiting[0] == preempted_step.preempted[-1]  # back at the front of the queue
        assert all(tuple(outputs[i]) == reference(tiny_model, tuple(p), 10) for i, p in enumerate(prompts))
