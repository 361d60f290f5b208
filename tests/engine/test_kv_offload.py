"""The KV offload tier: evicted prefix-cache blocks are kept in a CPU pool and reloaded on a hit."""

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from course_lib.engine.block_hash import hash_block_tokens, hash_request_blocks
from course_lib.engine.block_pool import BlockPool
from course_lib.engine.kv_cache_manager import KVCacheManager
from course_lib.engine.kv_offload import KVOffloadPool, OffloadedBlock
from course_lib.engine.llm import LLM
from course_lib.engine.request import Request
from course_lib.engine.sampling_params import SamplingParams
from tests.engine.test_engine_equivalence import GREEDY, check_invariants, reference, run

ONE = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
SIX = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
rng = random.Random(17)
LONG = [rng.randrange(2, 64) for _ in range(100)]  # 6 full blocks of 16 and a partial one
OTHERS = [[rng.randrange(2, 64) for _ in range(60)] for _ in range(3)]  # enough to evict LONG from 10 blocks


def engine(model, **kwargs) -> LLM:
    settings = {"max_model_len": 128, "num_gpu_blocks": 10, "dtype": torch.float64} | kwargs
    return LLM(model, **settings)


def check_pools(llm: LLM) -> None:
    """After every step: the GPU pool's invariants, and the CPU pool's accounting."""
    check_invariants(llm)
    offload = llm.kv_cache_manager.offload
    if offload is None:
        return
    held = list(offload.cached.values()) + list(offload.pinned.values())
    assert not offload.pinned  # pins last one step only
    assert len(held) == len(set(held)) and not set(held) & set(offload.free_ids)
    assert len(held) + offload.num_free_blocks == offload.num_blocks


def returning_prompt(llm: LLM):
    """Serve LONG, then prompts that evict it from the GPU prefix cache, then LONG again."""
    first = llm.generate([LONG], SIX)[0]
    llm.generate(OTHERS, ONE)
    return first, llm.generate([LONG], SIX)[0]


def test_an_evicted_prefix_is_reloaded_instead_of_recomputed(tiny_model):
    off = engine(tiny_model)
    _, again_off = returning_prompt(off)
    assert again_off.num_cached_tokens == 0  # evicted: recomputed from scratch
    on = engine(tiny_model, kv_offload_blocks=32)
    first, again = returning_prompt(on)
    stats = on.kv_cache_manager.prefix_cache_stats
    assert again.num_cached_tokens == 96 and stats.cpu_hit_tokens == 96  # every full block but the last token's
    assert stats.hit_tokens == stats.gpu_hit_tokens + stats.cpu_hit_tokens
    assert on.step_trace[-6].num_tokens == len(LONG) - 96  # the returning prompt computes only its tail
    assert off.step_trace[-6].num_tokens == len(LONG)  # (its prefill step, then 5 decode steps)
    assert sum(r.kv_reload_blocks for r in on.step_trace) == 6
    assert again.outputs[0].token_ids == again_off.outputs[0].token_ids == first.outputs[0].token_ids
    assert tuple(again.outputs[0].token_ids) == reference(tiny_model, tuple(LONG), 6)
    gpu_hits = stats.gpu_hit_tokens
    assert on.generate([LONG], ONE)[0].num_cached_tokens == 96  # reloaded blocks are cached on the GPU again
    assert (stats.gpu_hit_tokens, stats.cpu_hit_tokens) == (gpu_hits + 96, 96)


@pytest.mark.parametrize("offload_blocks", [1, 3, 64])
def test_greedy_outputs_equal_the_plain_model_under_prefix_reuse(tiny_model, offload_blocks):
    rng = random.Random(offload_blocks)
    systems = [[rng.randrange(2, 64) for _ in range(n)] for n in (37, 21, 50)]
    prompts = [rng.choice(systems) + [rng.randrange(2, 64) for _ in range(rng.randint(1, 12))] for _ in range(14)]
    arrivals = sorted(rng.randint(0, 40) for _ in prompts)
    outputs = {}
    for kv_offload_blocks in (None, offload_blocks):
        llm = LLM(tiny_model, max_num_seqs=3, max_num_batched_tokens=32, max_model_len=80, block_size=4,
                  num_gpu_blocks=30, kv_offload_blocks=kv_offload_blocks, dtype=torch.float64)
        outputs[kv_offload_blocks] = run(llm, prompts, arrivals, check=check_pools)  # run checks no GPU leak
    assert outputs[None] == outputs[offload_blocks]
    for i, prompt in enumerate(prompts):
        assert tuple(outputs[offload_blocks][i]) == reference(tiny_model, tuple(prompt), GREEDY.max_tokens)
    stats = llm.kv_cache_manager.prefix_cache_stats
    assert stats.cpu_hit_tokens > 0 and llm.kv_cache_manager.offload.num_offloaded_blocks > 0


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), block_size=st.sampled_from([2, 4, 8]), offload_blocks=st.integers(1, 40),
       spare_blocks=st.integers(0, 12), budget=st.integers(8, 64),
       preemption_mode=st.sampled_from(["recompute", "swap"]))
def test_greedy_outputs_match_the_plain_model_with_offload_under_any_schedule(
        tiny_model, seed, block_size, offload_blocks, spare_blocks, budget, preemption_mode):
    rng = random.Random(seed)
    systems = [[rng.randrange(2, 64) for _ in range(rng.randint(5, 40))] for _ in range(3)]
    prompts = [rng.choice(systems) + [rng.randrange(2, 64) for _ in range(rng.randint(1, 10))] for _ in range(8)]
    arrivals = sorted(rng.randint(0, 30) for _ in prompts)
    llm = LLM(tiny_model, max_num_seqs=4, max_num_batched_tokens=budget, max_model_len=64, block_size=block_size,
              num_gpu_blocks=64 // block_size + spare_blocks, kv_offload_blocks=offload_blocks,
              preemption_mode=preemption_mode, dtype=torch.float64)
    outputs = run(llm, prompts, arrivals, check=check_pools)
    for i, prompt in enumerate(prompts):
        assert tuple(outputs[i]) == reference(tiny_model, tuple(prompt), GREEDY.max_tokens), f"prompt {i}"


def test_offload_and_swap_preemption_work_together(tiny_model):
    rng = random.Random(5)
    system = [rng.randrange(2, 64) for _ in range(24)]
    prompts = [system + [rng.randrange(2, 64) for _ in range(8)] for _ in range(6)]
    prompts += [[rng.randrange(2, 64) for _ in range(30)] for _ in range(4)] + prompts[:2]
    llm = LLM(tiny_model, max_num_seqs=6, max_num_batched_tokens=64, max_model_len=64, block_size=4,
              num_gpu_blocks=24, preemption_mode="swap", kv_offload_blocks=16, dtype=torch.float64)
    outputs = run(llm, prompts, [0] * 6 + [8] * 4 + [30] * 2, check=check_pools)
    assert llm.scheduler.total_preemptions > 0 and llm.kv_cache_manager.offload.num_reloaded_blocks > 0
    assert len(llm.scheduler.free_cpu_blocks) == len(llm.runner.cpu_caches[0][0])  # swap space all returned
    assert all(tuple(outputs[i]) == reference(tiny_model, tuple(p), 10) for i, p in enumerate(prompts))


def test_a_different_cache_salt_never_hits_the_offload_tier(tiny_model):
    llm = engine(tiny_model, kv_offload_blocks=32)
    llm.generate([LONG], ONE, cache_salt="tenant-a")
    llm.generate(OTHERS, ONE)
    assert len(llm.kv_cache_manager.offload.cached) >= 6  # tenant a's prefix now lives on the CPU only
    assert llm.generate([LONG], ONE, cache_salt="tenant-b")[0].num_cached_tokens == 0
    assert llm.generate([LONG], ONE)[0].num_cached_tokens == 0  # no salt is a tenant of its own
    assert llm.kv_cache_manager.prefix_cache_stats.cpu_hit_tokens == 0
    llm.generate(OTHERS, ONE)
    assert llm.generate([LONG], ONE, cache_salt="tenant-a")[0].num_cached_tokens == 96
    assert llm.kv_cache_manager.prefix_cache_stats.cpu_hit_tokens > 0


def cached_then_evicted(manager: KVCacheManager, prompt: list[int], request_id: str) -> Request:
    """Compute ``prompt``'s blocks (bookkeeping only), free them, and evict them to the CPU tier."""
    request = Request(request_id, prompt, ONE, None, 0.0, manager.block_size, 256)
    manager.allocate_slots(request, request.num_tokens)
    request.num_computed_tokens = request.num_tokens  # the forward pass wrote them
    manager.free(request)
    filler = Request(request_id + "-filler", [1] * 4 * len(manager.block_pool.blocks), ONE, None, 0.0,
                     manager.block_size, 256)
    manager.allocate_slots(filler, manager.block_size * len(manager.block_pool.blocks))
    filler.num_computed_tokens = filler.num_tokens
    manager.free(filler)
    manager.take_transfers()
    return request


def test_a_refused_allocation_leaves_no_half_done_reload():
    manager = KVCacheManager(4, 4, num_offload_blocks=8)
    prompt = list(range(2, 15))  # 3 full blocks and one token
    cached_then_evicted(manager, prompt, "a")
    again = Request("b", prompt, ONE, None, 0.0, 4, 256)
    hits, tokens = manager.get_computed_blocks(again)
    assert tokens == 12 and all(isinstance(hit, OffloadedBlock) for hit in hits)
    hog = Request("hog", [7] * 4, ONE, None, 0.0, 4, 256)
    manager.allocate_slots(hog, 4)  # 3 blocks free: the 3 reloads fit, the last token's block does not
    manager.take_transfers()
    cached = dict(manager.offload.cached)
    assert manager.allocate_slots(again, 1, hits) is None
    assert manager.block_pool.num_free_blocks == 3 and manager.take_transfers() == ([], [])
    assert manager.offload.cached == cached and not manager.offload.pinned
    assert manager.block_ids("b") == []
    manager.free(hog)
    assert manager.allocate_slots(again, 1, hits) is not None
    offloads, reloads = manager.take_transfers()
    assert len(reloads) == 3 and sorted(gpu for _, gpu in reloads) == sorted(manager.block_ids("b")[:3])
    assert all(manager.block_pool.get_cached_block(h).block_id == gpu
               for h, (_, gpu) in zip(again.block_hashes, reloads))


def test_a_block_being_reloaded_is_never_overwritten_in_the_same_step():
    manager = KVCacheManager(4, 4, num_offload_blocks=2)  # a CPU pool the reloads fill entirely
    prompt = list(range(2, 11))  # 2 full blocks and one token
    first = cached_then_evicted(manager, prompt, "a")  # the GPU now caches the filler's 4 blocks
    again = Request("b", prompt, ONE, None, 0.0, 4, 256)
    hits, _ = manager.get_computed_blocks(again)
    assert manager.allocate_slots(again, 1, hits) is not None  # its 3 pops evict 3 of the filler's blocks
    offloads, reloads = manager.take_transfers()
    assert len(reloads) == 2 and offloads == []  # no CPU block was free to take them
    assert set(manager.offload.cached) == set(first.block_hashes)  # a's blocks, kept
    assert manager.block_pool.num_free_blocks == 1


OPS = st.lists(st.tuples(st.sampled_from(["offload", "reload", "step"]), st.integers(0, 11)), max_size=120)


@settings(max_examples=100, deadline=None)
@given(OPS, st.integers(1, 6))
def test_offload_pool_accounting_and_lru_order_hold_under_any_sequence(ops, num_blocks):
    pool = KVOffloadPool(num_blocks)
    model: list = []  # hashes by recency, least recent first (pinned ones included)
    pinned_now: set = set()
    gpu = iter(range(10_000))
    for op, key in ops:
        block_hash = hash_block_tokens(None, [key])
        if op == "offload":
            evictable = [h for h in model if h not in pinned_now]
            stored = pool.offload(block_hash, next(gpu))
            if block_hash in model:
                assert not stored
                if block_hash not in pinned_now:
                    model.remove(block_hash)
                    model.append(block_hash)
            elif len(model) < num_blocks:
                assert stored
                model.append(block_hash)
            elif evictable:
                assert stored and pool.lookup(evictable[0]) is None  # the least recently used goes
                model.remove(evictable[0])
                model.append(block_hash)
            else:
                assert not stored  # every block is being read this step
            if stored:  # never over a block a reload reads this step (an offload *before* a reload is fine)
                assert pool.cached[block_hash] not in pool.pinned.values()
        elif op == "reload" and block_hash in model:
            pool.reload(pool.pin(block_hash), next(gpu))
            pinned_now.add(block_hash)
            model.remove(block_hash)
            model.append(block_hash)
        elif op == "step":
            offloads, reloads = pool.take_transfers()
            assert len({cpu for _, cpu in offloads}) == len(offloads)
            model = [h for h in model if h not in pinned_now] + [h for h in model if h in pinned_now]
            pinned_now.clear()  # the step's reloaded blocks rejoin as the most recently used
        held = {**pool.cached, **pool.pinned}
        assert set(held) == set(model) and set(pool.pinned) == pinned_now
        assert len(set(held.values())) == len(held) == num_blocks - pool.num_free_blocks
        assert [h for h in pool.cached] == [h for h in model if h not in pinned_now]  # LRU order


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["take", "free", "lookup"]), st.integers(0, 9)), max_size=80))
def test_an_evicted_cached_block_stays_findable_on_one_tier(ops):
    """A hash the GPU prefix cache forgets is found on the CPU tier, unless the CPU pool (LRU) forgot it."""
    offload = KVOffloadPool(3)
    pool = BlockPool(4, offload=offload)
    held, ever = [], set()
    for n, (op, pick) in enumerate(ops):
        if op == "take" and pool.num_free_blocks:
            block = pool.get_new_blocks(1)[0]
            key = hash_block_tokens(None, [pick])
            pool.cache_full_block(block, key)
            held.append(block)
            ever.add(key)
        elif op == "free" and held:
            pool.free_blocks([held.pop(pick % len(held))])
        elif op == "lookup":
            key = hash_block_tokens(None, [pick])
            assert (offload.lookup(key) is not None) == (key in offload.cached)
        offload.take_transfers()  # every op its own step: each store is a copy made
        gpu = set(pool.cached_block_hash_to_block)
        cpu = set(offload.cached) | set(offload.pinned)
        forgotten = ever - gpu - cpu
        assert len(forgotten) <= offload.num_dropped_blocks  # only the CPU pool's LRU forgets
        assert offload.num_offloaded_blocks == len(cpu) + offload.num_dropped_blocks
        assert pool.num_free_blocks + len(held) == len(pool.blocks)


def test_bad_offload_settings_get_clear_errors(tiny_model):
    with pytest.raises(ValueError, match="kv_offload_blocks must be 0 or more"):
        engine(tiny_model, kv_offload_blocks=-1)
    with pytest.raises(ValueError, match="needs enable_prefix_caching=True"):
        engine(tiny_model, kv_offload_blocks=4, enable_prefix_caching=False)
    assert engine(tiny_model, kv_offload_blocks=0).kv_cache_manager.offload is None


def test_tensor_parallel_ranks_offload_and_reload_their_own_shards(tiny_model):
    expected = engine(tiny_model, kv_offload_blocks=32)
    with engine(tiny_model, kv_offload_blocks=32, tensor_parallel_size=2) as llm:
        for a, b in zip(returning_prompt(expected), returning_prompt(llm)):
            assert a.outputs[0].token_ids == b.outputs[0].token_ids
            assert tuple(b.outputs[0].token_ids) == reference(tiny_model, tuple(LONG), 6)
        assert llm.kv_cache_manager.prefix_cache_stats.cpu_hit_tokens == 96
    assert hash_request_blocks(LONG, 16)[0] in expected.kv_cache_manager.offload.cached


def test_the_returning_prompt_benchmark_reports_each_tier():
    from course_lib.engine.offload_benchmark import MODES, returning_prompt_ttft

    lines = []
    result = returning_prompt_ttft(prompt_tokens=64, repeats=2, progress=lines.append)
    assert len(lines) == 2 and all(len(result.ttft_s[mode]) == 2 for mode in MODES)
    assert (result.gpu_hit_tokens, result.cpu_hit_tokens) == (
        {"gpu hit": 48, "cpu reload": 0, "recompute": 0}, {"gpu hit": 0, "cpu reload": 48, "recompute": 0})
    assert result.computed_tokens == {"gpu hit": 16, "cpu reload": 16, "recompute": 64}
    assert result.same_first_token and result.reload_speedup > 0 and "cpu reload" in result.table()


def test_an_fp8_kv_cache_offloads_and_reloads_its_bytes_unchanged():
    from course_lib.engine.offload_benchmark import corpus_prompts

    long, evicting = corpus_prompts(2, 63)
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    firsts = {}
    for offload in (None, 4):
        llm = LLM("tiny-llama", kv_cache_dtype="fp8", num_gpu_blocks=4, max_model_len=64, max_num_seqs=1,
                  kv_offload_blocks=offload)
        first = llm.generate([long], params)[0]
        stored = {block.block_hash: [c[:, block.block_id].clone() for c in llm.runner.kv_caches]
                  for block in llm.kv_cache_manager.block_pool.blocks if block.block_hash is not None}
        llm.generate([evicting], params)
        again = llm.generate([long], params)[0]
        if offload:  # every block the returning prompt reloaded holds, byte for byte, what it held before
            assert first.num_cached_tokens == 0
            reloaded = [b for b in llm.kv_cache_manager.block_pool.blocks if b.block_hash in stored]
            assert len(reloaded) == 3
            for block in reloaded:
                for cache, kept in zip(llm.runner.kv_caches, stored[block.block_hash]):
                    assert torch.equal(cache[:, block.block_id].view(torch.uint8), kept.view(torch.uint8))
        assert again.num_cached_tokens == (48 if offload else 0)
        if offload:  # the CPU tier holds the fp8 bytes themselves (the scales are per layer, not per block)
            assert llm.runner.offload_caches[0].dtype == llm.runner.kv_caches[0].dtype == torch.float8_e4m3fn
        firsts[offload] = again.outputs[0].token_ids
    assert firsts[None] == firsts[4]
