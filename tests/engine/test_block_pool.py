"""The block pool: LRU free queue (cached blocks to the tail, others to the head), reference counts,
lazy eviction, and several blocks under one hash (as current vLLM V1)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.engine.block_hash import hash_block_tokens
from course_lib.engine.block_pool import BlockPool


def ids(blocks):
    return [b.block_id for b in blocks]


def cached(pool, count, first_token=0):
    """``count`` new blocks, each cached under its own hash."""
    blocks = pool.get_new_blocks(count)
    for n, block in enumerate(blocks):
        pool.cache_full_block(block, hash_block_tokens(None, [first_token + n]))
    return blocks


def test_freed_cached_blocks_join_the_tail_in_the_order_given():
    pool = BlockPool(6)
    first = cached(pool, 3)
    assert ids(first) == [0, 1, 2] and ids(pool.free_block_queue) == [3, 4, 5]
    pool.free_blocks(list(reversed(first)))  # a request frees tail-first
    assert ids(pool.free_block_queue) == [3, 4, 5, 2, 1, 0]  # its last block is evicted first


def test_freed_blocks_without_a_hash_join_the_head_and_are_reused_first():
    pool = BlockPool(8)
    old = cached(pool, 2, first_token=100)  # a finished request's cached prefix
    pool.free_blocks(list(reversed(old)))
    full, partial = cached(pool, 2), pool.get_new_blocks(1)  # two full blocks and a partial one
    assert ids(pool.free_block_queue) == [5, 6, 7, 1, 0]
    pool.free_blocks(list(reversed(full + partial)))  # tail-first: the partial block, then the full ones
    # the partial block (no hash) goes to the head; the cached blocks to the tail, last block first
    assert ids(pool.free_block_queue) == [4, 5, 6, 7, 1, 0, 3, 2]
    reused = pool.get_new_blocks(4)
    assert ids(reused) == [4, 5, 6, 7]  # the old prefix is still cached: nothing evicted it
    assert pool.get_cached_block(hash_block_tokens(None, [100])) is old[0]


def test_with_caching_off_freed_blocks_are_reused_last_in_first_out():
    pool = BlockPool(5, enable_caching=False)
    blocks = pool.get_new_blocks(3)
    pool.free_blocks(list(reversed(blocks)))
    assert ids(pool.free_block_queue) == [2, 1, 0, 3, 4]


def test_every_copy_of_a_hash_stays_findable_until_the_last_is_evicted():
    pool = BlockPool(4)
    key = hash_block_tokens(None, [7, 7])
    a, b = pool.get_new_blocks(2)  # two requests computed the same block independently
    pool.cache_full_block(a, key)
    pool.cache_full_block(b, key)
    assert pool.get_cached_block(key) is a and set(pool.cached_block_hash_to_block[key]) == {0, 1}
    pool.free_blocks([a])
    pool.free_blocks([b])
    assert ids(pool.get_new_blocks(3)) == [2, 3, 0]  # reusing a evicts that copy only
    assert pool.get_cached_block(key) is b and b.block_hash == key and a.block_hash is None
    pool.get_new_blocks(1)
    assert pool.get_cached_block(key) is None and key not in pool.cached_block_hash_to_block


def test_reset_prefix_cache_is_refused_while_blocks_are_held():
    pool = BlockPool(3)
    held = cached(pool, 2)
    assert not pool.reset_prefix_cache() and pool.get_cached_block(held[0].block_hash) is held[0]
    pool.free_blocks(held)
    assert pool.reset_prefix_cache()
    assert not pool.cached_block_hash_to_block and all(b.block_hash is None for b in pool.blocks)


def test_a_freed_block_keeps_its_hash_until_it_is_reused():
    pool = BlockPool(2)
    block = pool.get_new_blocks(1)[0]
    key = hash_block_tokens(None, [1, 2, 3])
    pool.cache_full_block(block, key)
    pool.free_blocks([block])
    assert pool.get_cached_block(key) is block  # still findable while free
    pool.touch([block])  # a hit takes it back out of the free queue
    assert block.ref_cnt == 1 and pool.num_free_blocks == 1
    pool.free_blocks([block])
    pool.get_new_blocks(2)  # reuse evicts it
    assert pool.get_cached_block(key) is None and block.block_hash is None


def test_double_free_and_over_allocation_are_refused():
    pool = BlockPool(1)
    block = pool.get_new_blocks(1)[0]
    pool.free_blocks([block])
    with pytest.raises(RuntimeError, match="freed more often"):
        pool.free_blocks([block])
    with pytest.raises(ValueError, match="num_blocks must be positive"):
        BlockPool(0)
    with pytest.raises(ValueError, match="check first"):
        BlockPool(1).get_new_blocks(2)


@settings(max_examples=120, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["take", "take same", "take partial", "touch", "free", "reset"]),
                          st.integers(0, 7)), max_size=80))
def test_reference_counts_free_queue_and_cache_always_agree(ops):
    pool = BlockPool(8)
    held: list = []  # one entry per reference we hold
    for n, (op, pick) in enumerate(ops):
        if op.startswith("take") and pool.num_free_blocks:
            block = pool.get_new_blocks(1)[0]
            if op != "take partial":  # "take same" reuses a hash, as two requests computing one block do
                pool.cache_full_block(block, hash_block_tokens(None, [pick % 2 if op == "take same" else n + 2]))
            held.append(block)
        elif op == "touch" and held:
            block = held[pick % len(held)]
            pool.touch([block])
            held.append(block)
        elif op == "free" and held:
            pool.free_blocks([held.pop(pick % len(held))])
        elif op == "reset":
            assert pool.reset_prefix_cache() == (not held)
        queue = list(pool.free_block_queue)
        free = ids(queue)
        assert len(free) == len(set(free)) == pool.num_free_blocks
        hashed = [b.block_hash is not None for b in queue]
        assert hashed == sorted(hashed)  # blocks without a hash all come before the cached ones
        for block in pool.blocks:
            assert block.ref_cnt == sum(h is block for h in held)
            assert (block.block_id in free) == (block.ref_cnt == 0)
            if block.block_hash is not None:  # every cached copy is findable under its hash
                assert pool.cached_block_hash_to_block[block.block_hash][block.block_id] is block
        for key, copies in pool.cached_block_hash_to_block.items():
            assert copies and all(b.block_hash == key for b in copies.values())


def test_a_pool_makes_a_block_only_when_it_first_hands_it_out():
    pool = BlockPool(30_000)  # a simulated H100's KV cache
    assert pool.free_block_queue.created == [] and pool.num_free_blocks == 30_000 and pool.usage() == 0
    assert ids(pool.get_new_blocks(3)) == [0, 1, 2] and len(pool.free_block_queue.created) == 3
    assert pool.num_free_blocks == 29_997 and pool.usage() == pytest.approx(3 / 30_000)
    assert ids(pool.blocks) == list(range(30_000))  # asking for every block makes the rest


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["take", "take partial", "hit", "free", "reset", "look"]),
                          st.integers(0, 11)), max_size=60))
def test_blocks_made_on_first_use_leave_the_queue_as_an_up_front_list_would(ops):
    """Reference: vLLM's free queue as a plain list of every block id, made up front."""
    pool = BlockPool(10)
    queue = list(range(10))
    hash_of: dict[int, object] = {}  # block id -> the hash it holds
    held: list = []  # one entry per reference we hold
    taken = set()  # ids ever handed out
    looked = False  # iterating the queue makes every block
    for n, (op, pick) in enumerate(ops):
        if op.startswith("take") and queue:
            count = min(pick % 3 + 1, len(queue))
            expected, queue = queue[:count], queue[count:]
            blocks = pool.get_new_blocks(count)
            assert ids(blocks) == expected
            for block in blocks:  # reuse evicts the old hash
                hash_of.pop(block.block_id, None)
                if op == "take":
                    hash_of[block.block_id] = hash_block_tokens(None, [n, block.block_id])
                    pool.cache_full_block(block, hash_of[block.block_id])
            held += blocks
            taken.update(expected)
        elif op == "hit" and hash_of:
            block_id = sorted(hash_of)[pick % len(hash_of)]
            block = pool.get_cached_block(hash_of[block_id])
            assert block.block_id == block_id
            pool.touch([block])
            if block_id in queue:
                queue.remove(block_id)
            held.append(block)
        elif op == "free" and held:
            freed = [held.pop(pick % len(held)) for _ in range(min(pick % 3 + 1, len(held)))]
            pool.free_blocks(freed)
            released = [b.block_id for i, b in enumerate(freed) if b not in held and b not in freed[i + 1:]]
            queue = [i for i in released if i not in hash_of] + queue + [i for i in released if i in hash_of]
        elif op == "reset":
            assert pool.reset_prefix_cache() == (not held)
            if not held:
                hash_of.clear()
        elif op == "look":
            assert ids(pool.free_block_queue) == queue
            looked = True
        assert pool.num_free_blocks == len(queue)
        assert len(pool.free_block_queue.created) == (10 if looked else len(taken))
        assert {b.block_id: b.block_hash for b in pool.free_block_queue.created if b.block_hash} == hash_of
    assert ids(pool.free_block_queue) == queue and ids(pool.blocks) == list(range(10))
