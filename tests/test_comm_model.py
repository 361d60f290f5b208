"""The alpha-beta all-reduce model against hand-computed numbers."""

import pytest

from course_lib.perf.comm import (
    ALGORITHMS,
    BINARY_TREE,
    DOUBLE_BINARY_TREE,
    LINKS,
    RING,
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
