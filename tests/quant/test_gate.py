"""The module 09 accuracy gate: its metrics on a tiny random model and on a model against itself, a
broken scheme failing (and the exit status), the JSON, and breakdowns that add up.

Measured by the default run (``python -m course_lib.quant.gate``: 90 windows of 512 tokens = 46,080
held-out tokens, 32 greedy continuations of 32 tokens, 48 code lines of which the baseline balances 18;
float32, 2-core CPU, ~42 s wall for the four weight schemes; kv-fp8 costs the CPU time of one more
scheme, ~8 s, its e4m3 rounding no measurable extra); d = bits/byte increase over the float32 model
(2.0590 overall):

    scheme      d overall  d 0-63   d 64-255  d 256-511  d statements  d expressions  d types  agree  ident  struct
    int8         +0.0010   -0.0000  +0.0000   +0.0019    +0.0013       +0.0015        +0.0009  0.917  0.906  1.000
    int4-g32     +0.0111   +0.0038  +0.0074   +0.0156    +0.0097       +0.0115        +0.0112  0.623  0.375  0.944
    int4-g128    +0.0139   +0.0092  +0.0087   +0.0189    +0.0129       +0.0003        +0.0143  0.577  0.375  0.944
    w8a8         +0.0013   +0.0000  +0.0001   +0.0024    +0.0015       +0.0018        +0.0012  0.861  0.781  1.000
    kv-fp8       +0.0024   +0.0012  +0.0018   +0.0032    +0.0046       +0.0033        +0.0021  0.739  0.594  1.000

All five PASS the default thresholds (0.05 / 0.1 / 0.1 bits/byte, agreement >= 0.5, structure kept >= 0.8).
kv-fp8 (K and V through e4m3, weights untouched) costs more than int8 weights and far less than int4,
most in the long-context bucket, where each query reads the most rounded keys.
"""

import copy
import json
import math

import pytest
import torch
from torch import nn

from course_lib.models.cached_greedy import DenseKVCache, greedy_batch
from course_lib.models.corpus import corpus
from course_lib.models.generate import greedy_reference
from course_lib.quant import gate
from course_lib.quant.kv_fp8 import calibrate_kv_scales

QUICK = dict(windows=3, window=320, continuations=4, code_lines=4)


@pytest.fixture(scope="module")
def data():
    return gate.held_out()


def zero_decoder_weights(model):
    with torch.no_grad():
        for layer in model.model.layers:
            for module in layer.modules():
                if isinstance(module, nn.Linear):
                    module.weight.zero_()


def test_held_out_is_the_corpus_tail_with_a_section_per_token(data):
    assert torch.equal(data.tokens, corpus()[1])
    assert data.sections.shape == data.tokens.shape
    assert set(data.sections.unique().tolist()) <= set(range(len(gate.SECTIONS)))
    assert data.topics == sorted(data.topics) and data.topics[-1] == "yield"
    # the label of a held-out token is the section of the topic it came from
    assert gate.SECTIONS[int(data.sections[-1])] == gate.section_of("yield") == "statements"


def test_section_rule():
    assert gate.section_of("while") == gate.section_of("with") == "statements"
    assert gate.section_of("unary") == gate.section_of("calls") == "expressions"
    assert gate.section_of("typesseq-mutable") == gate.section_of("bltin-null-object") == "types"
    assert gate.section_of("specialnames") == "types"
    assert gate.section_of("debugger") == gate.section_of("identifiers") == "other"


@pytest.mark.parametrize("text, ok", [
    ("d = {'a': [1, (2, 3)]}", True), ("print('(')", True), ('s = "it\\"s"', True), ("'''x'''", True),
    ("f(1, 2", False), ("x = [1, 2)", False), ("'abc", False), ("a)", False), ("", True),
])
def test_balanced(text, ok):
    assert gate.balanced(text) is ok


def test_metrics_on_a_tiny_random_model_and_against_itself(tiny, data, monkeypatch):
    monkeypatch.setitem(gate.CUSTOM_SCHEMES, "identity", lambda model: None)
    result = gate.evaluate(tiny, ["identity"], data, **QUICK)
    base = result.baseline["bits_per_byte"]
    # untrained: about log2(258) = 8 bits/byte, nowhere near the trained model's ~2
    assert 6 < base["bits_per_byte"] < 10 and base["tokens"] == 3 * 320
    (same,) = result.schemes
    assert same.delta["overall"] == 0 and all(v in (0, None) for v in same.delta["buckets"].values())
    assert all(v in (0, None) for v in same.delta["sections"].values())
    assert same.greedy == {"agreement": 1.0, "identical": 1.0, "continuations": 4}
    assert same.structure["kept_fraction"] == 1.0 and same.structure["lines"] == 4
    assert same.passed and result.passed


def test_breakdowns_sum_to_the_overall(tiny, data):
    result = gate.evaluate(tiny, [], data, **QUICK)
    bpb = result.baseline["bits_per_byte"]
    assert list(bpb["buckets"]) == ["0-63", "64-255", "256-511"]
    for part in ("buckets", "sections"):
        groups = [g for g in bpb[part].values() if g["tokens"]]
        assert sum(g["tokens"] for g in bpb[part].values()) == bpb["tokens"]
        mean = sum(g["bits_per_byte"] * g["tokens"] for g in groups) / bpb["tokens"]
        assert mean == pytest.approx(bpb["bits_per_byte"], rel=1e-5)
    assert bpb["buckets"]["256-511"]["tokens"] == 3 * (320 - 256)


def test_agreement_counts_positions_before_the_first_difference():
    base = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4]])
    other = torch.tensor([[1, 2, 9, 4], [1, 2, 3, 4]])
    assert gate.agreement(base, other) == {"agreement": (0.5 + 1) / 2, "identical": 0.5, "continuations": 2}


@pytest.mark.parametrize("scheme", [None, "w8a8", gate.KV_FP8])
def test_batched_greedy_with_a_kv_cache_is_greedy_reference(tiny, data, scheme):
    """The gate's cached greedy equals the cache-free reference row by row, also with per-token
    activation quantization (w8a8) and with K/V rounded through fp8 on write (kv-fp8)."""
    model = tiny if scheme is None else copy.deepcopy(tiny)
    if scheme is not None:
        gate.prepare(model, scheme)
    prompts = gate.continuation_prompts(data, 3)
    batched = greedy_batch(model, prompts, 8)
    for prompt, row in zip(prompts.tolist(), batched.tolist()):
        assert greedy_reference(model, prompt, 8) == row


@pytest.mark.parametrize("kv_scales", [None, (0.01, 0.02)])
def test_dense_kv_cache_attends_like_forward_dense_in_chunks(tiny, data, kv_scales):
    """Prompt, then a 3-token chunk, then single tokens: the last logits of each call equal
    forward_dense over the whole prefix (the chunk's causal mask is offset by what is cached)."""
    model = copy.deepcopy(tiny)
    for layer in model.model.layers:
        layer.self_attn.kv_scales = kv_scales
    tokens = gate.continuation_prompts(data, 2)[:, :14]
    attn = model.model.layers[0].self_attn
    caches = [torch.zeros(2, 2, 14, attn.num_kv_heads, attn.head_dim) for _ in model.model.layers]
    start = 0
    with torch.inference_mode():
        for width in (8, 3, 1, 1, 1):
            chunk = tokens[:, start:start + width]
            positions = torch.arange(start, start + width).repeat(2)
            every = torch.arange(2 * width)
            got = model.forward(chunk.flatten(), positions, caches, DenseKVCache(2, start, width), every)
            want = model.forward_dense(tokens[:, :start + width])[:, start:]
            torch.testing.assert_close(got, want.flatten(0, 1), rtol=1e-4, atol=1e-4)
            start += width


def test_code_prompts_end_inside_a_code_line(data):
    prompts, heads = gate.code_prompts(data)
    assert len(prompts) == len(heads) > 20 and prompts.shape[1] == gate.CODE_CONTEXT
    for prompt, head in zip(prompts.tolist(), heads):
        text = bytes(t for t in prompt if t < 256).decode("utf-8", "replace")
        assert text.endswith(">>> " + head)
        assert head == "" or head[-1] in "([{'\""


def test_a_broken_scheme_fails(tiny, data, monkeypatch):
    monkeypatch.setitem(gate.CUSTOM_SCHEMES, "zeroed", zero_decoder_weights)
    result = gate.evaluate(tiny, ["zeroed"], data, **QUICK, thresholds={"max_bpb_increase": -1.0})
    (broken,) = result.schemes
    assert not broken.passed and not result.passed
    assert broken.checks["bpb_overall"]["passed"] is False
    assert sum(tiny.model.layers[0].self_attn.q_proj.weight.abs().flatten()) > 0  # baseline untouched


def test_unknown_scheme_is_refused(tiny):
    with pytest.raises(ValueError, match="unknown scheme"):
        gate.prepare(tiny, "int3")


def test_command_line_exit_status_and_json(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(gate.CUSTOM_SCHEMES, "zeroed", zero_decoder_weights)
    path = tmp_path / "gate.json"
    code = gate.main(["--schemes", "int8", "zeroed", "--quick", "--json", str(path)])
    out = capsys.readouterr().out
    assert code == 1
    assert "baseline:" in out and "int8: PASS" in out and "zeroed: FAIL" in out and "thresholds:" in out
    report = json.loads(path.read_text())
    assert report["passed"] is False and set(report["thresholds"]) == set(gate.DEFAULT_THRESHOLDS)
    int8, zeroed = report["schemes"]
    assert int8["scheme"] == "int8" and int8["passed"] and zeroed["passed"] is False
    for scheme in (int8, zeroed):
        assert set(scheme) >= {"bits_per_byte", "delta", "greedy", "structure", "checks", "passed", "seconds"}
        assert set(scheme["checks"]) == {"bpb_overall", "bpb_buckets", "bpb_sections", "agreement", "structure_kept"}
        assert math.isfinite(scheme["bits_per_byte"]["bits_per_byte"])
    assert zeroed["delta"]["overall"] > 1 and int8["delta"]["overall"] < 0.05
    assert report["settings"]["windows"] == 4 and report["baseline"]["bits_per_byte"]["tokens"] == 4 * gate.WINDOW


def test_int4_fails_an_absurd_threshold():
    assert gate.main(["--schemes", "int4-g32", "--quick", "--max-bpb-increase", "0"]) == 1


def test_kv_fp8_rounds_k_and_v_with_the_engines_scale_rule(tiny, data):
    model = copy.deepcopy(tiny)
    summary = gate.prepare(model, gate.KV_FP8)
    assert summary["scheme"] == "kv-fp8" and len(summary["kv_scales"]) == 2
    assert [layer.self_attn.kv_scales for layer in model.model.layers] == summary["kv_scales"]
    assert summary["kv_scales"] == calibrate_kv_scales(tiny, corpus()[0])  # training-corpus windows, amax / 200 and / 100
    assert all(layer.self_attn.kv_scales is None for layer in tiny.model.layers)
    result = gate.evaluate(tiny, [gate.KV_FP8], data, **QUICK)
    (kv,) = result.schemes
    assert 0 < abs(kv.delta["overall"]) < 0.05 and kv.passed  # rounded, and close


def test_the_unknown_scheme_message_names_kv_fp8(tiny):
    with pytest.raises(ValueError, match="kv-fp8"):
        gate.prepare(tiny, "kv-fp4")
