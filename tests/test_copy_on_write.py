import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.paging.allocator import PoolExhausted
from course_lib.paging.block_table import (
    CopyOnWriteBlockTables,
    parallel_sampling_report,
)


def test_fork_shares_blocks_and_a_divergent_write_copies_only_the_last_one():
    tables = CopyOnWriteBlockTables(num_blocks=10, block_size=4)
    tables.add_sequence("parent", [1, 2, 3, 4, 5, 6])  # blocks: [full, half]
    tables.fork("parent", "child")
    assert tables.block_tables["child"] == tables.block_tables["parent"]
    assert [tables.ref_counts[b] for b in tables.block_tables["parent"]] == [2, 2]
    assert tables.num_used_blocks == 2

    shared_last = tables.block_tables["child"][-1]
    copied = tables.append_token("child", 70)
    assert copied is not None and copied[0] == shared_last
    assert tables.block_tables["child"][0] == tables.block_tables["parent"][0]  # full block still shared
    assert tables.ref_counts[shared_last] == 1
    assert tables.append_token("parent", 80) is None  # parent is now the sole owner: writes in place
    assert tables.tokens("parent") == [1, 2, 3, 4, 5, 6, 80]
    assert tables.tokens("child") == [1, 2, 3, 4, 5, 6, 70]
    assert tables.num_used_blocks == 3


def test_all_blocks_return_after_every_sequence_finishes():
    tables = CopyOnWriteBlockTables(num_blocks=20, block_size=4)
    tables.add_sequence("s0", list(range(9)))
    for i in range(1, 4):
        tables.fork("s0", f"s{i}")
    for step in range(6):
        for i in range(4):
            tables.append_token(f"s{i}", 1000 * i + step)
    for i in range(4):
        tables.free(f"s{i}")
    assert tables.num_used_blocks == 0
    assert tables.ref_counts == [0] * 20


def test_errors_name_the_problem():
    tables = CopyOnWriteBlockTables(num_blocks=2, block_size=4)
    with pytest.raises(PoolExhausted):
        tables.add_sequence("big", list(range(9)))
    assert tables.num_used_blocks == 0  # nothing half-allocated
    tables.add_sequence("a", [1])
    with pytest.raises(ValueError, match="already exists"):
        tables.fork("a", "a")
    with pytest.raises(KeyError, match="does not exist"):
        tables.fork("ghost", "b")
    with pytest.raises(ValueError, match="positive"):
        CopyOnWriteBlockTables(num_blocks=0)


def test_parallel_sampling_saves_memory_by_sharing_the_prompt():
    report = parallel_sampling_report(prompt_len=512, num_samples=4, output_len=128, block_size=16)
    # Prompt 32 full blocks shared once; each sample owns 8 output blocks.
    assert report.shared_blocks == 32 + 4 * 8
    assert report.unshared_blocks == 4 * 40
    assert report.saved_fraction == pytest.approx(0.6)
    assert report.copy_on_writes == 0  # a block-aligned prompt never needs a copy
    odd = parallel_sampling_report(prompt_len=100, num_samples=4, output_len=20, block_size=16)
    assert odd.copy_on_writes == 3  # the shared partial block is copied by all but the last writer


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["fork", "write", "free"]), st.integers(0, 4), st.integers(0, 4)),
                max_size=80))
def test_every_sequence_reads_back_exactly_what_it_wrote(ops):
    tables = CopyOnWriteBlockTables(num_blocks=64, block_size=4)
    tables.add_sequence("s0", [7, 8, 9])
    expected = {"s0": [7, 8, 9]}
    for n, (op, a, b) in enumerate(ops):
        src, dst = f"s{a}", f"s{b}"
        if op == "fork" and src in expected and dst not in expected:
            tables.fork(src, dst)
            expected[dst] = list(expected[src])
        elif op == "write" and src in expected:
            tables.append_token(src, n)
            expected[src].append(n)
        elif op == "free" and src in expected and len(expected) > 1:
            tables.free(src)
            del expected[src]
        for seq, tokens in expected.items():
            assert tables.tokens(seq) == tokens
        listed = [blk for table in tables.block_tables.values() for blk in table]
        assert all(tables.ref_counts[blk] == listed.count(blk) for blk in set(listed))
        assert tables.num_used_blocks == len(set(listed))
