"""Modules 05 and 06 widgets: primitives on real ranks, the ring stepper, the crossover explorer."""

import math
import re

import matplotlib
import matplotlib.pyplot as plt
import pytest

from course_lib.perf.comm import ALGORITHMS, LINKS, RING, TREE_CHUNK_BYTES
from course_lib.perf.units import format_duration
from course_lib.widgets.crossover import CHUNKS, CUSTOM, SIZES, CrossoverExplorer
from course_lib.widgets.rank_view import PrimitiveExplorer
from course_lib.widgets.rank_view import RANK_COLOURS
from course_lib.widgets.ring_stepper import record_ring, render_frame, ring_frames, ring_stepper

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
    (_, forward, slider), view = stepper.children[0].children, stepper.children[1]
    forward.click()
    assert slider.value == 1 and "scatter-reduce, step 1 of 3" in view.value and "r0&rarr;r1: chunk 0" in view.value
    with pytest.raises(ValueError, match="between 2 and 8"):
        record_ring(9)


def _rgb(colour: str) -> tuple[int, ...]:
    return tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))


def test_ring_stepper_complete_sum_looks_like_no_rank():
    """The complete sum's colour must not be mistaken for a rank's own data (rank 2 was green, as the sum)."""
    world = 4
    html = render_frame({"title": "t", "masks": [[2**r, 15, 2**r | 1, 2**r] for r in range(world)], "sends": []},
                        world)
    backgrounds = re.findall(r"background:(#[0-9a-f]{6})", html)
    complete = {backgrounds[4 * r + 1] for r in range(world)}
    own = {backgrounds[4 * r] for r in range(world)}
    assert own == set(RANK_COLOURS[:world]) and len(complete) == 1
    (sum_colour,) = complete
    assert all(math.dist(_rgb(sum_colour), _rgb(c)) > 100 for c in RANK_COLOURS)
    assert "green" not in html and "the complete sum" in html


def test_crossover_explorer_picks_the_winner():
    explorer = CrossoverExplorer(num_ranks=512, message_bytes=4096)
    assert "Fastest: <b>double binary tree</b>" in explorer.verdict.value
    assert "ring 5.11 ms" in explorer.verdict.value  # what the lesson's next cell prints
    explorer.message.value = 2**30
    assert "Fastest: <b>ring</b>" in explorer.verdict.value  # large messages: the ring, even on 512 ranks
    explorer.chunk.value = 0  # the whiteboard formulas: free pipelining, the double binary tree everywhere
    assert "Fastest: <b>double binary tree</b>" in explorer.verdict.value and "unlike NCCL" in explorer.model.value
    explorer.chunk.value = TREE_CHUNK_BYTES
    explorer.link.value = "NVLink 4 (H100, within a node)"
    assert explorer.alpha_us.value == 1.0 and explorer.bandwidth.value == 450.0  # presets land exactly
    assert explorer.num_ranks.value == 8  # the GPUs one NVLink node joins, not the 512 of the network
    assert "Fastest: <b>ring</b>" in explorer.verdict.value
    explorer.message.value = 4096
    assert "Fastest: <b>double binary tree</b>" in explorer.verdict.value


def test_crossover_explorer_redraws_in_place_from_exact_presets():
    explorer = CrossoverExplorer(num_ranks=512, message_bytes=4096)
    pane = explorer.pane
    titles = set()
    for name, link in LINKS.items():
        explorer.link.value = name
        assert explorer.alpha_us.value * 1e-6 == pytest.approx(link.alpha_s, rel=1e-12)
        assert explorer.bandwidth.value * 1e9 == pytest.approx(link.bandwidth, rel=1e-12)
        assert explorer.pane is pane and pane in explorer.children  # the same plotly widget, redrawn
        titles.add(pane.figure.layout.title.text)
    assert len(titles) == len(LINKS) and not plt.get_fignums()  # a new title for each, no pyplot figure
    explorer.link.value = "InfiniBand NDR 400 Gb/s (across nodes)"
    assert pane.figure.layout.title.text.startswith(
        "All-reduce on 512 ranks over InfiniBand NDR 400 Gb/s (across nodes): α = 5 µs")
    assert "time" in pane.figure.layout.yaxis.title.text and "bytes" in pane.figure.layout.xaxis.title.text
    assert {"100 ms", "1 ms", "10 ms"} <= set(pane.figure.layout.yaxis.ticktext)  # a unit on every tick
    assert pane.figure.layout.xaxis.type == pane.figure.layout.yaxis.type == "log"
    names = [trace.name for trace in pane.data]
    assert names == ["ring", "binary tree", "double binary tree", "ring overtakes double binary tree: 250.2 MiB",
                     "your message: 4 KiB"]  # the verdict's switch, 1 KiB to 4 GiB
    # the curves are the cost model's times, in seconds, at each size
    alpha, beta = LINKS["InfiniBand NDR 400 Gb/s (across nodes)"].alpha_s, LINKS[
        "InfiniBand NDR 400 Gb/s (across nodes)"].beta
    ring = pane.data[0]
    assert list(ring.y) == pytest.approx([RING.time(512, k, alpha, beta, TREE_CHUNK_BYTES) for k in SIZES])
    # hovering any curve shows the size and every algorithm's time there, each in its unit
    first, last = ring.customdata[0], ring.customdata[-1]  # 1 KiB, 4 GiB
    assert first[0] == "1.0 KiB" and list(first[1:]) == [
        format_duration(cost.time(512, 1024, alpha, beta, TREE_CHUNK_BYTES)) for cost in ALGORITHMS.values()]
    assert first[1].endswith(" ms") and last[1:] == ["177 ms", "508 ms", "254 ms"]  # not 177,xxx.x µs
    for trace in pane.data[:3]:
        assert "%{customdata[0]}" in trace.hovertemplate and trace.hovertemplate.count("%{customdata[") == 4
    assert list(pane.data[-1].x) == [4096, 4096]
    explorer.message.value = 2**20
    assert pane.data[-1].name == "your message: 1 MiB"


def test_crossover_presets_set_their_ranks_and_sliders_off_a_preset_read_custom():
    explorer = CrossoverExplorer(num_ranks=512, message_bytes=4096)
    explorer.link.value = "NVLink 4 (H100, within a node)"
    assert explorer.num_ranks.value == 8 and "over NVLink 4" in explorer.pane.figure.layout.title.text
    explorer.num_ranks.value = 512  # more GPUs than one NVLink node joins: the widget says what that models
    assert "8 GPUs of one node" in explorer.note.value
    explorer.link.value = "InfiniBand NDR 400 Gb/s (across nodes)"
    assert explorer.num_ranks.value == 512 and explorer.note.value == ""
    explorer.alpha_us.value = 0.1
    assert explorer.link.value == CUSTOM and explorer.num_ranks.value == 512  # naming 'custom' moves nothing
    assert " over " not in explorer.pane.figure.layout.title.text
    explorer.bandwidth.value = 1.0
    assert explorer.link.value == CUSTOM
    explorer.alpha_us.value, explorer.bandwidth.value = 5.0, 25.0  # back on a preset's values: named again
    assert explorer.link.value == "InfiniBand HDR 200 Gb/s (across nodes)" and explorer.num_ranks.value == 512


def test_crossover_readouts_take_a_unit_that_fits_and_menus_one_byte_format():
    explorer = CrossoverExplorer(num_ranks=2, message_bytes=2**32)
    explorer.alpha_us.value, explorer.bandwidth.value = 0.1, 1.0
    verdict = explorer.verdict.value
    assert "ring 4.29 s" in verdict and "binary tree 17.2 s" in verdict and "µs" not in verdict  # was 4,294,967.5 µs
    assert [label for label, _ in CHUNKS[1:]] == ["32 KiB per tree", "128 KiB per tree (typical)", "512 KiB per tree"]
    assert explorer.message.label == "4 GiB" and explorer.message.options[0][0] == "1 KiB"
