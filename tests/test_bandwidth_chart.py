"""The bandwidth chart: one curve per collective from a benchmark result, metric switch in place."""

from dataclasses import replace

import pytest

from course_lib.collectives.bench import BenchResult, BenchRow
from course_lib.widgets.bandwidth_chart import BandwidthChart, bandwidth_figure, link_peak_gbps


def _result():
    rows = [BenchRow("all_reduce", size, size // 4, "float32", size / 1e3, size / 1e6, 1.5 * size / 1e6, True)
            for size in (1024, 4096)]
    rows += [BenchRow("broadcast", size, size // 4, "float32", size / 2e3, size / 5e5, size / 5e5, True)
             for size in (1024, 4096)]
    return BenchResult("gloo", 4, 1, ["host"], "2.13.0", "CPU", "float32", 1, 2, rows)


def test_one_curve_per_collective_with_its_factor():
    figure = bandwidth_figure(_result(), "busbw", peak_gbps=0.01)
    names = [trace.name for trace in figure.data]
    assert names == ["all_reduce (busbw = algbw x 1.5)", "broadcast (busbw = algbw x 1)"]
    assert list(figure.data[0].x) == [1024, 4096] and list(figure.data[0].y) == [1.5 * 1024 / 1e6, 1.5 * 4096 / 1e6]
    assert figure.layout.xaxis.type == "log" and "GB/s" in figure.layout.yaxis.title.text
    assert list(figure.layout.xaxis.ticktext) == ["1 KiB", "4 KiB"]  # binary units at the powers of 4 measured
    assert figure.layout.shapes  # the peak line
    with pytest.raises(ValueError, match="choose one of"):
        bandwidth_figure(_result(), "goodput")


def test_metric_switch_redraws_in_place():
    chart = BandwidthChart(_result())
    pane = chart.pane
    chart.metric.value = "time_us"
    assert chart.pane is pane and pane.figure.layout.yaxis.type == "log"
    assert list(pane.data[1].y) == pytest.approx([1024 / 2e3 * 1e-6, 4096 / 2e3 * 1e-6])  # seconds


def test_every_axis_and_hover_names_its_unit():
    """The x axis said only 'message size', and time ticks read '100k, 10k, 1000' (µs)."""
    timed = bandwidth_figure(_result(), "time_us")
    assert "bytes" in timed.layout.xaxis.title.text
    assert list(timed.layout.yaxis.ticktext)[-4:] == ["1 µs", "2 µs", "3 µs", "4 µs"]  # 0.512 µs to 4.1 µs
    assert all(text.endswith(("s", "B")) for text in [*timed.layout.yaxis.ticktext, *timed.layout.xaxis.ticktext])
    hover = timed.data[0]
    assert list(hover.customdata[0][:2]) == ["1 KiB", "1.02 µs"] and "%{customdata[1]}" in hover.hovertemplate


def test_link_peak_comes_from_the_gpu_preset_of_one_node_runs():
    cpu = _result()
    assert link_peak_gbps(cpu) is None
    assert link_peak_gbps(replace(cpu, device="NVIDIA H200")) == 450  # NVLink 4: 900 GB/s both ways
    assert link_peak_gbps(replace(cpu, device="NVIDIA L4")) == 32  # no NVLink: PCIe Gen4 x16
    assert link_peak_gbps(replace(cpu, device="NVIDIA H200", num_nodes=2)) is None


def test_saved_gpu_runs_are_each_drawn_against_their_own_link(tmp_path, monkeypatch, capsys):
    from course_lib.widgets import bandwidth_chart

    shown = []
    monkeypatch.setattr(bandwidth_chart, "display", shown.append)
    monkeypatch.setattr(bandwidth_chart, "saved_results", lambda: [])
    bandwidth_chart.show_saved_runs()
    printed = capsys.readouterr().out
    assert not shown and "./course gpu-report" in printed and "`" not in printed  # printed text shows no Markdown
    saved = tmp_path / "nccl_bench_h200.json"
    replace(_result(), backend="nccl", device="NVIDIA H200", hostnames=["node0"]).save(saved)
    monkeypatch.setattr(bandwidth_chart, "saved_results", lambda: [saved])
    bandwidth_chart.show_saved_runs()
    (chart,) = shown
    assert isinstance(chart, BandwidthChart) and chart.peak_gbps == link_peak_gbps(chart.result) == 450
    assert "NVIDIA H200, nccl (nccl_bench_h200.json)" in chart.title
