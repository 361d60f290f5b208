"""Module 09's reload-or-recompute explorer: the numbers are kv_tiers', the worked example shows, the
crossover marker sits at crossover_tokens, and the controls redraw in place."""

import re

import pytest

from course_lib.perf.hardware import get_gpu
from course_lib.perf.kv_tiers import (
    CPU_DRAM,
    GPU_HBM,
    LOCAL_NVME,
    POOL_TCP,
    KVTier,
    crossover_tokens,
    get_tier,
    reload_bytes,
    reload_time,
    recompute_time,
    weight_read_bound_below,
)
from course_lib.perf.models import get_model
from course_lib.perf.units import GB
from course_lib.widgets.reload_or_recompute import (
    CHART_LENGTHS,
    MAX_LENGTH,
    MIN_LENGTH,
    ReloadOrRecomputeExplorer,
    crossover_html,
    default_tflops,
    reload_recompute_figure,
)

H100, A100 = get_gpu("H100-80GB"), get_gpu("A100-80GB")
L8 = get_model("Llama-3.1-8B")


def _markers(figure):
    return {t.name: t for t in figure.data if t.mode == "markers"}


def test_worked_example_appears():
    widget = ReloadOrRecomputeExplorer(tier=CPU_DRAM, model="Llama-3.1-8B", gpu="H100-80GB", tokens=10_100)
    assert widget.tflops.value == 500.0 and not widget.include_attention.value
    text = widget.readout.value
    assert "1.32 GB" in text and "26.5 ms" in text and "0.32 s" in text and "reload wins, 12.2x" in text
    tier = get_tier(CPU_DRAM)
    assert reload_time(L8, 10_100, tier) == pytest.approx(0.0265, abs=5e-4)
    assert recompute_time(L8, 10_100, H100, flops=500e12) == pytest.approx(0.324, abs=5e-3)


def test_readout_matches_the_cost_model():
    widget = ReloadOrRecomputeExplorer(tier=LOCAL_NVME, tokens=32_000, include_attention=True)
    tier = get_tier(LOCAL_NVME)
    text = widget.readout.value
    kv = float(re.search(r"<b>([\d.]+) GB</b> of KV", text).group(1))
    assert kv == pytest.approx(reload_bytes(L8, 32_000) / GB, abs=0.005)
    reload_s = float(re.search(r"Reload from [^:]+: <b>([\d.]+) s", text).group(1))
    assert reload_s == pytest.approx(reload_time(L8, 32_000, tier), abs=0.005)
    recompute_s = float(re.search(r"TFLOP/s: <b>([\d.]+) s", text).group(1))
    assert recompute_s == pytest.approx(recompute_time(L8, 32_000, H100, 500e12, include_attention=True), abs=0.005)


SLOW_LINK = KVTier("a far pool", 50e9, 5e-3)  # 5 ms of latency: the crossover (~170 tokens) is in range


@pytest.mark.parametrize("tier_name, attention", [(LOCAL_NVME, False), (POOL_TCP, True), (LOCAL_NVME, True),
                                                  (SLOW_LINK, True)])
def test_crossover_marker_at_crossover_tokens(tier_name, attention):
    tier = tier_name if isinstance(tier_name, KVTier) else get_tier(tier_name)
    figure = reload_recompute_figure(L8, tier, H100, 500e12, attention)
    at = crossover_tokens(L8, tier, H100, flops=500e12, include_attention=attention, max_tokens=MAX_LENGTH)
    assert at is not None
    if at < MIN_LENGTH:  # left of the chart: told in words (crossover_html), no marker floating off the curves
        assert not _markers(figure)
        assert "below the chart's" in crossover_html(L8, tier, H100, at, None)
    else:
        (marker,) = _markers(figure).values()
        assert marker.x[0] == at and marker.name == f"crossover: {at:,.0f} tokens"
    reload_curve = next(t for t in figure.data if t.name.startswith("reload from"))
    assert list(reload_curve.x) == list(CHART_LENGTHS)
    assert list(reload_curve.y) == pytest.approx([reload_time(L8, n, tier) for n in CHART_LENGTHS])
    recompute_curve = next(t for t in figure.data if t.name.startswith("recompute"))
    assert list(recompute_curve.y) == pytest.approx([recompute_time(L8, n, H100, 500e12, attention)
                                                     for n in CHART_LENGTHS])
    assert figure.layout.xaxis.type == "log" and figure.layout.yaxis.type == "log"
    assert "tokens" in figure.layout.xaxis.title.text and "(s," in figure.layout.yaxis.title.text


def test_slow_tier_crossover_in_the_middle_of_the_chart():
    from course_lib.perf.kv_tiers import KVTier
    slow = KVTier("slow", 2e9, 1e-3)  # 2 GB/s: slower per token than a short prefill; attention catches up
    at = crossover_tokens(L8, slow, H100, flops=500e12, include_attention=True, max_tokens=MAX_LENGTH)
    assert at is not None and 16 < at < MAX_LENGTH
    assert _markers(reload_recompute_figure(L8, slow, H100, 500e12, True))[f"crossover: {at:,.0f} tokens"].x[0] == at


def test_reload_everywhere_note_and_resident_tier():
    widget = ReloadOrRecomputeExplorer(tier=CPU_DRAM)
    assert "Reload wins at every length" in widget.verdict.value and not _markers(widget.pane)
    widget.tier.value = GPU_HBM
    assert not any(t.name.startswith("reload from") for t in widget.pane.data)
    assert "already in HBM" in widget.readout.value and "Reload wins at every length" in widget.verdict.value


def test_weight_read_floor_and_fixed_notes():
    widget = ReloadOrRecomputeExplorer()
    floor = weight_read_bound_below(L8, H100, 500e12)
    assert f"below about {floor:,.0f} tokens" in widget.floor.value
    assert any(t.name == f"weight-read floor: {floor:,.0f} tokens" for t in widget.pane.data)
    notes = widget.children[-1].value
    assert "cudaMemcpyAsync" in notes and "83.4" in notes and "68.5" in notes
    assert "2-22x" in notes and "9x" in notes and "vLLM's offloading-connector post" in notes


def test_controls_redraw_in_place():
    widget = ReloadOrRecomputeExplorer()
    pane, readout, verdict = widget.pane, widget.readout, widget.verdict
    assert widget.tier.layout.display is None and widget.tokens.layout.display is None  # shown in every mode
    widget.tier.value = LOCAL_NVME
    at = crossover_tokens(L8, get_tier(LOCAL_NVME), H100, flops=500e12, max_tokens=MAX_LENGTH)
    assert f"Crossover at {at:,.0f} tokens" in verdict.value and "below the chart's" in verdict.value
    widget.gpu.value = "A100-80GB"
    assert widget.tflops.value == default_tflops(A100) == 156.0 and "156.0 TFLOP/s" in readout.value
    widget.flops_mode.value = "utilization"
    widget.utilization.value = 0.25
    assert "78.0 TFLOP/s" in readout.value and widget.tflops.layout.display == "none"
    assert widget.tier.layout.display is None and widget.tokens.layout.display is None
    widget.include_attention.value = True
    widget.tokens.value = 131_072
    assert "131,072 tokens" in readout.value and "A100-80GB" in pane.figure.layout.title.text
    assert widget.pane is pane and widget.readout is readout and widget.verdict is verdict


@pytest.mark.parametrize("tokens, shown", [(16, "2.1 MB"), (1024, "134 MB"), (10_100, "1.32 GB")])
def test_the_kv_size_takes_a_unit_that_fits(tokens, shown):
    """16 tokens of Llama-3.1-8B are 2.1 MB of KV, not '0.00 GB'."""
    widget = ReloadOrRecomputeExplorer(tier=CPU_DRAM, model="Llama-3.1-8B", tokens=tokens)
    assert f"<b>{shown}</b> of KV" in widget.readout.value and reload_bytes(L8, tokens) == tokens * 131_072
