"""nccl-tests' bus-bandwidth factors and the algbw/busbw arithmetic."""

import pytest

from course_lib.perf.bus_bandwidth import COLLECTIVES, algorithm_bandwidth, bus_bandwidth, bus_factor


@pytest.mark.parametrize("num_ranks, all_reduce, split", [(2, 1.0, 0.5), (4, 1.5, 0.75), (8, 1.75, 0.875),
                                                          (16, 1.875, 0.9375)])
def test_factors_for_several_rank_counts(num_ranks, all_reduce, split):
    assert bus_factor("all_reduce", num_ranks) == pytest.approx(all_reduce)
    for collective in ("all_gather", "reduce_scatter", "all_to_all"):
        assert bus_factor(collective, num_ranks) == pytest.approx(split)
    assert bus_factor("broadcast", num_ranks) == bus_factor("reduce", num_ranks) == 1.0


def test_one_rank_moves_nothing_over_a_link_except_for_the_rooted_collectives():
    assert [bus_factor(c, 1) for c in COLLECTIVES] == [0.0, 0.0, 0.0, 0.0, 1.0, 1.0]


def test_the_docstring_example_a_1gb_all_reduce_on_8_gpus():
    algbw = algorithm_bandwidth(1e9, 0.01)
    assert algbw == pytest.approx(100e9)
    assert bus_bandwidth("all_reduce", algbw, 8) == pytest.approx(175e9)


def test_errors_name_what_to_change():
    with pytest.raises(ValueError, match="all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, reduce"):
        bus_factor("allreduce", 4)
    with pytest.raises(ValueError, match="at least 1"):
        bus_factor("all_reduce", 0)
    with pytest.raises(ValueError, match="positive"):
        algorithm_bandwidth(1024, 0.0)
