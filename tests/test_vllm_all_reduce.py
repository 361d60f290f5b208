"""vLLM's all-reduce routing as read from its code: each path at its boundaries, strict or inclusive."""

import random

import pytest

from course_lib.perf.units import KiB, MiB
from course_lib.perf.vllm_all_reduce import (
    ALGORITHMS,
    BLACKWELL,
    CUSTOM_ONE_SHOT,
    CUSTOM_TWO_SHOT,
    HOPPER,
    MULTIMEM,
    NCCL,
    SYMM_TWO_SHOT,
    custom_limit,
    describe,
    one_shot_below,
    route,
    segments,
)

A100 = "8.0"
STEP = 16


@pytest.mark.parametrize("n, boundaries", [
    # (first size of the route, route) on H100s, with vLLM's defaults
    (8, [(STEP, CUSTOM_ONE_SHOT), (256 * KiB, MULTIMEM), (64 * MiB + STEP, NCCL)]),
    (6, [(STEP, CUSTOM_ONE_SHOT), (256 * KiB, CUSTOM_TWO_SHOT), (512 * KiB, MULTIMEM), (64 * MiB + STEP, NCCL)]),
    (4, [(STEP, CUSTOM_ONE_SHOT), (512 * KiB, CUSTOM_TWO_SHOT), (8 * MiB, MULTIMEM), (32 * MiB + STEP, NCCL)]),
    (2, [(STEP, CUSTOM_ONE_SHOT), (8 * MiB, SYMM_TWO_SHOT), (64 * MiB + STEP, NCCL)]),
])
def test_h100_routes_change_exactly_at_the_thresholds(n, boundaries):
    """The custom all-reduce takes sizes strictly below its cap (so 256 KiB on 8 H100s is not its),
    symmetric memory up to and including its limit."""
    for (start, name), following in zip(boundaries, boundaries[1:] + [(None, None)]):
        assert route(n, start) == name
        if following[0] is not None:
            assert route(n, following[0] - STEP) == name and route(n, following[0]) == following[1]
    assert [(start, name) for start, _, name in segments(n)] == boundaries


def test_on_eight_h100s_the_custom_kernel_only_ever_runs_one_shot():
    assert custom_limit(8) == 256 * KiB == one_shot_below(8)
    assert CUSTOM_TWO_SHOT not in {name for _, _, name in segments(8)}
    assert describe(8) == ("one-shot (vLLM's custom all-reduce) below 256.0 KiB, multimem (PyTorch's symmetric "
                           "memory) from 256.0 KiB, NCCL above 64.0 MiB")


def test_other_generations_and_links():
    """A100: no symmetric-memory tables, so the custom kernel keeps its 8 MiB buffer and its own
    two-shot; B200: its own caps; PCIe: the custom kernel for pairs only; 3 or 16 GPUs: NCCL."""
    assert route(8, 256 * KiB, A100) == CUSTOM_TWO_SHOT and route(8, 8 * MiB, A100) == NCCL
    assert route(8, 8 * MiB - STEP, A100) == CUSTOM_TWO_SHOT
    assert route(8, 512 * KiB, BLACKWELL) == CUSTOM_TWO_SHOT and route(8, 1 * MiB, BLACKWELL) == MULTIMEM
    assert route(4, 2 * MiB, BLACKWELL) == SYMM_TWO_SHOT  # no multimem on 4 B200s
    assert route(2, 1 * MiB, nvswitch=False) == CUSTOM_ONE_SHOT and route(2, 8 * MiB, nvswitch=False) == NCCL
    assert route(4, STEP, nvswitch=False) == NCCL and describe(4, nvswitch=False) == "NCCL at every size"
    for n in (3, 16):
        assert describe(n) == "NCCL at every size" and one_shot_below(n) is None


def test_segments_agree_with_route_everywhere():
    rng = random.Random(0)
    for capability in (HOPPER, BLACKWELL, A100):
        for n in (2, 4, 6, 8):
            found = segments(n, capability)
            assert all(a[2] != b[2] for a, b in zip(found, found[1:]))
            for size in [STEP * rng.randrange(1, 2**23) for _ in range(200)]:
                start, end, name = next(s for s in found if s[0] <= size and (s[1] is None or size <= s[1]))
                assert route(n, size, capability) == name


def test_every_route_names_its_algorithm_and_bad_sizes_are_refused():
    assert set(ALGORITHMS) == {CUSTOM_ONE_SHOT, CUSTOM_TWO_SHOT, MULTIMEM, SYMM_TWO_SHOT, NCCL}
    for size in (0, 24, -16):
        with pytest.raises(ValueError, match="multiple of 16"):
            route(8, size)
