"""The int4 ``QuantizedLinear``'s two matmul paths: the Triton W4A16 kernel (on a CPU under
TRITON_INTERPRET=1, the root conftest's default) equals PyTorch's dequantize + F.linear at the
tiny model's shapes, padded K included; "auto" keeps PyTorch on a CPU; the summary and
``last_path`` say which ran; a kernel that cannot run is refused with what to change."""

import pytest
import torch
from torch import nn

from course_lib.engine.backend import triton_interprets
from course_lib.models.llama import LlamaConfig, LlamaForCausalLM
from course_lib.quant.linear import INT4_TRITON, TORCH_PATH, QuantizedLinear, quantize_model_, set_int4_kernel_

needs_kernels = pytest.mark.skipif(not torch.cuda.is_available() and not triton_interprets(),
                                   reason="the Triton kernel needs a GPU or TRITON_INTERPRET=1")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# tiny-llama's linears: K = 192 (q/k/v/gate/up, padded to 256 at G=128) and K = 512 (down)
SHAPES = [(192, 64, 128, True, True), (512, 192, 128, True, False), (192, 512, 32, False, False)]


@needs_kernels
@pytest.mark.parametrize("k, n, group_size, symmetric, pad_k", SHAPES)
def test_the_kernel_path_equals_the_pytorch_path(k, n, group_size, symmetric, pad_k):
    torch.manual_seed(0)
    linear = nn.Linear(k, n, bias=True)
    layer = QuantizedLinear(linear, "int4", group_size=group_size, symmetric=symmetric, pad_k=pad_k).to(DEVICE)
    x = torch.randn(2, 3, k, device=DEVICE)
    layer.kernel = "torch"
    want = layer(x)
    assert layer.last_path == TORCH_PATH == "dequantize + F.linear"
    layer.kernel = "triton"
    got = layer(x)
    assert layer.last_path == INT4_TRITON == "triton w4a16"
    assert got.shape == want.shape == (2, 3, n) and got.dtype == torch.float32
    # the same fp32 sum in another order: within K * 2^-23 of the magnitude (tests/kernels/test_w4a16.py)
    bound = k * 2 ** -23 * (x.abs() @ layer.dequantized_weight().abs().T.to(DEVICE)) + 1e-6
    assert ((got - want).abs() <= bound).all()


@needs_kernels
def test_a_quantized_tiny_model_gives_the_same_logits_on_both_paths():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=1)).eval()  # tiny-llama's widths, one layer
    summary = quantize_model_(model, "int4", group_size=128, pad_k=True)
    assert summary["matmul"] == TORCH_PATH and summary["options"]["kernel"] == "auto"
    ids = torch.randint(0, 256, (1, 5))
    with torch.inference_mode():
        want = model.forward_dense(ids)
        assert set_int4_kernel_(model, "triton") == 7
        got = model.forward_dense(ids)
    assert model.model.layers[0].mlp.down_proj.last_path == INT4_TRITON
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)


def test_auto_keeps_pytorch_on_a_cpu_and_bad_kernels_are_refused(monkeypatch):
    layer = QuantizedLinear(nn.Linear(64, 32), "int4", group_size=32)
    layer(torch.randn(2, 64))
    assert layer.kernel == "auto" and layer.last_path == TORCH_PATH
    layer(torch.randn(2, 64, dtype=torch.float64))  # a dtype the kernel does not take: PyTorch
    assert layer.last_path == TORCH_PATH
    with pytest.raises(ValueError, match=r"kernel must be one of \('auto', 'triton', 'torch'\)"):
        QuantizedLinear(nn.Linear(64, 32), "int4", group_size=32, kernel="cuda")
    layer.kernel = "triton"
    with pytest.raises(ValueError, match='float16, bfloat16 or float32 inputs.*kernel="auto" or "torch"'):
        layer(torch.randn(2, 64, dtype=torch.float64))
    import triton

    monkeypatch.setattr(triton.knobs.runtime, "interpret", False)
    with pytest.raises(ValueError, match='needs TRITON_INTERPRET=1.*use kernel="auto" or "torch"'):
        layer(torch.randn(2, 64))
