import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.paging.allocator import PoolExhausted
from course_lib.paging.paged import PagedAllocator
from course_lib.paging.report import measure
from course_lib.paging.reserve_for_max import Region, ReserveForMaxAllocator
from course_lib.paging.simulate import simulate
from course_lib.paging.trace import sample_chat_trace


def test_reserve_for_max_accounting_on_a_hand_checked_trace():
    pool = ReserveForMaxAllocator(capacity_tokens=100, max_model_len=40)
    pool.admit("a", 10, max_tokens=20)  # reserves 30 slots at 0
    pool.admit("b", 5)  # no cap: reserves max_model_len = 40 at 30
    pool.admit("c", 10, max_tokens=10)  # reserves 20 at 70
    for _ in range(3):
        pool.append_token("b")
    report = measure(pool, {"a": 15, "b": 12, "c": 20})
    assert report.tokens_stored == 28
    assert report.slots_held == 90
    assert report.over_reservation == (15 - 10) + (12 - 8) + (20 - 10)
    assert report.internal_fragmentation == (30 - 15) + (40 - 12)
    assert report.external_fragmentation == 0  # one free run: [90, 100)
    assert report.waste_fraction == pytest.approx(62 / 90)

    pool.free("a")
    assert pool.regions() == [Region(0, 30, None), Region(30, 40, "b"), Region(70, 20, "c"), Region(90, 10, None)]
    assert pool.free_slots == 40
    assert pool.stranded_slots() == 10  # free slots outside the largest run
    assert not pool.can_admit(5, max_tokens=30)  # 40 slots free, but no run of 35
    with pytest.raises(PoolExhausted):
        pool.admit("d", 5, max_tokens=30)
    pool.admit("d", 5, max_tokens=25)  # first fit: the 30-slot hole at 0
    assert pool.regions()[0] == Region(0, 30, "d")


def test_paged_accounting_on_a_hand_checked_trace():
    pool = PagedAllocator(num_blocks=8, block_size=4, max_model_len=16)
    pool.admit("a", 5)
    assert pool.block_tables["a"] == [0, 1]
    for _ in range(4):
        pool.append_token("a")  # 9 tokens: a third block on the 9th
    assert pool.block_tables["a"] == [0, 1, 2]
    pool.admit("b", 4)
    report = measure(pool, {"a": 10, "b": 6})
    assert (report.tokens_stored, report.slots_held) == (13, 16)
    assert report.over_reservation == 1  # a: slot 10 of its third block will be used
    assert report.internal_fragmentation == 2  # a: slots 11-12 never will
    assert report.external_fragmentation == 0
    pool.free("a")
    assert pool.free_slots == 28
    pool.admit("c", 12)  # free blocks are reused oldest-freed last: 4, 5, 6 first
    assert pool.block_tables["c"] == [4, 5, 6]
    pool.admit("d", 16)  # any free blocks serve, scattered or not
    assert pool.block_tables["d"] == [7, 0, 1, 2]
    assert pool.owners() == ["d", "d", "d", "b", "c", "c", "c", "d"]


@pytest.mark.parametrize("make", [lambda: ReserveForMaxAllocator(64, 32), lambda: PagedAllocator(4, 16, 32)])
def test_bad_requests_get_clear_errors(make):
    pool = make()
    with pytest.raises(ValueError, match="longer than max_model_len"):
        pool.admit("long", 33)
    with pytest.raises(ValueError, match="positive"):
        pool.admit("empty", 0)
    pool.admit("a", 32)
    with pytest.raises(ValueError, match="already admitted"):
        pool.admit("a", 1)
    with pytest.raises(ValueError, match="max_model_len"):
        pool.append_token("a")
    with pytest.raises(KeyError, match="not live"):
        pool.free("ghost")


def test_a_pool_too_small_for_one_request_is_rejected():
    with pytest.raises(ValueError, match="cannot hold one request"):
        ReserveForMaxAllocator(capacity_tokens=1000, max_model_len=2048)
    with pytest.raises(ValueError, match="cannot hold one request"):
        PagedAllocator(num_blocks=4, block_size=16, max_model_len=128)
    with pytest.raises(ValueError, match="positive"):
        PagedAllocator(num_blocks=0, block_size=16, max_model_len=128)


def test_same_trace_reserve_for_max_wastes_60_to_80_percent_and_paging_under_4():
    trace = sample_chat_trace(1500, max_model_len=2048, seed=0)
    reserve = simulate(ReserveForMaxAllocator(32768, 2048), trace, num_steps=400)
    paged = simulate(PagedAllocator(2048, 16, 2048), trace, num_steps=400)
    assert 0.60 <= reserve.mean_waste_fraction <= 0.80
    assert paged.mean_waste_fraction < 0.04
    assert paged.mean_concurrency > 2 * reserve.mean_concurrency
    assert paged.finished > reserve.finished
    for result in (reserve, paged):
        assert all(s.slots_held + s.external_fragmentation <= s.capacity for s in result.snapshots)


def test_simulation_finishes_every_request_of_a_short_trace():
    trace = sample_chat_trace(30, max_model_len=512, seed=3)
    steps = sum(r.output_len for r in trace) + 1  # enough even one at a time
    for pool in (ReserveForMaxAllocator(2048, 512), PagedAllocator(64, 16, 512)):
        result = simulate(pool, trace, steps)
        assert result.finished == len(trace)
        assert pool.lengths == {} and pool.free_slots == pool.capacity_tokens


def test_trace_is_reproducible_and_within_limits():
    trace = sample_chat_trace(200, max_model_len=1024, seed=7)
    assert trace == sample_chat_trace(200, max_model_len=1024, seed=7)
    assert all(0 < r.prompt_len and r.final_len <= 1024 and r.output_len <= r.max_tokens for r in trace)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["admit", "grow", "free"]), st.integers(0, 5), st.integers(1, 40)),
                max_size=60))
def test_paged_allocator_never_shares_or_leaks_blocks(ops):
    pool = PagedAllocator(num_blocks=12, block_size=4, max_model_len=40)
    for op, who, size in ops:
        req = f"r{who}"
        try:
            if op == "admit" and req not in pool.lengths:
                pool.admit(req, size)
            elif op == "grow" and req in pool.lengths and pool.lengths[req] < 40:
                pool.append_token(req)
            elif op == "free" and req in pool.lengths:
                pool.free(req)
        except PoolExhausted:
            pass
        owned = [b for table in pool.block_tables.values() for b in table]
        assert len(owned) == len(set(owned))  # no block in two tables
        assert len(owned) + pool.free_slots // 4 == 12  # every block is owned or free
        for r, length in pool.lengths.items():
            assert 0 <= pool.slots_held(r) - length < 4  # only the last block is partial


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["admit", "grow", "free"]), st.integers(0, 5), st.integers(1, 30),
                          st.integers(1, 30)), max_size=60))
def test_reserve_for_max_regions_tile_the_pool_without_overlap(ops):
    pool = ReserveForMaxAllocator(capacity_tokens=120, max_model_len=40)
    for op, who, prompt, max_tokens in ops:
        req = f"r{who}"
        try:
            if op == "admit" and req not in pool.lengths:
                pool.admit(req, prompt, max_tokens)
            elif op == "grow" and req in pool.lengths and pool.lengths[req] < pool.slots_held(req):
                pool.append_token(req)
            elif op == "free" and req in pool.lengths:
                pool.free(req)
        except PoolExhausted:
            pass
        regions = pool.regions()
        assert [r.start for r in regions] == [0] + [r.start + r.length for r in regions[:-1]]  # contiguous tiling
        assert sum(r.length for r in regions) == 120
        assert sum(r.length for r in regions if r.owner is None) == pool.free_slots
        for r in regions:
            if r.owner is not None:
                assert pool.lengths[r.owner] <= r.length <= 40
