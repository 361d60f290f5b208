"""The gate chart draws the gate result's own deltas: one bar per scheme and bucket / section, and
each breakdown's threshold as a line."""

import matplotlib
import pytest
import torch
from torch import nn

from course_lib.models.llama import LlamaConfig, LlamaForCausalLM
from course_lib.quant import gate
from course_lib.widgets.gate_chart import plot_gate_buckets

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def result():
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         intermediate_size=128)
    model = LlamaForCausalLM(config).eval()

    def halve_decoder_weights(m):
        with torch.no_grad():
            for module in m.model.layers.modules():
                if isinstance(module, nn.Linear):
                    module.weight.mul_(0.5)

    gate.CUSTOM_SCHEMES["halved"] = halve_decoder_weights
    try:
        return gate.evaluate(model, ["int8", "halved"], windows=3, window=320, continuations=2, code_lines=2)
    finally:
        del gate.CUSTOM_SCHEMES["halved"]


def test_bars_are_the_results_deltas_and_the_lines_its_thresholds(result):
    fig = plot_gate_buckets(result)
    by_bucket, by_section = fig.axes
    base = result.baseline["bits_per_byte"]
    buckets = list(base["buckets"])
    sections = [s for s in gate.SECTIONS if base["sections"][s]["tokens"]]
    heights = [p.get_height() for p in by_bucket.patches]
    expected = [s.delta["buckets"][b] for s in result.schemes for b in buckets]
    assert heights == pytest.approx(expected)
    heights = [p.get_height() for p in by_section.patches]
    assert heights == pytest.approx([s.delta["sections"][x] for s in result.schemes for x in sections])
    assert [t.get_text() for t in by_bucket.get_xticklabels()] == buckets
    limits = {line.get_ydata()[0] for line in by_bucket.lines} - {0}
    assert limits == {result.thresholds["max_bpb_increase_bucket"]}
    for ax in fig.axes:
        assert ax.get_title() and ax.get_xlabel() and "bits/byte" in ax.get_ylabel()


def test_an_empty_result_is_refused(result):
    empty = gate.GateResult(result.baseline, [], result.thresholds, result.settings, 0.0)
    with pytest.raises(ValueError, match="at least one scheme"):
        plot_gate_buckets(empty)


def test_a_limit_far_above_every_bar_is_named_not_drawn(result):
    only_int8 = gate.GateResult(result.baseline, [s for s in result.schemes if s.scheme == "int8"],
                                result.thresholds, result.settings, 0.0)
    by_bucket = plot_gate_buckets(only_int8).axes[0]
    tallest = max(abs(p.get_height()) for p in by_bucket.patches)
    assert {line.get_ydata()[0] for line in by_bucket.lines} == {0}  # the zero line only
    (note,) = by_bucket.texts
    assert "off the chart" in note.get_text() and by_bucket.get_ylim()[1] < result.thresholds["max_bpb_increase_bucket"]
    assert by_bucket.get_ylim()[1] >= tallest


def test_the_table_shows_every_scheme_its_numbers_and_verdict(result):
    from course_lib.widgets.gate_chart import gate_table_html

    page = gate_table_html(result)
    assert page.count("<tr>") == 1 + 1 + len(result.schemes)  # header, baseline, one per scheme
    for s in result.schemes:
        assert f">{s.scheme}<" in page and f"{s.delta['overall']:+.4f}" in page
        assert ("PASS" if s.passed else "FAIL (") in page
    halved = next(s for s in result.schemes if s.scheme == "halved")
    assert not halved.passed and "FAIL (bpb_overall" in page
    assert "white-space:nowrap" in page and "structure kept" in page and "fp32" in page
