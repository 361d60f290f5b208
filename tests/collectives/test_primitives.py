"""The six primitives, the all-reduce identities and the parallelism map, on real gloo ranks."""

import pytest
import torch

from course_lib.collectives.launch import run_on_ranks
from course_lib.collectives.parallelism import run_every_strategy
from course_lib.collectives.primitives import PRIMITIVES, all_reduce_identities, overlap_with_async_op, run_primitive


def every_primitive():
    return {name: run_primitive(name) for name in PRIMITIVES}


def test_each_primitive_moves_what_its_name_says():
    ranks = run_on_ranks(every_primitive, 3)  # rank r starts with [10r+1, 10r+2, 10r+3]
    after = {name: [r[name][1] for r in ranks] for name in PRIMITIVES}
    assert [r["broadcast"][0].tolist() for r in ranks] == [[1, 2, 3], [11, 12, 13], [21, 22, 23]]
    assert all(t.tolist() == [1, 2, 3] for t in after["broadcast"])
    assert after["reduce"][0].tolist() == [33, 36, 39] and after["reduce"][1:] == [None, None]
    assert all(t.tolist() == [33, 36, 39] for t in after["all_reduce"])
    assert all(t.tolist() == [1, 2, 3, 11, 12, 13, 21, 22, 23] for t in after["all_gather"])
    assert [t.tolist() for t in after["reduce_scatter"]] == [[33], [36], [39]]
    assert [t.tolist() for t in after["all_to_all"]] == [[1, 11, 21], [2, 12, 22], [3, 13, 23]]
    with pytest.raises(ValueError, match="choose one of"):
        run_primitive("all_sum")


@pytest.mark.parametrize("world_size", [2, 4])
def test_identities_async_and_every_parallelism_strategy(world_size):
    def everything():
        return all_reduce_identities(), overlap_with_async_op(), run_every_strategy()

    for identities, overlap, strategies in run_on_ranks(everything, world_size):
        assert max(identities.values()) < 1e-5
        assert overlap["error"] == 0
        assert set(strategies) == {"data parallel (DDP): all-reduce", "fully sharded (FSDP): all-gather + reduce-scatter",
                                   "tensor parallel: all-reduce", "mixture of experts: all-to-all",
                                   "pipeline parallel: send/recv"}
        # relative to the values: float32 rounding where ranks add in another order, exact where they only move
        assert max(strategies.values()) < 1e-6, strategies
        assert strategies["mixture of experts: all-to-all"] == strategies["pipeline parallel: send/recv"] == 0
    assert torch.distributed.is_initialized() is False  # nothing leaks into the caller's process
