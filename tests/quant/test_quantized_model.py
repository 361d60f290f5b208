"""Quantized tiny-llama: logits close to the float model's, the bytes it saves, and the engine unchanged.

Measured on this text (415 positions), float32, CPU, against the float32 model's logits:

    scheme                     max |dlogit|  mean |dlogit|  top-1 agreement  replaced bytes
    int8 (per channel)            0.110         0.0079          0.998          x3.93
    w8a8 (per-token acts)         0.245         0.0258          0.983          x3.93
    int4 g128 sym (pad_k=True)    1.531         0.1394          0.930          x6.02
    int4 g64 sym                  2.109         0.1494          0.937          x7.11
    int4 g32 sym                  1.235         0.1276          0.940          x6.40
    int4 g32 asym                 1.372         0.1138          0.969          x6.10

The thresholds below leave margin over those figures; they are deterministic (fixed weights, fixed text).
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_lib.engine.llm import LLM
from course_lib.engine.sampling_params import SamplingParams
from course_lib.models.generate import greedy_reference
from course_lib.models.loader import load_model
from course_lib.models.tokenizer import ByteTokenizer
from course_lib.quant.int4 import dequantize_int4, quantize_int4
from course_lib.quant.int8 import int_mm_runs_on
from course_lib.quant.linear import DECODER_LINEARS, QuantizedLinear, quantize_model_

TEXT = ('def read_config(path: str) -> dict:\n    """Return the settings stored in the JSON file at *path*.\n\n'
        '    Raises FileNotFoundError if the file does not exist.\n    """\n    with open(path, encoding="utf-8") as f:\n'
        '        return json.load(f)\n\n'
        'The list.sort() method sorts the list in place, using only < comparisons between items. '
        'Exceptions are not suppressed: if any comparison fails, the entire sort operation fails.\n')


def fresh_model():
    model, _ = load_model("tiny-llama", dtype=torch.float32, device="cpu")
    return model.eval()


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    tokens = ByteTokenizer().encode(TEXT)
    assert len(tokens) > 400
    return torch.tensor([tokens])


@pytest.fixture(scope="module")
def float_logits(ids) -> torch.Tensor:
    with torch.inference_mode():
        return fresh_model().forward_dense(ids)[0]


def logit_error(scheme, ids, float_logits, **options):
    model = fresh_model()
    summary = quantize_model_(model, scheme, **options)
    with torch.inference_mode():
        logits = model.forward_dense(ids)[0]
    diff = (logits - float_logits).abs()
    top1 = float((logits.argmax(-1) == float_logits.argmax(-1)).float().mean())
    return float(diff.max()), float(diff.mean()), top1, summary, model


def test_int8_logits_close(ids, float_logits):
    worst, mean, top1, _, _ = logit_error("int8", ids, float_logits)
    assert worst < 0.3 and mean < 0.02 and top1 >= 0.99, (worst, mean, top1)


def test_w8a8_logits_close(ids, float_logits):
    worst, mean, top1, _, model = logit_error("w8a8", ids, float_logits)
    assert worst < 0.6 and mean < 0.05 and top1 >= 0.97, (worst, mean, top1)
    expected = "torch._int_mm" if int_mm_runs_on("cpu") else "emulated int32"
    assert model.model.layers[0].self_attn.q_proj.last_path == expected


def test_int4_logits_close_and_smaller_groups_better(ids, float_logits):
    g128 = logit_error("int4", ids, float_logits, group_size=128, pad_k=True)
    g32 = logit_error("int4", ids, float_logits, group_size=32)
    g32_asym = logit_error("int4", ids, float_logits, group_size=32, symmetric=False)
    for worst, mean, top1, _, _ in (g128, g32, g32_asym):
        assert worst < 3.0 and mean < 0.25 and top1 >= 0.9, (worst, mean, top1)
    assert g32[1] < g128[1]  # mean logit error
    assert g32_asym[1] < g32[1] and g32_asym[2] > g32[2]
    int8 = logit_error("int8", ids, float_logits)
    assert int8[1] < g32[1] / 5  # int8 is far closer than any int4


def test_int4_weight_error_falls_with_group_size():
    weight = fresh_model().model.layers[0].mlp.down_proj.weight.detach()  # K = 512
    errors = [float((weight - dequantize_int4(quantize_int4(weight, g))).pow(2).mean()) for g in (32, 64, 128)]
    assert errors[0] < errors[1] < errors[2], errors


def test_summary_counts_bytes():
    model = fresh_model()
    config = model.config
    shapes = [(config.hidden_size, config.hidden_size)] + [(config.num_key_value_heads * config.head_dim,
                                                            config.hidden_size)] * 2
    shapes += [(config.hidden_size, config.hidden_size), (config.intermediate_size, config.hidden_size)]
    shapes += [(config.intermediate_size, config.hidden_size), (config.hidden_size, config.intermediate_size)]
    per_layer = sum(n * k for n, k in shapes)
    elements = per_layer * config.num_hidden_layers
    lm_head = model.lm_head
    summary = quantize_model_(model, "int4", group_size=32)
    assert summary["num_layers_replaced"] == 7 * config.num_hidden_layers
    assert summary["layers_replaced"][0] == "model.layers.0.self_attn.q_proj"
    assert summary["bytes_before"] == 4 * elements
    assert summary["bytes_after"] == elements // 2 + 4 * elements // 32  # packed nibbles + float32 scales
    assert summary["bytes_after"] / summary["bytes_before"] == pytest.approx(1 / 8 + 1 / 32)
    assert summary["model_bytes_after"] == summary["model_bytes_before"] - summary["bytes_before"] + summary["bytes_after"]
    assert model.lm_head is lm_head and isinstance(model.model.embed_tokens, nn.Embedding)  # kept
    assert summary["kept_full_precision"] == ["model.embed_tokens", "lm_head"]
    for layer in model.model.layers:
        for name in DECODER_LINEARS:
            module = getattr(layer.self_attn, name, None) or getattr(layer.mlp, name)
            assert isinstance(module, QuantizedLinear) and module.scheme == "int4"
    assert not any(type(m) is nn.Linear for m in model.model.layers.modules())

    int8 = quantize_model_(fresh_model(), "int8")
    rows = sum(n for n, _ in shapes) * config.num_hidden_layers
    assert int8["bytes_after"] == elements + 4 * rows

    asym = quantize_model_(fresh_model(), "int4", group_size=64, symmetric=False)
    assert asym["bytes_after"] == elements // 2 + 5 * elements // 64  # + a uint8 zero per group


def test_lm_head_optional():
    model = fresh_model()
    summary = quantize_model_(model, "int8", include_lm_head=True)
    assert summary["num_layers_replaced"] == 7 * model.config.num_hidden_layers + 1
    assert isinstance(model.lm_head, QuantizedLinear) and summary["kept_full_precision"] == ["model.embed_tokens"]


def test_group_size_that_does_not_divide_k_leaves_the_model_untouched():
    model = fresh_model()
    with pytest.raises(ValueError) as info:
        quantize_model_(model, "int4", group_size=128)
    message = str(info.value)
    assert "model.layers.0.self_attn.q_proj (K=192)" in message and "G=128" in message and "pad_k=True" in message
    assert "down_proj" not in message  # K = 512 is fine
    assert not any(isinstance(m, QuantizedLinear) for m in model.modules())
    with pytest.raises(ValueError, match="scheme"):
        quantize_model_(model, "int3")


@pytest.mark.parametrize("scheme,options", [("int8", {}), ("int4", {"group_size": 64}),
                                            ("int4", {"group_size": 32, "symmetric": False}), ("w8a8", {})])
def test_quantized_linear_matches_its_dequantized_weight(scheme, options):
    torch.manual_seed(0)
    linear = nn.Linear(192, 48, bias=True)
    layer = QuantizedLinear(linear, scheme, **options)
    x = torch.randn(3, 7, 192)
    y = layer(x)
    assert y.shape == (3, 7, 48) and y.dtype == torch.float32
    ref = F.linear(x, layer.dequantized_weight(), linear.bias)
    if scheme == "w8a8":
        assert torch.allclose(y, ref, atol=0.05)  # activations are quantized too
    else:
        assert torch.equal(y, ref) and layer.last_path == "dequantize + F.linear"
    close_to_float = {"int8": 0.02, "w8a8": 0.05, "int4": 0.3}[scheme]  # 4 bits: ~16x int8's step
    assert torch.allclose(y, linear(x), atol=close_to_float), float((y - linear(x)).abs().max())
    assert layer(x.to(torch.bfloat16)).dtype == torch.bfloat16
    assert set(layer.state_dict()) >= {"scales", "bias"}


def test_quantized_linear_pad_k_is_a_shorter_last_group():
    torch.manual_seed(1)
    linear = nn.Linear(192, 16, bias=False)
    layer = QuantizedLinear(linear, "int4", group_size=128, pad_k=True)
    assert layer.quantized.shape == (16, 256) and layer.dequantized_weight().shape == (16, 192)
    w = linear.weight.detach()
    first = dequantize_int4(quantize_int4(w[:, :128].contiguous(), 128))
    last = dequantize_int4(quantize_int4(w[:, 128:].contiguous(), 64))
    assert torch.equal(layer.dequantized_weight(), torch.cat([first, last], dim=1))
    with pytest.raises(ValueError, match="K=192"):
        QuantizedLinear(linear, "int4", group_size=128)


@pytest.mark.parametrize("scheme,options", [("int8", {}), ("int4", {"group_size": 32}),
                                            ("int4", {"group_size": 128, "pad_k": True}), ("w8a8", {})])
def test_engine_generates_what_forward_dense_does(scheme, options):
    model = fresh_model()
    quantize_model_(model, scheme, **options)
    tokenizer = ByteTokenizer()
    prompts = [tokenizer.encode(p) for p in ("def add(a, b):\n    return", "The list.sort() method",
                                             "import json\n", "Raises ValueError if")]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    llm = LLM(model, device="cpu", dtype=torch.float32, max_num_seqs=4, max_model_len=128, block_size=16,
              num_gpu_blocks=32)
    outputs = llm.generate(prompts, params)
    for prompt, output in zip(prompts, outputs):
        assert output.outputs[0].token_ids == greedy_reference(model, prompt, 12), scheme
