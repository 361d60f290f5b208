"""int8 weight-only and W8A8 quantization: error bounds, the exact integer emulation, the path taken."""

import pytest
import torch

from course_lib.quant.int8 import (
    EMULATED,
    INT_MM,
    Int8Weight,
    dequantize_int8,
    int8_matmul,
    int_mm_emulated,
    quantize_activations_int8,
    quantize_int8,
    w8a8_matmul,
)


def test_weight_shapes_and_bound():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(48, 200, generator=gen) * torch.rand(48, 1, generator=gen)
    w[3] = 0.0
    q = quantize_int8(w)
    assert isinstance(q, Int8Weight)
    assert q.q.dtype == torch.int8 and q.q.shape == (48, 200) and q.shape == (48, 200)
    assert q.scales.dtype == torch.float32 and q.scales.shape == (48,)
    assert int(q.q.abs().max()) <= 127 and q.scales[3] == 1.0
    assert torch.allclose(q.scales[:3], w[:3].abs().amax(1) / 127)
    err = (w - dequantize_int8(q)).abs()
    assert bool((err <= q.scales[:, None] / 2 * (1 + 1e-5) + 1e-8).all())
    assert torch.equal(dequantize_int8(q)[3], torch.zeros(200))
    assert q.nbytes == 48 * 200 + 48 * 4


def test_weight_exact_on_grid():
    gen = torch.Generator().manual_seed(1)
    codes = torch.randint(-127, 128, (16, 64), generator=gen)
    codes[:, 0] = 127
    step = 2.0 ** torch.randint(-10, 2, (16, 1), generator=gen).float()
    w = codes.float() * step
    q = quantize_int8(w)
    assert torch.equal(q.q.long(), codes) and torch.equal(dequantize_int8(q), w)


def test_activation_quantization_per_token():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(3, 5, 64, generator=gen) * torch.rand(3, 5, 1, generator=gen) * 10
    x[1, 2] = 0.0
    q, s = quantize_activations_int8(x)
    assert q.dtype == torch.int8 and q.shape == x.shape
    assert s.dtype == torch.float32 and s.shape == (3, 5, 1)
    assert s[1, 2, 0] == 1.0 and q[1, 2].eq(0).all()
    assert bool((q.abs().amax(-1) == 127)[s[..., 0] != 1.0].all())  # each token uses its full range
    assert bool(((x - q.float() * s).abs() <= s / 2 * (1 + 1e-5) + 1e-8).all())


@pytest.mark.parametrize("m,k,n", [(1, 64, 32), (7, 192, 512), (33, 512, 192), (5, 3000, 9)])
def test_emulation_exact_against_int64(m, k, n):
    gen = torch.Generator().manual_seed(m * k + n)
    a = torch.randint(-128, 128, (m, k), generator=gen, dtype=torch.int8)
    b = torch.randint(-128, 128, (k, n), generator=gen, dtype=torch.int8)
    a[0, :] = -128  # the extreme products, 2**14 each
    b[:, 0] = -128
    got = int_mm_emulated(a, b)
    assert got.dtype == torch.int32
    assert torch.equal(got.long(), a.long() @ b.long())


def test_int_mm_and_emulation_agree_on_cpu():
    gen = torch.Generator().manual_seed(3)
    a = torch.randint(-127, 128, (20, 64), generator=gen, dtype=torch.int8)
    b = torch.randint(-127, 128, (48, 64), generator=gen, dtype=torch.int8).t()  # a transposed view, as in w8a8
    fast, path = int8_matmul(a, b)
    slow, slow_path = int8_matmul(a, b, force_emulation=True)
    assert slow_path == EMULATED
    assert path in (INT_MM, EMULATED)
    if hasattr(torch, "_int_mm"):
        assert path == INT_MM  # torch 2.13 has a CPU kernel
    assert torch.equal(fast, slow)


@pytest.mark.parametrize("force_emulation", [False, True])
@pytest.mark.parametrize("shape", [(1, 192), (4, 9, 192), (300, 512)])
def test_w8a8_within_quantization_bound(force_emulation, shape):
    gen = torch.Generator().manual_seed(sum(shape))
    k = shape[-1]
    x = torch.randn(*shape, generator=gen) * 3
    w = torch.randn(96, k, generator=gen) * 0.05
    qw = quantize_int8(w)
    y, path = w8a8_matmul(x, qw, force_emulation=force_emulation)
    assert path == (EMULATED if force_emulation else INT_MM if hasattr(torch, "_int_mm") else EMULATED)
    assert y.shape == (*shape[:-1], 96) and y.dtype == x.dtype
    ref = x.double() @ w.double().t()
    # |x^ w^ - x w| <= |x^| |w^ - w| + |w| |x^ - x| <= |x^| s_w / 2 + |w| s_x / 2, summed over K
    qx, sx = quantize_activations_int8(x)
    x_hat = qx.double() * sx.double()
    bound = (x_hat.abs().sum(-1, keepdim=True) * qw.scales.double() / 2
             + sx.double() / 2 * w.double().abs().sum(-1))
    err = (y.double() - ref).abs()
    assert bool((err <= bound * 1.001 + 1e-5).all()), float((err - bound).max())
    assert float(err.max()) < 0.05 * float(ref.abs().max())


def test_w8a8_paths_agree():
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(40, 128, generator=gen)
    qw = quantize_int8(torch.randn(64, 128, generator=gen))
    y1, _ = w8a8_matmul(x, qw)
    y2, _ = w8a8_matmul(x, qw, force_emulation=True)
    assert torch.equal(y1, y2)


def test_w8a8_rejects_wrong_k():
    with pytest.raises(ValueError, match="K=64"):
        w8a8_matmul(torch.randn(2, 32), quantize_int8(torch.randn(8, 64)))


def test_weight_rejects_non_2d():
    with pytest.raises(ValueError, match="2-D"):
        quantize_int8(torch.randn(8))
