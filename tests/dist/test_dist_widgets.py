"""Modules 05 and 06 widgets: primitives on real ranks, the ring stepper, the crossover explorer."""

import matplotlib
import pytest

from course_lib.widgets.crossover import CrossoverExplorer
from course_lib.widgets.rank_view import PrimitiveExplorer
from course_lib.widgets.ring_stepper import record_ring, ring_frames, ring_stepper

matplotlib.use("Agg")



def test_primitive_explorer_reruns_on_real_ranks():
    explorer = PrimitiveExplorer("broadcast", 2)
    assert explorer.view.value.count("rank ") >= 2 and ">11<" in explorer.view.value  # rank 1's own value before
    explorer.primitive.value = "reduce"
    assert "not defined on this rank" in explorer.view.value and ">12<" in explorer.view.value  # 1 + 11
    explorer.world_size.value = 3
    assert "rank 2" in explorer.view.value


def test_ring_frames_show_scatter_reduce_then_all_gather():
    traces = record_ring(4)
    frames = ring_frames(traces)
    assert len(frames) == 1 + 2 * 3
    # after scatter-reduce, rank r holds the complete sum (mask 0b1111) of chunk r + 1 and only that
    for rank, masks in enumerate(frames[3]["masks"]):
        assert [c for c, m in enumerate(masks) if m == 15] == [(rank + 1) % 4]
    assert all(m == 15 for masks in frames[-1]["masks"] for m in masks)
    assert all(dst == (src + 1) % 4 for frame in frames for src, dst, _ in frame["sends"])
    stepper = ring_stepper(traces)
    (back, forward, slider), view = stepper.children[0].children, stepper.children[1]
    forward.click()
    assert slider.value == 1 and "scatter-reduce, step 1 of 3" in view.value and "r0&rarr;r1: chunk 0" in view.value
    with pytest.raises(ValueError, match="between 2 and 8"):
        record_ring(9)


def test_crossover_explorer_picks_the_winner():
    explorer = CrossoverExplorer(num_ranks=512, message_bytes=4096)
    assert "Fastest: <b>double binary tree</b>" in explorer.verdict.value
    explorer.link.value = "NVLink 4 (H100, within a node)"
    assert explorer.alpha_us.value == pytest.approx(1.0) and explorer.bandwidth.value == pytest.approx(450, rel=0.01)
    explorer.num_ranks.value = 8
    explorer.message.value = 2**30
    assert "Fastest: <b>ring</b>" in explorer.verdict.value
