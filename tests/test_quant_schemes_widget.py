"""Module 09's scheme cards and chart: the numbers are quant_cost's, the winner is highlighted, FP8 is
refused on an A100, the crossover star sits at crossover_batch, and the controls redraw in place."""

import re

import pytest

from course_lib.perf.hardware import get_gpu
from course_lib.perf.kv import kv_bytes_per_batch
from course_lib.perf.models import get_model
from course_lib.perf.quant_cost import (
    SCHEMES,
    best_scheme,
    crossover_batch,
    decode_step_cost,
    max_batch_in_memory,
    min_gpus_for_batch,
    min_gpus_for_weights,
    weight_memory,
)
from course_lib.perf.units import GB, format_si
from course_lib.widgets.quant_schemes import (
    CHART_BATCHES,
    QuantSchemes,
    scheme_cards,
    scheme_figure,
)

H100, A100 = get_gpu("H100-80GB"), get_gpu("A100-80GB")
L70, L8 = get_model("Llama-3.1-70B"), get_model("Llama-3.1-8B")


def _number(pattern: str, text: str) -> float:
    match = re.search(pattern, text)
    assert match, f"{pattern!r} not in {text!r}"
    return float(match.group(1).replace(",", ""))


def _markers(figure):
    return {t.name: t for t in figure.data if t.mode == "markers"}


def test_cards_show_the_cost_models_numbers():
    widget = QuantSchemes("Llama-3.1-70B", "H100-80GB", batch=64, context_len=1024)
    for name in SCHEMES:
        text = widget.cards[name].value
        cost = decode_step_cost(L70, name, H100, 64, 1024)
        assert _number(r"weight memory: <b>([\d.]+) GB", text) == pytest.approx(weight_memory(L70, name) / GB, abs=0.05)
        assert _number(r"GPUs for the weights \(H100-80GB\): <b>(\d+)", text) == min_gpus_for_weights(L70, name, H100)
        assert _number(r"decode step at batch 64: <b>([\d.]+) ms", text) == pytest.approx(cost.time_s * 1e3, abs=0.005)
        assert _number(r"throughput: <b>([\d,]+) tokens/s", text) == pytest.approx(64 / cost.time_s, abs=0.5)
        assert ("bandwidth-bound" if cost.bound == "memory" else "compute-bound") in text
    assert "141.2 GB" in widget.cards["BF16"].value and "<b>2</b> (before any KV cache)" in widget.cards["BF16"].value
    assert "Marlin" in widget.cards["W4A16"].value and "twice BF16" in widget.cards["FP8-W8A8"].value


@pytest.mark.parametrize("batch", [1, 64, 512, 1024])
def test_the_winner_is_highlighted(batch):
    widget = QuantSchemes("Llama-3.1-70B", "H100-80GB", batch=batch)
    best = best_scheme(L70, H100, batch, 1024)
    assert widget.best == best
    for name, card in widget.cards.items():
        assert ("data-winner='true'" in card.value) == (name == best)
        assert ("★ fastest" in card.value) == (name == best)
    assert best == ("W4A16" if batch < crossover_batch(L70, H100, 1024) else "FP8-W8A8")


def test_fp8_unsupported_on_a100():
    widget = QuantSchemes("Llama-3.1-8B", "A100-80GB", batch=1024)
    fp8 = widget.cards["FP8-W8A8"].value
    assert "not supported on A100-80GB: no FP8 tensor cores" in fp8 and "ms" not in fp8
    assert widget.best != "FP8-W8A8" and "No crossover on A100-80GB" in widget.verdict.value
    names = [t.name for t in widget.pane.data if t.mode == "lines" and t.name in SCHEMES]
    assert names == ["BF16", "W4A16"] and not _markers(widget.pane)
    assert scheme_cards(L8, A100, 8)["schemes"]["FP8-W8A8"]["supported"] is False


def test_chart_curves_and_crossover_star_at_crossover_batch():
    figure = scheme_figure(L70, H100, 1024, batch=8)
    lines = {t.name: t for t in figure.data if t.name in SCHEMES}
    assert list(lines) == list(SCHEMES) and list(lines["W4A16"].x) == list(CHART_BATCHES)
    for name, trace in lines.items():
        assert list(trace.y) == pytest.approx([b / decode_step_cost(L70, name, H100, b, 1024).time_s
                                               for b in CHART_BATCHES])
    at = crossover_batch(L70, H100, 1024)
    (star,) = _markers(figure).values()
    assert star.x[0] == at == 160 and star.name == f"FP8 overtakes W4A16: batch {at}"
    assert star.y[0] == pytest.approx(at / decode_step_cost(L70, "FP8-W8A8", H100, at, 1024).time_s)
    assert figure.layout.xaxis.type == "log" and "batch" in figure.layout.xaxis.title.text
    assert "tokens/s" in figure.layout.yaxis.title.text and "Llama-3.1-70B" in figure.layout.title.text


def test_no_star_where_fp8_never_overtakes():
    assert crossover_batch(L8, H100, 4096) is None
    assert not _markers(scheme_figure(L8, H100, 4096))


def test_controls_redraw_in_place():
    widget = QuantSchemes()
    pane, verdict, cards = widget.pane, widget.verdict, dict(widget.cards)
    widget.batch.value = 1024
    assert widget.best == best_scheme(get_model(widget.model.value), get_gpu(widget.gpu.value), 1024, 1024)
    widget.context_len.value = 128
    widget.model.value = "Llama-3.1-8B"
    at = crossover_batch(L8, H100, 128)
    assert _markers(pane)[f"FP8 overtakes W4A16: batch {at}"].x[0] == at
    assert f"from batch {at}" in verdict.value and "Llama-3.1-8B" in pane.figure.layout.title.text
    widget.gpu.value = "A100-40GB"
    assert "not supported on A100-40GB" in cards["FP8-W8A8"].value
    assert widget.pane is pane and widget.verdict is verdict and widget.cards == cards
    assert widget.children[-1] is pane


def test_a_batch_whose_kv_does_not_fit_on_one_gpu_says_so():
    """Batch 1,024 at 1,024 tokens of the 70B: 344 GB of KV (perf/kv.py) fits beside no scheme's weights on one H100."""
    widget = QuantSchemes("Llama-3.1-70B", "H100-80GB", batch=1024, context_len=1024)
    kv = kv_bytes_per_batch(L70, 1024, 1024, "bf16")
    for name in SCHEMES:
        text = widget.cards[name].value
        assert f"<b>{format_si(kv, 'B')}</b>" in text and "does not fit" in text
        assert f"room for {max_batch_in_memory(L70, name, H100, 1024):,})" in text
        assert f"at least <b>{min_gpus_for_batch(L70, name, H100, 1024, 1024)}</b> GPUs" in text
    best = widget.best
    assert "Batch 1,024 does not fit on one H100-80GB" in widget.verdict.value
    assert f"at least {min_gpus_for_batch(L70, best, H100, 1024, 1024)} GPUs" in widget.verdict.value
    room = max_batch_in_memory(L70, "W4A16", H100, 1024)
    widget.batch.value = 64  # W4A16's winning batch fits: no warning, and its card says how much room is left
    assert room >= 64 and "does not fit" not in widget.verdict.value
    assert f"fits (room for {room:,} such sequences)" in widget.cards["W4A16"].value


def test_cards_give_the_checkpoint_size_with_16_bit_embeddings():
    widget = QuantSchemes("Llama-3.1-70B", "H100-80GB")
    shipped = weight_memory(L70, "W4A16", quantized_embeddings=False) / GB
    assert f"({shipped:.1f} GB as checkpoints ship it" in widget.cards["W4A16"].value and shipped > 39
    assert "as checkpoints ship it" not in widget.cards["BF16"].value  # nothing to keep in 16 bits


def test_a_card_counts_the_gpus_a_checkpoint_needs_as_it_ships():
    """FP8 Llama-3.1-70B on an L4: 70.6 GB fits three L4s only with its embeddings in FP8; as checkpoints ship it
    (72.7 GB, embeddings and lm_head in 16 bits) it needs four. The card said 3."""
    l4 = get_gpu("L4-24GB")
    card = QuantSchemes("Llama-3.1-70B", "L4-24GB", batch=1).cards["FP8-W8A8"].value
    modelled = min_gpus_for_weights(L70, "FP8-W8A8", l4)
    shipped = min_gpus_for_weights(L70, "FP8-W8A8", l4, quantized_embeddings=False)
    assert (modelled, shipped) == (3, 4)
    assert f"<b>{modelled}</b>, <b>{shipped}</b> as checkpoints ship it (before any KV cache)" in card
    bf16 = QuantSchemes("Llama-3.1-70B", "H100-80GB", batch=1).cards["BF16"].value
    assert "as checkpoints ship it" not in bf16  # nothing quantized: one size, one count


def test_counts_take_their_plural_and_crowded_log_ticks_are_labelled_in_one_style():
    widget = QuantSchemes("Llama-3.1-70B", "H100-80GB", batch=1, context_len=131072)
    assert "1 sequence of 131,072 tokens" in widget.verdict.value and "1 sequences" not in widget.verdict.value
    assert widget.context_len.label == "131,072"
    ticks = list(widget.pane.figure.layout.yaxis.ticktext)  # the curves span 15 to 65 tokens/s: under a decade
    assert 3 <= len(ticks) <= 8 and all(t.replace(",", "").isdigit() for t in ticks)
