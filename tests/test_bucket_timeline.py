"""The bucket timeline: one bar per bucket where it ran, gradient marks per layer, and a slider
over a sweep that redraws in place. Built from hand-made timelines (the real recording is tested
in tests/collectives/test_ddp_timeline.py)."""

from course_lib.collectives.ddp_timeline import BucketRecord, BucketTimeline
from course_lib.widgets.bucket_timeline import BucketTimelineExplorer, describe, layer_names, timeline_figure

NAMES = ["0.weight", "0.bias", "2.weight", "2.bias"]


def _timeline(cap, buckets):
    ready = {"2.bias": 0.001, "2.weight": 0.002, "0.bias": 0.004, "0.weight": 0.005}
    return BucketTimeline(cap, buckets, ready, 0.009, 0.02, [NAMES[::-1]], NAMES)


TWO = _timeline(0.5, [BucketRecord(0, ["2.bias", "2.weight"], 1000, 0.0025, 0.006),
                      BucketRecord(1, ["0.bias", "0.weight"], 1000, 0.0055, 0.008)])
ONE = _timeline(25.0, [BucketRecord(0, NAMES[::-1], 2000, 0.0055, 0.0085)])


def test_layers_are_numbered_in_parameter_order():
    assert layer_names(["0.weight", "0.bias", "2.weight", "2.bias", "head.weight"]) == {
        "0.weight": "layer 0", "0.bias": "layer 0", "2.weight": "layer 1", "2.bias": "layer 1", "head.weight": "layer 2"}


def test_figure_places_each_bucket_where_it_ran():
    figure = timeline_figure(TWO)
    marks, bars = figure.data
    assert list(marks.x) == [1.0 + 1.0, 5.0]  # layer 2 ready when its last parameter was (2 ms), layer 0 at 5 ms
    assert list(marks.text) == ["layer 1", "layer 0"]  # modules "2" and "0", numbered in parameter order
    assert list(bars.base) == [2.5, 5.5] and [round(x, 9) for x in bars.x] == [3.5, 2.5]
    assert "2 buckets" in figure.layout.title.text and "(ms)" in figure.layout.xaxis.title.text


def test_description_reports_order_and_overlap_from_the_times():
    assert describe(TWO).startswith("2 buckets in reverse parameter order: bucket 0 holds layer 1")
    assert "1 of 2 all-reduce(s) launched before the last gradient was ready (5.0 ms)" in describe(TWO)
    assert describe(ONE).startswith("one bucket, holding layer 1, layer 0")
    assert "0 of 1" in describe(ONE)


def test_slider_redraws_the_same_pane():
    sweep = [{"bucket_cap_mb": 0.5, "num_buckets": 2, "median_step_s": 0.02, "timeline": TWO},
             {"bucket_cap_mb": 25.0, "num_buckets": 1, "median_step_s": 0.018, "timeline": ONE}]
    explorer = BucketTimelineExplorer(sweep, 0.5)
    pane = explorer.pane
    assert "2 buckets" in pane.figure.layout.title.text
    explorer.cap.value = "25 MiB"
    assert explorer.pane is pane and pane.figure.layout.title.text.endswith(": 1 bucket")
    assert "one bucket" in explorer.readout.value
    assert "18.0 ms" in explorer.table.value
