"""The W4A16 kernel (int4 weights dequantized in registers, fp32 accumulation) against its PyTorch
reference (under TRITON_INTERPRET=1 on a CPU), its nibble order on hand-built codes, and its input
checks."""

import pytest
import torch

from course_lib.kernels.w4a16 import w4a16_constants, w4a16_matmul, w4a16_matmul_reference
from course_lib.quant.int4 import Int4Weight, dequantize_int4, pack_int4, quantize_int4, unpack_int4

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BF16_DOT = pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    DEVICE == "cpu", reason="Triton 3.9's interpreter multiplies bfloat16's raw bits in tl.dot (its create_dot "
    "converts only fp8 inputs), so the bf16 tensor-core path is checked on a GPU (./course gpu-report)"))
# Output rounding: both sides round an fp32 result once to x's dtype; where the two fp32 results
# differ a little they may round to neighbouring values, one ulp (relative) apart.
OUTPUT_ULP = {torch.float32: 2 ** -23, torch.float16: 2 ** -10, torch.bfloat16: 2 ** -7}


def tolerance(x: torch.Tensor, q: Int4Weight, want: torch.Tensor) -> torch.Tensor:
    """The largest difference allowed per output. Both sides compute the same sum of K products in
    fp32, in different orders (the kernel sums ``x * (u - zero)`` over a slice and scales it; the
    reference scales each weight, then sums): each is within ``K * 2^-24 * sum_k |x_k w_k|`` of the
    exact value (the usual bound for a K-term fp32 dot product), so they are within ``K * 2^-23``
    times it of each other. fp16/bf16 inputs: x is exact in fp32 and ``u - zero`` is an integer in
    -15..15, exact in every dtype, so the tensor-core products are exact and only the fp32 sums
    differ. fp32 inputs on a GPU go through "tf32x3", whose dropped low x low term is 0 here (the
    integers are exact in TF32) and whose remaining error, about 2^-22 per product, fits inside the
    same bound. Then one ulp of x's dtype for the final rounding."""
    k = q.shape[1]
    magnitude = x.abs().double() @ dequantize_int4(q, torch.float64).abs().T
    return k * 2 ** -23 * magnitude + OUTPUT_ULP[x.dtype] * want.double().abs() + 1e-30


def check(m, n, k, group_size, symmetric, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(n, k, generator=gen) * 0.05
    x = torch.randn(m, k, generator=gen).to(dtype).to(DEVICE)
    q = quantize_int4(weight.to(DEVICE), group_size, symmetric)
    got = w4a16_matmul(x, q)
    want = w4a16_matmul_reference(x, q)
    assert got.dtype == dtype and got.shape == (m, n)
    error = (got.double() - want.double()).abs()
    bound = tolerance(x, q, want)
    assert (error <= bound).all(), f"largest error {error.max().item():.3g}, worst error / bound " \
                                   f"{(error / bound).max().item():.3g}"


CASES = [  # M = 1, 3, 16 (one tile of 16 rows, masked); N = 32 (one tile) or 48 (a second, masked)
    (1, 32, 64, 32), (3, 48, 128, 64), (16, 32, 256, 128), (16, 48, 256, 32),
    (3, 32, 128, 128), (1, 48, 256, 64), (16, 48, 64, 64), (3, 48, 256, 128),
    (70, 48, 128, 32),  # BLOCK_M 64: two row tiles, the second masked
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, BF16_DOT], ids=str)
@pytest.mark.parametrize("symmetric", [True, False], ids=["symmetric", "zero_points"])
@pytest.mark.parametrize("m, n, k, group_size", CASES)
def test_matches_the_reference(m, n, k, group_size, symmetric, dtype):
    check(m, n, k, group_size, symmetric, dtype)


def test_the_constants_keep_a_slice_in_one_group():
    for m, group_size in [(1, 32), (16, 64), (70, 128), (200, 128)]:
        constants = w4a16_constants(m, group_size, True)
        assert group_size % constants["BLOCK_K"] == 0 and constants["BLOCK_K"] >= 16
        assert 16 <= constants["BLOCK_M"] <= 64 and constants["BLOCK_M"] >= min(m, 64)


def test_low_nibbles_are_the_even_elements():
    """Codes ``(n + 3k) % 16`` packed by hand, scale 2 (symmetric), and x the identity: row k of y
    is column k of the weight, exactly, ``2 * (u - 8)`` (one product by 1, one by the scale)."""
    n, k = 32, 64
    codes = (torch.arange(n)[:, None] + 3 * torch.arange(k)[None, :]) % 16
    q = Int4Weight(pack_int4(codes.to(torch.uint8)).to(DEVICE), torch.full((n, 1), 2.0, device=DEVICE), None,
                   64, True, (n, k))
    assert torch.equal(unpack_int4(q.packed).cpu(), codes.to(torch.uint8))
    got = w4a16_matmul(torch.eye(k, device=DEVICE), q)
    assert torch.equal(got.cpu(), 2.0 * (codes.T - 8).float())


def test_zero_points_are_per_row_and_group():
    """Asymmetric, every code 7, zero ``(n + g) % 16`` for row n and group g, scale 1: with x all
    ones, y[:, n] is the sum over groups of ``G * (7 - zero)``."""
    n, k, g = 48, 128, 32
    zeros = ((torch.arange(n)[:, None] + torch.arange(k // g)[None, :]) % 16).to(torch.uint8)
    q = Int4Weight(pack_int4(torch.full((n, k), 7, dtype=torch.uint8)).to(DEVICE),
                   torch.ones(n, k // g, device=DEVICE), zeros.to(DEVICE), g, False, (n, k))
    got = w4a16_matmul(torch.ones(3, k, dtype=torch.float16, device=DEVICE), q)
    want = (g * (7 - zeros.float())).sum(1)
    assert torch.equal(got.float().cpu(), want.expand(3, n))


def test_the_reference_is_dequantize_then_matmul():
    gen = torch.Generator().manual_seed(1)
    q = quantize_int4(torch.randn(32, 128, generator=gen), 64, False)
    x = torch.randn(5, 128, generator=gen)
    codes = unpack_int4(q.packed).double()
    weight = (codes - q.zeros.double().repeat_interleave(64, 1)) * q.scales.double().repeat_interleave(64, 1)
    torch.testing.assert_close(w4a16_matmul_reference(x, q), (x.double() @ weight.T).float())
    assert w4a16_matmul_reference(x.half(), q).dtype == torch.float16


def test_strided_and_empty_inputs():
    gen = torch.Generator().manual_seed(2)
    q = quantize_int4((0.05 * torch.randn(32, 64, generator=gen)).to(DEVICE), 32, True)
    x = torch.randn(64, 3, generator=gen).to(DEVICE).T  # [3, 64] with K of stride 3: copied to contiguous
    torch.testing.assert_close(w4a16_matmul(x, q), w4a16_matmul_reference(x, q), rtol=1e-5, atol=1e-5)
    assert w4a16_matmul(x[:0], q).shape == (0, 32)


def hand_built(n, k, group_size, symmetric=True, **change):
    groups = max(k // group_size, 1)
    fields = dict(packed=torch.zeros(n, k // 2, dtype=torch.uint8), scales=torch.ones(n, groups),
                  zeros=None if symmetric else torch.zeros(n, groups, dtype=torch.uint8), group_size=group_size,
                  symmetric=symmetric, shape=(n, k)) | change
    return Int4Weight(**fields)


@pytest.mark.parametrize("x_shape, q, message", [
    ((2, 96), hand_built(32, 96, 64), r"K = 96 with group size 64.*multiple of G"),  # K not a multiple of G
    ((2, 63), hand_built(32, 63, 32), r"K = 63 with group size 32.*multiple of G"),  # odd K
    ((2, 64), hand_built(32, 64, 8), r"G a multiple of 16"),  # a group smaller than tl.dot's K
    ((2, 128), hand_built(32, 64, 32), r"x \(2, 128\) must be \[M, K\] = \[M, 64\]"),
    ((2, 3, 64), hand_built(32, 64, 32), r"must be \[M, K\]"),
    ((2, 64), hand_built(32, 64, 32, packed=torch.zeros(32, 32, dtype=torch.int8)), r"uint8 \[N, K // 2\]"),
    ((2, 64), hand_built(32, 64, 32, scales=torch.ones(32, 2, dtype=torch.float16)), r"float32 \[N, K // G\]"),
    ((2, 64), hand_built(32, 64, 32, symmetric=False, zeros=None), r"zeros must be None exactly when"),
    ((2, 64), hand_built(32, 64, 32, symmetric=False, zeros=torch.zeros(32, 1, dtype=torch.uint8)),
     r"zeros is .* uint8 \[N, K // G\]"),
])
def test_bad_inputs_say_what_to_change(x_shape, q, message):
    x = torch.zeros(x_shape)
    with pytest.raises(ValueError, match=message):
        w4a16_matmul(x, q)
    with pytest.raises(ValueError, match=message):
        w4a16_matmul_reference(x, q)


def test_x_of_another_dtype_is_rejected():
    with pytest.raises(ValueError, match="cast it to one of float16, bfloat16, float32"):
        w4a16_matmul(torch.zeros(2, 64, dtype=torch.float64), hand_built(32, 64, 32))
