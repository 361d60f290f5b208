"""The alpha-beta all-reduce model against hand-computed numbers."""

import pytest

from course_lib.perf.comm import (
    ALGORITHMS,
    BINARY_TREE,
    DOUBLE_BINARY_TREE,
    LINKS,
    RING,
    TREE_CHUNK_BYTES,
    crossover_bytes,
)

ALPHA, BETA = 5e-6, 1 / 50e9  # an InfiniBand hop


def test_the_seeds_4_kib_on_512_gpus():
    # ring: 2 x 511 hops of 5 us, plus 2 x 511/512 x 4096 bytes at 50 GB/s
    assert RING.time(512, 4096, ALPHA, BETA) == pytest.approx(1022 * 5e-6 + 2 * 511 / 512 * 4096 / 50e9)
    # trees: 2 x log2(512) = 18 hops
    assert BINARY_TREE.time(512, 4096, ALPHA, BETA) == pytest.approx(18 * 5e-6 + 4 * 4096 / 50e9)
    assert DOUBLE_BINARY_TREE.time(512, 4096, ALPHA, BETA) == pytest.approx(18 * 5e-6 + 2 * 4096 / 50e9)
    assert RING.time(512, 4096, ALPHA, BETA) / DOUBLE_BINARY_TREE.time(512, 4096, ALPHA, BETA) > 50


def test_ring_bandwidth_term_is_nearly_independent_of_n():
    big = 1e9
    times = [RING.time(n, big, 0.0, BETA) for n in (2, 8, 64, 1024)]
    assert times[0] == pytest.approx(big * BETA)  # 2(N-1)/N = 1 at N = 2
    assert times[-1] == pytest.approx(2 * 1023 / 1024 * big * BETA) and max(times) < 2 * big * BETA


def test_crossover_where_both_cost_the_same():
    nvlink = LINKS["NVLink 4 (H100, within a node)"]
    assert nvlink.bandwidth == 450e9 and nvlink.alpha_s == 1e-6
    # 8 ranks: the ring has 14 - 6 = 8 more hops; the tree moves 4 - 1.75 = 2.25 K more
    size = crossover_bytes(BINARY_TREE, RING, 8, nvlink.alpha_s, nvlink.beta)
    assert size == pytest.approx(8 * 1e-6 * 450e9 / 2.25)
    assert RING.time(8, size, nvlink.alpha_s, nvlink.beta) == pytest.approx(
        BINARY_TREE.time(8, size, nvlink.alpha_s, nvlink.beta))
    assert crossover_bytes(DOUBLE_BINARY_TREE, RING, 2, ALPHA, BETA) is None  # same hops at N = 2


def test_one_rank_costs_nothing_and_bad_inputs_explain_themselves():
    assert all(cost.time(1, 1e6, ALPHA, BETA) == 0 for cost in ALGORITHMS.values())
    with pytest.raises(ValueError, match="num_bytes"):
        RING.time(4, -1, ALPHA, BETA)
    with pytest.raises(ValueError, match="num_ranks"):
        RING.time(0, 1, ALPHA, BETA)


IB = LINKS["InfiniBand NDR 400 Gb/s (across nodes)"]
NVLINK = LINKS["NVLink 4 (H100, within a node)"]


def _fastest(num_ranks, num_bytes, link, chunk_bytes=TREE_CHUNK_BYTES):
    times = {c.name: c.time(num_ranks, num_bytes, link.alpha_s, link.beta, chunk_bytes) for c in ALGORITHMS.values()}
    return min(times, key=times.get)


@pytest.mark.parametrize("num_ranks, num_bytes, link, winner", [
    (512, 4096, IB, "double binary tree"),  # latency-bound: 18 hops beat 1,022
    (512, 2**30, IB, "ring"),  # bandwidth-bound, even on 512 ranks, once the trees pay for their pipeline
    (8, 2**30, NVLINK, "ring"),
    (8, 4096, NVLINK, "double binary tree"),
])
def test_pipelined_trees_win_small_messages_and_lose_large_ones(num_ranks, num_bytes, link, winner):
    assert _fastest(num_ranks, num_bytes, link) == winner


def test_the_whiteboard_formulas_call_the_double_binary_tree_fastest_at_any_size_on_512_ranks():
    assert _fastest(512, 2**32, IB, chunk_bytes=None) == "double binary tree"


def test_pipelining_costs_one_alpha_per_chunk_after_the_first():
    chunk = TREE_CHUNK_BYTES
    # up to one chunk per tree: the whiteboard formula
    for cost in ALGORITHMS.values():
        size = max(cost.trees, 1) * chunk
        assert cost.time(512, size, ALPHA, BETA, chunk) == pytest.approx(cost.time(512, size, ALPHA, BETA))
    # 1 GiB in two trees of 128 KiB chunks: 4,096 chunks a tree, 18 levels to fill the pipeline
    assert DOUBLE_BINARY_TREE.time(512, 2**30, ALPHA, BETA, chunk) == pytest.approx(
        (18 + 4096 - 1) * ALPHA + 2 * 2**30 * BETA)
    assert BINARY_TREE.time(512, 2**30, ALPHA, BETA, chunk) == pytest.approx((18 + 8192 - 1) * ALPHA + 4 * 2**30 * BETA)
    assert RING.time(512, 2**30, ALPHA, BETA, chunk) == RING.time(512, 2**30, ALPHA, BETA)  # its pieces stream
    times = [DOUBLE_BINARY_TREE.time(64, size, ALPHA, BETA, chunk) for size in range(0, 8 * chunk, chunk // 4)]
    assert times == sorted(times)
    with pytest.raises(ValueError, match="chunk_bytes"):
        BINARY_TREE.time(4, 1e6, ALPHA, BETA, chunk_bytes=0)


@pytest.mark.parametrize("tree", [BINARY_TREE, DOUBLE_BINARY_TREE])
@pytest.mark.parametrize("num_ranks, link", [(8, NVLINK), (512, IB), (64, IB)])
def test_pipelined_crossover_is_where_both_cost_the_same(tree, num_ranks, link):
    size = crossover_bytes(tree, RING, num_ranks, link.alpha_s, link.beta, TREE_CHUNK_BYTES)
    assert tree.time(num_ranks, size, link.alpha_s, link.beta, TREE_CHUNK_BYTES) == pytest.approx(
        RING.time(num_ranks, size, link.alpha_s, link.beta))
    below, above = (tree.time(num_ranks, k, link.alpha_s, link.beta, TREE_CHUNK_BYTES) - RING.time(
        num_ranks, k, link.alpha_s, link.beta) for k in (size * 0.9, size * 1.1))
    assert below < 0 < above


def test_pipelined_crossover_of_the_double_binary_tree_by_hand():
    # past one chunk a tree: 1,022 - (18 - 1) = 1,005 more alphas for the ring; per byte the tree pays
    # alpha / 256 KiB for its chunks and (2 - 2 x 511/512) beta more bandwidth
    size = crossover_bytes(DOUBLE_BINARY_TREE, RING, 512, IB.alpha_s, IB.beta, TREE_CHUNK_BYTES)
    per_byte = IB.alpha_s / (2 * TREE_CHUNK_BYTES) + (2 - 2 * 511 / 512) * IB.beta
    assert size == pytest.approx(1005 * IB.alpha_s / per_byte)
    assert 200 * 2**20 < size < 300 * 2**20
    assert crossover_bytes(DOUBLE_BINARY_TREE, RING, 2, ALPHA, BETA, TREE_CHUNK_BYTES) is None  # never faster
    assert crossover_bytes(RING, DOUBLE_BINARY_TREE, 1, ALPHA, BETA) is None


@pytest.mark.parametrize("chunk", [0, -1])
def test_a_chunk_size_that_is_not_positive_is_refused_everywhere(chunk):
    with pytest.raises(ValueError, match="chunk_bytes"):
        crossover_bytes(DOUBLE_BINARY_TREE, RING, 8, 1e-6, 1e-9, chunk)
    with pytest.raises(ValueError, match="chunk_bytes"):
        DOUBLE_BINARY_TREE.time(8, 1e6, 1e-6, 1e-9, chunk)
