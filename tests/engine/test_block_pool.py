"""The block pool: LRU free queue, reference counts, lazy eviction."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.engine.block_hash import hash_block_tokens
from course_lib.engine.block_pool import BlockPool


def ids(blocks):
    return [b.block_id for b in blocks]


def test_freed_blocks_join_the_tail_in_the_order_given():
    pool = BlockPool(6)
    first = pool.get_new_blocks(3)
    assert ids(first) == [0, 1, 2] and ids(pool.free_block_queue) == [3, 4, 5]
    pool.free_blocks(list(reversed(first)))  # a request frees tail-first
    assert ids(pool.free_block_queue) == [3, 4, 5, 2, 1, 0]  # its last block is evicted first


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


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["take", "touch", "free"]), st.integers(0, 7)), max_size=80))
def test_reference_counts_and_the_free_queue_always_agree(ops):
    pool = BlockPool(8)
    held: list = []  # one entry per reference we hold
    for n, (op, pick) in enumerate(ops):
        if op == "take" and pool.num_free_blocks:
            block = pool.get_new_blocks(1)[0]
            pool.cache_full_block(block, hash_block_tokens(None, [n]))
            held.append(block)
        elif op == "touch" and held:
            block = held[pick % len(held)]
            pool.touch([block])
            held.append(block)
        elif op == "free" and held:
            pool.free_blocks([held.pop(pick % len(held))])
        free = ids(pool.free_block_queue)
        assert len(free) == len(set(free)) == pool.num_free_blocks
        for block in pool.blocks:
            assert block.ref_cnt == sum(h is block for h in held)
            assert (block.block_id in free) == (block.ref_cnt == 0)
