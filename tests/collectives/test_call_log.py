"""with_calls_recorded: the calls in order, nested calls once, and torch.distributed restored."""

import torch
import torch.distributed as dist

from course_lib.collectives.call_log import with_calls_recorded
from course_lib.collectives.launch import run_on_ranks


def a_few_calls():
    t = torch.ones(2)
    dist.all_reduce(t)
    dist.all_gather_object([None] * dist.get_world_size(), "x")  # calls all_gather inside: counted once
    dist.barrier()
    return t.sum().item()


def record_then_check_restored():
    before = dist.all_reduce
    result, calls = with_calls_recorded(a_few_calls)
    return result, calls, dist.all_reduce is before


def test_calls_are_recorded_in_order_and_the_functions_restored():
    for result, calls, restored in run_on_ranks(record_then_check_restored, 2):
        assert result == 4.0
        assert calls == ["all_reduce", "all_gather_object", "barrier"]
        assert restored
