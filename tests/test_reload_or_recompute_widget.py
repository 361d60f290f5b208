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
    tier_on_gpu,
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


def _seconds(text: str) -> float:
    """'26.5 ms' -> 0.0265: a duration as the readout writes it."""
    number, unit = text.split()
    return float(number.replace(",", "")) * {"s": 1, "ms": 1e-3, "µs": 1e-6, "ns": 1e-9}[unit]


def _markers(figure):
    return {t.name: t for t in figure.data if t.mode == "markers"}


def test_worked_example_appears():
    widget = ReloadOrRecomputeExplorer(tier=CPU_DRAM, model="Llama-3.1-8B", gpu="H100-80GB", tokens=10_100)
    assert widget.tflops.value == 500.0 and not widget.include_attention.value
    text = widget.readout.value
    assert "1.32 GB" in text and "26.5 ms" in text and "324 ms" in text and "reload wins, 12.2x" in text
    tier = get_tier(CPU_DRAM)
    assert reload_time(L8, 10_100, tier) == pytest.approx(0.0265, abs=5e-4)
    assert recompute_time(L8, 10_100, H100, flops=500e12) == pytest.approx(0.324, abs=5e-3)


def test_readout_matches_the_cost_model():
    widget = ReloadOrRecomputeExplorer(tier=LOCAL_NVME, tokens=32_000, include_attention=True)
    tier = get_tier(LOCAL_NVME)
    text = widget.readout.value
    kv = float(re.search(r"<b>([\d.]+) GB</b> of KV", text).group(1))
    assert kv == pytest.approx(reload_bytes(L8, 32_000) / GB, abs=0.005)
    reload_s = _seconds(re.search(r"Reload from [^:]+: <b>([^<]+)</b>", text).group(1))
    assert reload_s == pytest.approx(reload_time(L8, 32_000, tier), rel=0.005)
    recompute_s = _seconds(re.search(r"TFLOP/s: <b>([^<]+)</b>", text).group(1))
    assert recompute_s == pytest.approx(recompute_time(L8, 32_000, H100, 500e12, include_attention=True), rel=0.005)


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
    assert "tokens" in figure.layout.xaxis.title.text and "time" in figure.layout.yaxis.title.text


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


def test_labels_have_room_and_time_ticks_carry_their_unit():
    """'prompt length (tok…' was cut off, and a y tick read '100µ'."""
    widget = ReloadOrRecomputeExplorer()
    width_em = float(widget.tokens.style.description_width.removesuffix("em"))
    assert width_em >= 0.55 * len(widget.tokens.description)  # about half an em a character, with room
    assert widget.tokens.label == "10,100"
    ticks = list(widget.pane.figure.layout.yaxis.ticktext)
    assert ticks and all(re.fullmatch(r"[\d,.]+ (ns|µs|ms|s)", t) for t in ticks), ticks


def test_a_flop_rate_too_low_for_a_weight_read_floor_says_so():
    """At 1 TFLOP/s (what typing 0 clamps to) even one token's FLOPs outlast the weight read: the note
    said 'below about 0 tokens'."""
    widget = ReloadOrRecomputeExplorer(tflops=1.0)
    assert weight_read_bound_below(L8, H100, 1e12) < 1
    assert "about 0 tokens" not in widget.floor.value and "none at this FLOP/s" in widget.floor.value


@pytest.mark.parametrize("gpu", ["L4-24GB", "A100-80GB"])
def test_the_cpu_tier_rides_the_gpus_own_pcie(gpu):
    """L4 and A100 are PCIe Gen4 cards: the CPU tier is named Gen4 and moves half of Gen5's bytes a second."""
    widget = ReloadOrRecomputeExplorer(tier=CPU_DRAM, gpu=gpu, tokens=10_100)
    assert "Reload from CPU DRAM (PCIe Gen4, DMA)" in widget.readout.value and "Gen5" not in widget.readout.value
    on_gen4 = tier_on_gpu(get_tier(CPU_DRAM), get_gpu(gpu))
    assert on_gen4.bandwidth == get_tier(CPU_DRAM).bandwidth / 2
    assert _seconds(re.search(r"Reload from [^:]+: <b>([^<]+)</b>", widget.readout.value).group(1)) == \
        pytest.approx(reload_time(L8, 10_100, on_gen4), rel=0.005)
    widget.gpu.value = "H100-80GB"
    assert "Reload from CPU DRAM (PCIe Gen5, DMA)" in widget.readout.value
    assert all("Gen5" not in label for label, _ in widget.tier.options)  # the menu names no generation
