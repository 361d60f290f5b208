"""The all-reduce crossover figure: the model's curves and K*, measured rows, redrawn in place."""

import pytest

from course_lib.collectives.symmetric import SIZES as BENCH_SIZES, crossovers
from course_lib.perf.tp_all_reduce import (
    all_reduce_time,
    alpha_for_crossover,
    one_shot_ring_crossover_bytes,
    two_shot_crossover_bytes,
    vllm_two_shot_from,
)
from course_lib.perf.units import KiB, MiB, format_bytes
from course_lib.widgets.all_reduce_crossover import (
    MEASURED_MODE,
    MODEL,
    SIZES,
    AllReduceCrossover,
    measured_crossover_text,
    measured_figure,
    model_crossover_text,
    model_figure,
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
    lines = [t for t in figure.data if t.mode == "lines" and t.showlegend is not False]
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
def test_the_verdict_sets_vllms_measured_switch_beside_k_star(n, bandwidth):
    text = model_crossover_text(n, 1e-6, bandwidth)
    switch = vllm_two_shot_from(n)
    assert f"switches to two-shot at {format_bytes(switch)} on {n} GPUs" in text
    assert f"α = {alpha_for_crossover(n, switch, bandwidth) * 1e6:.2f} µs at {bandwidth / 1e9:g} GB/s" in text
    assert format_bytes(two_shot_crossover_bytes(n, 1e-6, bandwidth)) in text  # the model's own K* first
    assert "also runs one-shot at every size on 2 GPUs" in model_crossover_text(2, 1e-6, 450e9)
    assert "no kernel for 3 GPUs" in model_crossover_text(3, 1e-6, 450e9)


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


def test_measured_mode_shows_rows_and_disables_the_sliders():
    widget = AllReduceCrossover()
    pane = widget.pane
    widget.mode.value = MEASURED_MODE
    assert "No measurements yet" in widget.verdict.value and widget.num_ranks.disabled
    widget.set_measured(fake_rows(256 * KiB), world_size=4)
    assert "256.0 KiB" in widget.verdict.value and "4 CPU ranks" in pane.figure.layout.title.text
    widget.mode.value = "model"
    assert not widget.num_ranks.disabled and "model" in pane.figure.layout.title.text and widget.pane is pane
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
    assert "one-shot beats NCCL from" in text and "two-shot beats the hand-written ring from" in text


def test_rows_from_a_real_benchmark_render():
    from course_lib.collectives.symmetric import benchmark
    rows = benchmark(2, [KiB, 16 * KiB], repeats=1)
    figure = measured_figure(rows, world_size=2)
    names = [t.name for t in figure.data if t.mode == "lines+markers"]
    assert names[:2] == ["one-shot", "two-shot"] and len(names) == sum(c.endswith("_s") for c in rows[0])
    star = crossovers(rows)["two_shot_over_one_shot"]
    assert [t.x[0] for t in _markers(figure).values()] == ([] if star is None else [star])
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
    two_shot = next(trace for trace in figure.data if trace.name == "two-shot")
    ring = next(trace for trace in figure.data if trace.name == "ring")
    assert two_shot.y == ring.y and two_shot.line.dash == "dash" and ring.line.dash == "solid"
