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
    int_mm_runs_on,
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
    assert path == (INT_MM if int_mm_runs_on("cpu") else EMULATED)
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
    assert path == (INT_MM if int_mm_runs_on("cpu") and not force_emulation else EMULATED)
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


@pytest.mark.parametrize("k", [1, 1024, 1025, 4096])
def test_emulation_is_exact_at_the_float32_limit_and_past_it(k):
    """K <= 1024 sums in float32 on the CPU, longer K in float64: exact either way, even with every
    product at its extreme 2**14 (a float32 sum of 1,025 of them would already round)."""
    a = torch.full((3, k), -128, dtype=torch.int8)
    b = torch.full((k, 2), -128, dtype=torch.int8)
    b[0, 1] = 1  # one odd product: an exact sum keeps it
    assert torch.equal(int_mm_emulated(a, b).long(), a.long() @ b.long())


@pytest.mark.parametrize("has_dot", [True, False])
def test_w8a8_takes_int_mm_only_where_the_cpu_has_int8_dot_products(monkeypatch, has_dot):
    """Without VNNI/AMX (x86) or dot-product/i8mm (Arm) torch._int_mm's CPU loop is scalar and an
    order of magnitude slower than the exact emulation, so the path follows the CPU's flags."""
    from course_lib.quant import int8

    monkeypatch.setattr(int8, "cpu_has_int8_dot", lambda: has_dot)
    a = torch.randint(-127, 128, (5, 64), dtype=torch.int8)
    b = torch.randint(-127, 128, (64, 8), dtype=torch.int8)
    got, path = int8_matmul(a, b)
    assert path == (INT_MM if has_dot and hasattr(torch, "_int_mm") else EMULATED)
    assert torch.equal(got.long(), a.long() @ b.long())


def test_the_int8_dot_flags_are_read_from_cpuinfo(monkeypatch, tmp_path):
    from course_lib.quant import int8

    def flags_are(line):
        (tmp_path / "cpuinfo").write_text(f"processor : 0\n{line}\n")
        real_open = open
        monkeypatch.setattr("builtins.open", lambda path, *a, **kw: real_open(
            tmp_path / "cpuinfo" if path == "/proc/cpuinfo" else path, *a, **kw))
        int8.cpu_has_int8_dot.cache_clear()
        try:
            return int8.cpu_has_int8_dot()
        finally:
            int8.cpu_has_int8_dot.cache_clear()
            monkeypatch.undo()

    assert flags_are("flags : fpu sse avx2 avx512f avx512_vnni")
    assert flags_are("Features : fp asimd asimddp")
    assert not flags_are("flags : fpu sse avx2 fma")
