"""The all-reduce crossover figure: the model's curves and K*, measured rows, redrawn in place."""

import json

import pytest

from course_lib.collectives.symmetric import SIZES as BENCH_SIZES, crossovers
from course_lib.perf import vllm_all_reduce
from course_lib.perf.tp_all_reduce import (
    all_reduce_time,
    alpha_for_crossover,
    one_shot_ring_crossover_bytes,
    two_shot_crossover_bytes,
)
from course_lib.perf.units import KiB, MiB, format_bytes, format_number
from course_lib.widgets.all_reduce_crossover import (
    MEASURED_MODE,
    MODEL,
    NOISE,
    SIZES,
    AllReduceCrossover,
    measured_crossover_text,
    measured_figure,
    measured_summary,
    model_crossover_text,
    model_figure,
    read_crossover,
)


def fake_rows(two_shot_from: int | None) -> list[dict]:
    """Rows shaped as ``symmetric.benchmark`` returns them; two-shot faster from ``two_shot_from`` bytes on."""
    rows = []
    for size in BENCH_SIZES:
        one = 20e-6 + size / 2e9
        two = one * (0.8 if two_shot_from is not None and size >= two_shot_from else 1.3)
        rows.append({"bytes": size, "one_shot_s": one, "two_shot_s": two, "gloo_s": 3 * one})
    return rows


def _markers(figure):
    return {t.name: t for t in figure.data if t.mode == "markers"}


def test_model_traces_and_crossover_marker_at_k_star():
    alpha, bandwidth = 5e-6, 400e9
    figure = model_figure(8, alpha, bandwidth)
    lines = sorted((t for t in figure.data if t.mode == "lines" and t.showlegend is not False),
                   key=lambda t: t.legendrank)
    assert [t.name for t in lines] == ["one-shot", "two-shot", "ring"]
    assert lines[0].x[0] == KiB and lines[0].x[-1] == pytest.approx(64 * MiB)
    assert list(lines[1].y) == pytest.approx([all_reduce_time("two-shot", 8, k, alpha, bandwidth) * 1e6 for k in SIZES])
    star = two_shot_crossover_bytes(8, alpha, bandwidth)
    marker = _markers(figure)[f"two-shot overtakes one-shot: {format_bytes(star)}"]
    assert marker.x[0] == star == pytest.approx(380952.38, abs=0.01)
    assert marker.y[0] == pytest.approx(all_reduce_time("two-shot", 8, star, alpha, bandwidth) * 1e6)
    ring_at = one_shot_ring_crossover_bytes(8, alpha, bandwidth)
    assert _markers(figure)[f"one-shot stops beating the ring: {format_bytes(ring_at)}"].x[0] == ring_at
    assert figure.layout.xaxis.type == "log" and figure.layout.yaxis.type == "log"
    assert "bytes" in figure.layout.xaxis.title.text and "µs" in figure.layout.yaxis.title.text
    assert "8 GPUs" in figure.layout.title.text
    assert format_bytes(star) in model_crossover_text(8, alpha, bandwidth)


@pytest.mark.parametrize("n, bandwidth", [(4, 450e9), (8, 450e9), (8, 900e9)])
def test_the_verdict_sets_what_vllm_runs_beside_k_star(n, bandwidth):
    text = model_crossover_text(n, 1e-6, bandwidth)
    limit = vllm_all_reduce.one_shot_below(n)
    assert f"vLLM on {n} H100s, by measured thresholds: {vllm_all_reduce.describe(n)}." in text
    assert f"leaves one-shot at {format_bytes(limit)}, where vLLM does, with " in text
    assert f"α = {alpha_for_crossover(n, limit, bandwidth) * 1e6:.2f} µs at {bandwidth / 1e9:g} GB/s" in text
    assert format_bytes(two_shot_crossover_bytes(n, 1e-6, bandwidth)) in text  # the model's own K* first
    assert vllm_all_reduce.describe(2) in model_crossover_text(2, 1e-6, 450e9)
    assert "vLLM on 3 H100s: NCCL at every size" in model_crossover_text(3, 1e-6, 450e9)


def test_on_eight_gpus_the_verdict_never_says_vllm_runs_two_shot():
    """vLLM's custom kernel would switch to two-shot at 256 KiB on 8 GPUs, but on H100s it only takes
    messages below that; the widget says multimem, as vllm_all_reduce.route does."""
    text = model_crossover_text(8, 1e-6, 450e9)
    assert "two-shot (vLLM" not in text and "multimem (PyTorch's symmetric memory) from 256.0 KiB" in text


def test_two_ranks_never_cross():
    figure = model_figure(2)
    assert not _markers(figure) and len(figure.data) == 3
    assert "Never at N = 2" in model_crossover_text(2, 1e-6, 450e9)


def test_crossover_off_the_range_has_no_marker_but_is_stated():
    alpha, bandwidth = 100e-6, 1000e9  # K* = 100e-6 * 1e12 * 3 / 2 = 150 MB, beyond 64 MiB
    assert not _markers(model_figure(3, alpha, bandwidth))
    assert "off this plot's range" in model_crossover_text(3, alpha, bandwidth)


@pytest.mark.parametrize("start", [64 * KiB, None])
def test_measured_rows_render_with_the_measured_crossover(start):
    rows = fake_rows(start)
    assert crossovers(rows)["two_shot_over_one_shot"] == start
    figure = measured_figure(rows, world_size=4)
    traces = [t for t in figure.data if t.mode == "lines+markers"]
    assert [t.name for t in traces] == ["one-shot", "two-shot", "gloo's dist.all_reduce"]
    assert list(traces[0].x) == BENCH_SIZES and traces[2].y[0] == pytest.approx(rows[0]["gloo_s"] * 1e6)
    markers = _markers(figure)
    if start is None:
        assert not markers and "never overtakes" in measured_crossover_text(rows)
    else:
        (marker,) = markers.values()
        assert marker.x[0] == start and marker.y[0] == pytest.approx(rows[BENCH_SIZES.index(start)]["two_shot_s"] * 1e6)
        assert f"two-shot overtakes one-shot at {format_bytes(start)}" in measured_crossover_text(rows)
    assert "4 CPU ranks" in figure.layout.title.text and "µs" in figure.layout.yaxis.title.text


def test_sliders_redraw_in_place():
    widget = AllReduceCrossover()
    pane, verdict = widget.pane, widget.verdict
    assert format_bytes(two_shot_crossover_bytes(8)) in verdict.value
    widget.num_ranks.value = 2
    assert "Never at N = 2" in verdict.value and len(pane.data) == 3
    widget.num_ranks.value = 4
    widget.alpha_us.value = 5.0
    widget.bandwidth.value = 50.0
    star = two_shot_crossover_bytes(4, 5e-6, 50e9)
    assert _markers(pane)[f"two-shot overtakes one-shot: {format_bytes(star)}"].x[0] == pytest.approx(star)
    assert "4 GPUs" in pane.figure.layout.title.text and "50 GB/s" in pane.figure.layout.title.text
    assert widget.pane is pane and widget.verdict is verdict and widget.children[-1] is pane


def _shown(row) -> bool:
    return row.layout.display != "none"


def test_measured_mode_shows_rows_and_hides_the_sliders():
    """The walk: model mode, sliders moved to N = 2, α = 0.1, B = 1, back to measured: greyed sliders
    showed those values beside a 4-rank measurement. In measured mode they are hidden, and the model
    comes back with its settings."""
    widget = AllReduceCrossover()
    pane = widget.pane
    widget.mode.value = MEASURED_MODE
    assert "No measurements yet" in widget.verdict.value and not any(map(_shown, widget.slider_rows))
    widget.set_measured(fake_rows(256 * KiB), world_size=4)
    assert "256.0 KiB" in widget.verdict.value and "4 CPU ranks" in pane.figure.layout.title.text
    widget.mode.value = "model"
    assert all(map(_shown, widget.slider_rows)) and "model" in pane.figure.layout.title.text and widget.pane is pane
    widget.num_ranks.value, widget.alpha_us.value, widget.bandwidth.value = 2, 0.1, 1.0
    widget.mode.value = MEASURED_MODE
    assert not any(map(_shown, widget.slider_rows)) and "4 CPU ranks" in pane.figure.layout.title.text
    widget.mode.value = "model"
    assert (widget.num_ranks.value, widget.alpha_us.value, widget.bandwidth.value) == (2, 0.1, 1.0)
    widget = AllReduceCrossover(rows=fake_rows(64 * KiB))
    widget.mode.value = MEASURED_MODE
    assert "64.0 KiB" in widget.verdict.value


def test_rows_with_the_ring_and_nccl_columns_render():
    from course_lib.collectives import symmetric
    if not hasattr(symmetric, "BASELINES"):
        pytest.skip("this symmetric.benchmark returns one_shot_s, two_shot_s and gloo_s only")
    rows = [{"bytes": row["bytes"], "one_shot_s": row["one_shot_s"], "two_shot_s": row["two_shot_s"],
             "ring_s": 2 * row["one_shot_s"], "nccl_s": row["gloo_s"]} for row in fake_rows(64 * KiB)]
    figure = measured_figure(rows, world_size=8)
    names = [t.name for t in figure.data if t.mode == "lines+markers"]
    assert names == ["one-shot", "two-shot", "hand-written ring (collectives/ring.py)", "NCCL's dist.all_reduce"]
    assert "8 GPUs" in figure.layout.title.text and "NCCL" in figure.layout.title.text
    assert _markers(figure)["measured crossover: two-shot overtakes one-shot at 64.0 KiB"].x[0] == 64 * KiB
    text = measured_crossover_text(rows)
    assert "one-shot beats NCCL at every size" in text and "two-shot beats the hand-written ring at every size" in text


def test_rows_from_a_real_benchmark_render():
    from course_lib.collectives.symmetric import benchmark
    rows = benchmark(2, [KiB, 16 * KiB], repeats=1)
    figure = measured_figure(rows, world_size=2)
    names = [t.name for t in figure.data if t.mode == "lines+markers"]
    assert names[:2] == ["one-shot", "two-shot"] and len(names) == sum(c.endswith("_s") for c in rows[0])
    kind, star = read_crossover(rows, "two_shot", "one_shot")
    assert [t.x[0] for t in _markers(figure).values()] == ([star] if kind == "from" else [])
    assert "Measured" in measured_crossover_text(rows)


def test_it_opens_on_given_rows_at_their_rank_count_and_hides_the_toggle_without_rows():
    chart = AllReduceCrossover(fake_rows(4 * KiB), world_size=4)
    assert chart.mode.value == MEASURED_MODE and chart.num_ranks.value == 4
    assert chart.mode.layout.display is None
    bare = AllReduceCrossover()
    assert bare.mode.value == MODEL and bare.mode.layout.display == "none"
    bare.set_measured(fake_rows(None), world_size=2)
    assert bare.mode.layout.display is None and bare.mode.value == MEASURED_MODE and bare.num_ranks.value == 2


def test_two_shot_is_dashed_so_it_shows_on_top_of_the_ring_at_two_ranks():
    figure = model_figure(2)
    two_shot = next(trace for trace in figure.data if trace.name.startswith("two-shot"))
    ring = next(trace for trace in figure.data if trace.name == "ring")
    assert two_shot.y == ring.y and two_shot.line.dash == "dash" and ring.line.dash == "solid"


def noisy_rows(tail_from: int) -> list[dict]:
    """One-shot and two-shot within a few percent of each other below ``tail_from`` (two-shot ahead
    at the very first size), two-shot clearly faster from it on: a crossover only noise could place."""
    rows = []
    for i, size in enumerate(BENCH_SIZES):
        one = 500e-6 + size / 1e9
        two = one * (0.7 if size >= tail_from else (0.97 if i % 2 == 0 else 1.03))
        rows.append({"bytes": size, "one_shot_s": one, "two_shot_s": two, "gloo_s": 10 * one})
    return rows


def test_a_crossover_that_noise_could_place_is_not_reported():
    """The walk: "two-shot overtakes one-shot at 1.0 KiB", the first size, where the two were within
    noise. Below a reported crossover the slower one must have been ahead by more than NOISE."""
    rows = noisy_rows(BENCH_SIZES[2])
    kind, at = read_crossover(rows, "two_shot", "one_shot")
    assert (kind, at) == ("everywhere", None)
    assert "no crossover" in measured_crossover_text(rows) and "overtakes one-shot at" not in measured_crossover_text(rows)
    assert not _markers(measured_figure(rows, world_size=4))
    clear = fake_rows(64 * KiB)  # one-shot 30% ahead below 64 KiB: a real crossover
    assert read_crossover(clear, "two_shot", "one_shot") == ("from", 64 * KiB) and NOISE < 0.3
    assert read_crossover(fake_rows(None), "two_shot", "one_shot") == ("never", None)


def test_the_printed_summary_reads_plainly_and_fits_a_line():
    rows = noisy_rows(BENCH_SIZES[2])
    lines = measured_summary(rows)
    assert lines[0] == "two-shot is ahead of one-shot or within 10% at every size: no crossover"
    assert "one-shot beats gloo at every size, 1.0 KiB to " in lines[1]
    never = measured_summary(fake_rows(None))[0]
    assert never == f"two-shot is not faster than one-shot at {format_bytes(BENCH_SIZES[-1])}, the largest size: no crossover"
    assert all("not at the largest size" not in line and len(line) <= 96 for line in lines + [never])


@pytest.mark.parametrize("figure", [model_figure(2), model_figure(8), model_figure(2, 100e-6, 1000e9),
                                    measured_figure(fake_rows(64 * KiB), 4)],
                         ids=["model N=2", "model N=8", "model under one decade", "measured"])
def test_the_time_axis_labels_every_tick_in_full(figure):
    """The walk saw bare "2" and "5" minor labels; every tick is now chosen and labelled here, at least
    two of them inside the data, even where it spans less than a decade (α = 100 µs, 1,000 GB/s)."""
    axis = figure.layout.yaxis
    times = [y for trace in figure.data for y in trace.y]
    assert axis.type == "log" and len(axis.tickvals) >= 2
    assert all(min(times) <= t <= max(times) for t in axis.tickvals)
    assert list(axis.ticktext) == [format_number(t) for t in axis.tickvals]
    assert not {"2", "5"} & set(axis.ticktext) or axis.tickvals[0] < 10  # "2" only as 2 µs, never a minor label



def test_at_two_ranks_the_legend_says_two_shot_lies_on_the_ring_and_it_is_drawn_on_top():
    figure = model_figure(2)
    names = [t.name for t in figure.data]
    two_shot = next(t for t in figure.data if t.name.startswith("two-shot"))
    assert "on the ring's line" in two_shot.name and names.index(two_shot.name) > names.index("ring")
    assert not any("on the ring's line" in (t.name or "") for t in model_figure(8).data)


def test_saved_gpu_runs_are_replayed_and_their_absence_said(tmp_path, monkeypatch, capsys):
    """Lesson 08's replay of ``./course gpu-report``: only passed tensor-parallel parts, each with its
    summary and a chart; with none saved, how to make one (and no widget call left in the cell)."""
    from course_lib.widgets import all_reduce_crossover as module

    monkeypatch.setattr(module, "RESULTS_DIR", tmp_path)
    shown = []
    monkeypatch.setattr(module, "display", shown.append)
    module.show_saved_runs()
    assert "No GPU run saved yet" in capsys.readouterr().out and not shown
    rows = fake_rows(64 * KiB)
    report = {"parts": {"tensor_parallel": {"status": "passed", "result": {"rows": rows, "world_size": 8}}}}
    (tmp_path / "gpu_report_H100.json").write_text(json.dumps(report))
    (tmp_path / "gpu_report_bad.json").write_text(json.dumps({"parts": {"tensor_parallel": {"status": "failed"}}}))
    module.show_saved_runs()
    out = capsys.readouterr().out
    assert out.startswith("gpu_report_H100.json, 8 GPUs:\n") and f"  {measured_summary(rows)[0]}\n" in out
    (chart,) = shown
    assert isinstance(chart, AllReduceCrossover) and chart.num_ranks.value == 8 and chart.mode.value == MEASURED_MODE
