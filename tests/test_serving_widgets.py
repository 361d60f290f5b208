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
