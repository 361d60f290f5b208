"""The low-precision matmul paths: PyTorch's CPU weight-only int8 kernel, and W8A8's row/K/N padding
for CUDA's ``torch._int_mm``, each against its exact or dequantize reference on small shapes.

Batch size classes: 1 row (one decoding sequence), 16 rows (the largest count CUDA's ``_int_mm``
refuses), 17 rows (the smallest it takes), and K that the kernels' vector loads do not divide.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_lib.models.loader import load_model
from course_lib.quant.int8 import (
    EMULATED,
    INT8PACK,
    INT_MM,
    cuda_int_mm_shape,
    dequantize_int8,
    int8pack_fits,
    int8pack_matmul,
    int_mm_runs_on,
    pad_for_cuda_int_mm,
    quantize_int8,
)
from course_lib.quant.linear import TORCH_PATH, QuantizedLinear, quantize_model_, set_kernel_

ROWS = (1, 16, 17)


def int8_layer(k: int, n: int = 48, kernel: str = "auto", seed: int = 0) -> tuple[nn.Linear, QuantizedLinear]:
    torch.manual_seed(seed)
    linear = nn.Linear(k, n, bias=True)
    return linear, QuantizedLinear(linear, "int8", kernel=kernel)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("k", [64, 192])
def test_int8_on_cpu_bfloat16_runs_the_weight_only_kernel_and_matches_dequantize(rows, k):
    linear, layer = int8_layer(k)
    x = torch.randn(rows, k).to(torch.bfloat16)
    y = layer(x)
    assert layer.last_path == INT8PACK and y.dtype == torch.bfloat16 and y.shape == (rows, 48)
    reference = F.linear(x.float(), layer.dequantized_weight(), linear.bias.detach())
    # Tolerance: the kernel casts the scales to bfloat16 (relative error <= 2**-9 per weight) and
    # rounds its output to bfloat16 (<= 2**-9 of |y|); both are below 2**-8 of sum_k |x_k| |w_nk|.
    bound = 2**-8 * (x.float().abs() @ layer.dequantized_weight().abs().t()) + 2**-8 * linear.bias.detach().abs()
    assert bool(((y.float() - reference).abs() <= bound).all()), float((y.float() - reference).abs().max())


@pytest.mark.parametrize("rows", ROWS)
def test_int8_with_k_the_kernel_cannot_read_keeps_dequantize_exactly(rows):
    linear, layer = int8_layer(67)  # odd K: the kernel's 16-wide loads would read past each row
    x = torch.randn(rows, 67).to(torch.bfloat16)
    assert not int8pack_fits(x, 67)
    y = layer(x)
    assert layer.last_path == TORCH_PATH
    assert torch.equal(y, F.linear(x, layer.dequantized_weight(torch.bfloat16), linear.bias.to(torch.bfloat16)))


def test_int8_float32_keeps_dequantize_where_the_kernel_is_a_slow_scalar_loop():
    linear, layer = int8_layer(64)
    x = torch.randn(3, 5, 64)
    assert torch.equal(layer(x), F.linear(x, layer.dequantized_weight(), linear.bias))
    assert layer.last_path == TORCH_PATH


def test_int8_kernel_torch_forces_the_dequantize_reference():
    linear, layer = int8_layer(64, kernel="torch")
    x = torch.randn(2, 64).to(torch.bfloat16)
    y = layer(x)
    assert layer.last_path == TORCH_PATH
    assert torch.equal(y, F.linear(x, layer.dequantized_weight(torch.bfloat16), linear.bias.to(torch.bfloat16)))
    with pytest.raises(ValueError, match=r"\('auto', 'torch'\) for int8"):
        QuantizedLinear(linear, "int8", kernel="triton")


def test_the_kernel_takes_a_misaligned_view_and_refuses_what_it_cannot_run():
    q = quantize_int8(torch.randn(32, 64))
    flat = torch.randn(1 + 3 * 64).to(torch.bfloat16)
    x = flat[1:].view(3, 64)  # contiguous, but starting 2 bytes into an allocation
    assert x.data_ptr() % 64 != 0
    expected = F.linear(x.float(), dequantize_int8(q))
    assert torch.allclose(int8pack_matmul(x, q).float(), expected, rtol=2**-6, atol=2**-6 * float(expected.abs().max()))
    with pytest.raises(ValueError, match="bfloat16 inputs with K a multiple of 16"):
        int8pack_matmul(torch.randn(3, 64), q)


def test_the_model_summary_names_the_path_its_layers_take():
    bf16, _ = load_model("tiny-llama", dtype=torch.bfloat16, device="cpu")
    summary = quantize_model_(bf16, "int8")
    assert summary["matmul"] == INT8PACK and summary["options"]["kernel"] == "auto"
    with torch.inference_mode():
        bf16.forward_dense(torch.tensor([[1, 2, 3]]))
    assert {m.last_path for m in bf16.modules() if isinstance(m, QuantizedLinear)} == {INT8PACK}
    assert set_kernel_(bf16, "torch", "int8") == 42
    fp32, _ = load_model("tiny-llama", dtype=torch.float32, device="cpu")
    assert quantize_model_(fp32, "int8")["matmul"] == TORCH_PATH
    w8a8 = quantize_model_(load_model("tiny-llama", dtype=torch.float32, device="cpu")[0], "w8a8")
    assert w8a8["matmul"] == (INT_MM if int_mm_runs_on("cpu") else EMULATED)


@pytest.mark.parametrize("m,k,n", [(1, 64, 48), (16, 192, 512), (17, 192, 64), (3, 67, 45), (2, 7, 5)])
def test_cuda_padding_meets_int_mm_rules_and_keeps_the_exact_product(m, k, n):
    gen = torch.Generator().manual_seed(m * 1000 + k + n)
    a = torch.randint(-128, 128, (m, k), generator=gen, dtype=torch.int8)
    b = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8).t()  # column-major, as w8a8 passes it
    rows, inner, cols = cuda_int_mm_shape(m, k, n)
    padded_a, padded_b = pad_for_cuda_int_mm(a, b)
    assert rows > 16 and inner > 16 and inner % 8 == 0 and cols % 8 == 0
    assert padded_a.shape == (rows, inner) and padded_b.shape == (inner, cols)
    assert padded_a.dtype == padded_b.dtype == torch.int8  # never a float64 stand-in
    assert padded_a.is_contiguous() and padded_b.stride(0) == 1  # row-major times column-major
    product = torch._int_mm(padded_a, padded_b)[:m, :n]  # the CPU kernel stands in for cuBLAS here
    assert product.dtype == torch.int32 and torch.equal(product.long(), a.long() @ b.long())


def test_cuda_padding_is_the_smallest_that_fits():
    assert cuda_int_mm_shape(1, 192, 512) == (17, 192, 512)
    assert cuda_int_mm_shape(17, 192, 64) == (17, 192, 64)
    assert cuda_int_mm_shape(40, 67, 45) == (40, 72, 48)
    assert cuda_int_mm_shape(2, 8, 8) == (17, 24, 8)
