"""Prefix caching by chained block hashes, as vLLM V1 does it."""

import torch

from course_lib.engine.block_hash import hash_request_blocks
from course_lib.engine.kv_cache_manager import KVCacheManager
from course_lib.engine.llm import LLM
from course_lib.engine.request import Request
from course_lib.engine.sampling_params import SamplingParams

ONE = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
SYSTEM = list(range(2, 34))  # 32 tokens: two full blocks of 16


def engine(model, **kwargs) -> LLM:
    return LLM(model, max_model_len=128, num_gpu_blocks=64, dtype=torch.float64, **kwargs)


def test_a_shared_system_prompt_hits_only_whole_blocks(tiny_model):
    llm = engine(tiny_model)
    llm.generate([SYSTEM + [40, 41, 42]], ONE)
    second = llm.generate([SYSTEM + [50, 51]], ONE)[0]
    assert second.num_cached_tokens == 32
    unaligned = llm.generate([SYSTEM[:20] + [60]], ONE)[0]
    assert unaligned.num_cached_tokens == 16  # the partial second block is never cached


def test_changing_one_early_token_misses_every_later_block(tiny_model):
    llm = engine(tiny_model)
    llm.generate([SYSTEM + [40]], ONE)
    changed = list(SYSTEM)
    changed[3] = 63
    assert llm.generate([changed + [40]], ONE)[0].num_cached_tokens == 0
    hashes = hash_request_blocks(SYSTEM, 16)
    changed_hashes = hash_request_blocks(changed, 16)
    assert hashes[1] != changed_hashes[1]  # block 2's tokens are equal, its hash is not


def test_the_last_prompt_token_is_always_computed(tiny_model):
    llm = engine(tiny_model)
    llm.generate([SYSTEM], ONE)
    again = llm.generate([SYSTEM], ONE)[0]
    assert again.num_cached_tokens == 16  # 32-token prompt fully cached, but the last block is recomputed
    assert again.outputs[0].token_ids == llm.generate([SYSTEM], ONE)[0].outputs[0].token_ids


def test_cache_salts_isolate_tenants(tiny_model):
    llm = engine(tiny_model)
    llm.generate([SYSTEM + [40]], ONE, cache_salt="tenant-a")
    assert llm.generate([SYSTEM + [41]], ONE, cache_salt="tenant-b")[0].num_cached_tokens == 0
    assert llm.generate([SYSTEM + [41]], ONE)[0].num_cached_tokens == 0  # no salt is a tenant of its own
    assert llm.generate([SYSTEM + [42]], ONE, cache_salt="tenant-a")[0].num_cached_tokens == 32
    assert hash_request_blocks(SYSTEM, 16, "a")[1] != hash_request_blocks(SYSTEM, 16, "b")[1]


def test_hit_rate_metric_counts_tokens(tiny_model):
    llm = engine(tiny_model)
    llm.generate([SYSTEM + [40, 41]], ONE)  # 34 tokens queried, 0 hit
    llm.generate([SYSTEM + [50]], ONE)  # 33 queried, 32 hit
    stats = llm.kv_cache_manager.prefix_cache_stats
    assert (stats.queried_tokens, stats.hit_tokens) == (67, 32)
    assert abs(stats.hit_rate - 32 / 67) < 1e-12


def test_freed_blocks_stay_cached_until_reused(tiny_model):
    llm = LLM(tiny_model, max_model_len=48, num_gpu_blocks=3, dtype=torch.float64)
    llm.generate([SYSTEM + [40]], ONE)  # fills all 3 blocks, then frees them (hashes kept)
    assert llm.generate([SYSTEM + [41]], ONE)[0].num_cached_tokens == 32
    llm.generate([[5] * 40], ONE)  # needs all 3 blocks: evicts the cached prefix
    assert llm.generate([SYSTEM + [42]], ONE)[0].num_cached_tokens == 0


def test_without_prefix_caching_nothing_hits(tiny_model):
    llm = engine(tiny_model, enable_prefix_caching=False)
    llm.generate([SYSTEM + [40]], ONE)
    assert llm.generate([SYSTEM + [41]], ONE)[0].num_cached_tokens == 0


def test_parallel_samples_share_the_prompt_blocks(tiny_model):
    llm = engine(tiny_model)
    out = llm.generate([SYSTEM + [40]], SamplingParams(n=4, temperature=1.0, max_tokens=4, seed=3, ignore_eos=True))[0]
    assert len(out.outputs) == 4
    assert llm.kv_cache_manager.prefix_cache_stats.hit_tokens == 3 * 32  # siblings hit the first's blocks
    again = engine(tiny_model).generate([SYSTEM + [40]], SamplingParams(n=4, temperature=1.0, max_tokens=4,
                                                                        seed=3, ignore_eos=True))[0]
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in out.outputs]  # seeded: reproducible


def manager_request(request_id: str, prompt: list[int], block_size: int = 4) -> Request:
    return Request(request_id, prompt, ONE, None, 0.0, block_size, 256)


def computed(manager: KVCacheManager, request: Request) -> Request:
    """Look ``request`` up and allocate its prompt (bookkeeping only, as the scheduler would)."""
    hits, hit_tokens = manager.get_computed_blocks(request)
    manager.allocate_slots(request, request.num_tokens - hit_tokens, hits)
    request.num_computed_tokens = request.num_tokens
    return request


def test_two_requests_that_compute_one_block_both_keep_it_cached():
    for offload in (0, 8):
        manager = KVCacheManager(8, 4, num_offload_blocks=offload)
        prompt = list(range(2, 10))  # two full blocks: a hit never covers the last one, so both compute it
        a, b = computed(manager, manager_request("a", prompt)), computed(manager, manager_request("b", prompt))
        second = a.block_hashes[1]
        copies = manager.block_pool.cached_block_hash_to_block[second]
        assert sorted(copies) == [manager.block_ids("a")[1], manager.block_ids("b")[1]]
        manager.free(a)
        manager.free(b)
        filler = computed(manager, manager_request("filler", list(range(40, 64))))  # 6 blocks: evicts a's copy only
        assert manager.block_pool.get_cached_block(second).block_id == 2  # b's copy, still findable
        assert manager.take_transfers()[0] == []  # b's copy is still on the GPU: nothing offloaded
        manager.free(filler)
        returning = computed(manager, manager_request("c", prompt + [10]))
        assert manager.block_ids("c")[:2] == [0, 2]  # a's first block and b's copy of the second
        assert returning.num_computed_tokens == 9 and manager.prefix_cache_stats.gpu_hit_tokens == 4 + 8


def test_the_last_gpu_copy_of_a_hash_is_offloaded_when_evicted():
    manager = KVCacheManager(4, 4, num_offload_blocks=8)
    prompt = list(range(2, 10))
    a, b = computed(manager, manager_request("a", prompt)), computed(manager, manager_request("b", prompt))
    second = a.block_hashes[1]
    manager.free(a)
    manager.free(b)
    filler = computed(manager, manager_request("filler", list(range(40, 48))))  # 2 blocks: a's copy and block 3
    assert manager.offload.lookup(second) is None
    manager.free(filler)
    computed(manager, manager_request("filler 2", list(range(50, 66))))  # all 4 blocks: b's copy goes too
    assert manager.offload.lookup(second) is not None
    assert len([gpu for gpu, _ in manager.take_transfers()[0] if gpu == 2]) == 1


def test_n_siblings_of_a_block_aligned_prompt_each_cache_its_last_block(tiny_model):
    llm = engine(tiny_model)
    llm.generate([SYSTEM], SamplingParams(n=2, temperature=0, max_tokens=1, ignore_eos=True))
    last = hash_request_blocks(SYSTEM, 16)[1]
    assert len(llm.kv_cache_manager.block_pool.cached_block_hash_to_block[last]) == 2


def test_a_finished_requests_partial_block_is_reused_first():
    manager = KVCacheManager(8, 4)
    done = computed(manager, manager_request("a", list(range(2, 8))))  # one full block and a partial one
    full, partial = manager.block_ids("a")
    manager.free(done)
    assert [b.block_id for b in manager.block_pool.free_block_queue] == [partial, *range(2, 8), full]
    computed(manager, manager_request("b", [50, 51]))
    assert manager.block_ids("b") == [partial]  # reused at once; the cached full block stays at the tail
