"""assign_buckets equals torch's own bucket assignment, called the way DDP's Reducer calls it."""

import sys

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.parallel.distributed import _BucketCapacityConfig

from course_lib.collectives.buckets import MIB, assign_buckets, ddp_caps


def torch_rebuilt_buckets(param_bytes: list[int], cap: int, first_cap: int | None) -> list[list[int]]:
    """The Reducer's rebuild: parameters in gradient-ready order (here the reverse of
    model.parameters()), limits [first cap, cap], tensor_indices naming each one's position."""
    ready = list(reversed(range(len(param_bytes))))
    tensors = [torch.empty(param_bytes[i] // 4, device="meta") for i in ready]  # fp32, no memory
    limits = [cap] if first_cap is None else [first_cap, cap]
    buckets, _limits = dist._compute_bucket_assignment_by_size(tensors, limits, tensor_indices=ready)
    return buckets


def sizes_and_caps(max_elements: int, max_cap: int):
    """fp32 parameter sizes with caps on the same scale (small scales hit a cap exactly often)."""
    return st.tuples(st.lists(st.integers(1, max_elements).map(lambda n: 4 * n), min_size=1, max_size=40),
                     st.integers(1, max_cap), st.none() | st.integers(1, max_cap))


@settings(max_examples=500, deadline=None)
@given(case=sizes_and_caps(16, 256) | sizes_and_caps(400_000, 4 * MIB))
def test_assignment_equals_torchs(case):
    param_bytes, cap, first_cap = case
    assert assign_buckets(param_bytes, cap, first_cap) == torch_rebuilt_buckets(param_bytes, cap, first_cap)


@pytest.mark.parametrize("bucket_cap_mb", [None, 0.25, 0.5, 1, 2, 25, 100])
def test_caps_equal_ddps(bucket_cap_mb):
    config = _BucketCapacityConfig.create(bucket_cap_mb, None, use_python_reducer=False)
    assert ddp_caps(bucket_cap_mb) == (config.bucket_bytes_cap, config.first_bucket_bytes_cap)


def test_default_first_bucket_is_one_mib():
    assert ddp_caps(None) == (25 * MIB, dist._DEFAULT_FIRST_BUCKET_BYTES) == (25 * MIB, MIB)


def test_first_iteration_is_one_bucket():
    """DDP's first iteration (find_unused_parameters=False): limit sys.maxsize, one bucket."""
    tensors = [torch.empty(n, device="meta") for n in (1000, 2000, 3000)]
    buckets, _ = dist._compute_bucket_assignment_by_size(tensors, [sys.maxsize])
    assert buckets == [[0, 1, 2]]


def test_bucket_zero_holds_the_last_parameters():
    assert assign_buckets([100, 100, 100, 100], 200) == [[3, 2], [1, 0]]


def test_a_bucket_closes_when_it_reaches_the_cap_exactly():
    assert assign_buckets([100, 100, 100], 200) == [[2, 1], [0]]
    assert assign_buckets([100, 100, 100], 201) == [[2, 1, 0]]


def test_a_parameter_bigger_than_the_cap_closes_the_bucket_it_joins():
    assert assign_buckets([10, 10, 5000, 10, 10], 100) == [[4, 3, 2], [1, 0]]


def test_a_parameter_bigger_than_the_cap_after_a_closed_bucket_is_alone():
    assert assign_buckets([10, 5000, 100, 10], 100) == [[3, 2], [1], [0]]


def test_cap_smaller_than_every_parameter():
    assert assign_buckets([300, 400, 500], 1) == [[2], [1], [0]]


def test_cap_big_enough_for_one_bucket():
    assert assign_buckets([300, 400, 500], 10_000) == [[2, 1, 0]]


def test_only_the_first_bucket_uses_the_first_cap():
    assert assign_buckets([100] * 6, 300, first_bucket_cap_bytes=100) == [[5], [4, 3, 2], [1, 0]]


def test_default_caps_on_the_course_mlp():
    """8 layers of 512x512 fp32 (1 MiB + 2 KiB each): a 1 MiB first bucket of one layer, then the rest."""
    param_bytes = [4 * 512 * 512, 4 * 512] * 8
    buckets = assign_buckets(param_bytes, *ddp_caps(None))
    assert buckets == [[15, 14], list(range(13, -1, -1))]


def test_bad_caps_are_refused():
    with pytest.raises(ValueError):
        assign_buckets([4], 0)
    with pytest.raises(ValueError):
        ddp_caps(-1)
