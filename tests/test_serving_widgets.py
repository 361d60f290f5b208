"""Module 04's calculators show perf/serving.py's working, starting from the course's worked examples."""

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
