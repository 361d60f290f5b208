"""Module 04's calculators show perf/serving.py's working, starting from the course's worked examples."""

import re
import time

from course_lib.widgets.serving_calculators import KVTransferCalculator, PDRatioCalculator, expected_tokens_figure


def test_the_pd_calculator_starts_on_the_worked_example():
    calc = PDRatioCalculator()
    text = calc.readout.value
    assert "6,400 tokens/s" in text and "12.8 requests/s" in text and "1.28 prefill instances" in text
    assert "13 prefill instances" in text  # for 10 decode instances
    calc.tpot_ms.value = 20
    assert "12,800 tokens/s" in calc.readout.value and calc.ratio.prefill_per_decode == 2.56


def test_the_kv_calculator_starts_on_the_worked_example_and_pipelining_hides_all_but_a_layer():
    calc = KVTransferCalculator()
    assert "3.28 GB" in calc.readout.value
    assert "65.5 ms" in calc.readout.value
    whole = calc.transfer.exposed_s
    calc.pipelined.value = True
    assert abs(calc.transfer.exposed_s - whole / 80) < 1e-12 and "last of 80 layers" in calc.readout.value


def test_the_expected_tokens_curve_has_the_quiz_point():
    fig = expected_tokens_figure()
    line = next(trace for trace in fig.data if trace.name == "a = 0.8")
    assert abs(line.y[4] - 3.3616) < 1e-9 and line.y[0] == 1.0
    assert fig.layout.xaxis.title.text and fig.layout.yaxis.title.text and fig.layout.title.text


def test_the_calculators_read_out_plain_numbers_at_their_extremes():
    """No e-notation ('4.1e+03 requests/s', '1.68e+03 ms') at the sliders' far ends."""
    calc = PDRatioCalculator()
    calc.num_seqs.value, calc.tpot_ms.value, calc.output_len.value = 1024, 5, 50
    assert "204,800 tokens/s" in calc.readout.value and "4,096 requests/s" in calc.readout.value
    assert "4,096 prefill instances" in calc.readout.value  # for 10 decode instances
    kv = KVTransferCalculator()
    kv.tokens.value, kv.link.value = 128_000, "InfiniBand HDR 200 Gb/s (across nodes)"
    assert "41.9 GB" in kv.readout.value and "takes 1,678 ms" in kv.readout.value
    for text in (calc.readout.value, kv.readout.value):
        assert not re.search(r"\de[+-]?\d", text), text


def test_every_calculator_control_answers_within_a_second():
    pd, kv = PDRatioCalculator(), KVTransferCalculator()
    for control, value in ((pd.num_seqs, 512), (pd.tpot_ms, 20), (pd.output_len, 1000), (pd.prefill, 20),
                           (kv.model, "Llama-3.1-8B"), (kv.tokens, 64_000), (kv.link, "PCIe Gen5 x16"),
                           (kv.pipelined, True)):
        started = time.perf_counter()
        control.value = value
        assert time.perf_counter() - started < 1.0, f"{control.description} took over a second"


def test_the_kv_calculator_stops_at_the_models_context_and_names_one_unit():
    """Llama-2-7B reads 4,096 tokens and Falcon-7B 2,048: the slider once allowed 128,000 for both,
    and the readout printed '1.05 GB (1000.0 MiB)', two units for one size."""
    calc = KVTransferCalculator()
    calc.tokens.value = 128_000
    for model, context in (("Llama-2-7B", 4096), ("Falcon-7B", 2048), ("Llama-3.1-8B", 131_072)):
        calc.model.value = model
        assert calc.tokens.max == context and calc.tokens.value <= context
        assert f"longest context, {context:,} tokens" in calc.readout.value
    assert "MiB" not in calc.readout.value and "<b>268 MB</b>" in calc.readout.value  # 2,048 x 128 KiB
    assert calc.tokens.readout_format == ",d"


def test_the_checkbox_labels_are_not_cut():
    from course_lib.widgets.serving_simulations import DisaggregationExplorer

    for box in (KVTransferCalculator().pipelined, DisaggregationExplorer(document_tokens=2000).pipelined):
        assert box.indent is False and box.layout.width == "auto", box.description


def test_the_pd_calculator_starts_where_it_is_told_to_and_says_one_request():
    """The lesson starts it on the roofline's TPOT (19.3 ms) and prefill rate (14.4 requests/s): the
    sliders must hold such values, not snap them to whole milliseconds or half requests."""
    calc = PDRatioCalculator(tpot_ms=19.34, prefill_requests_per_s=14.37)
    assert (calc.tpot_ms.step, calc.prefill.step) == (0.1, 0.1)
    assert "/ 19.3 ms" in calc.readout.value and "serves 14.4 requests/s" in calc.readout.value
    calc.prefill.value = 1
    assert "serves 1 request/s" in calc.readout.value and "1 requests/s" not in calc.readout.value
