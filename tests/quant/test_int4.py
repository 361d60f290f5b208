"""int4 group-wise quantization: the packing layout, the error bound, and the bad-shape errors."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.quant.int4 import (
    Int4Weight,
    dequantize_int4,
    pack_int4,
    quantize_int4,
    unpack_int4,
)

GROUPS = (32, 64, 128)


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 9), half_k=st.integers(1, 70))
def test_pack_unpack_round_trip(seed, rows, half_k):
    gen = torch.Generator().manual_seed(seed)
    nibbles = torch.randint(0, 16, (rows, 2 * half_k), generator=gen, dtype=torch.uint8)
    packed = pack_int4(nibbles)
    assert packed.dtype == torch.uint8 and packed.shape == (rows, half_k)
    assert torch.equal(unpack_int4(packed), nibbles)
    # and the other way round: every byte value survives unpack -> pack
    raw = torch.randint(0, 256, (rows, half_k), generator=gen, dtype=torch.uint8)
    assert torch.equal(pack_int4(unpack_int4(raw)), raw)


def test_pack_layout_low_nibble_is_even_element():
    nibbles = torch.tensor([[1, 2, 15, 0, 7, 9]], dtype=torch.uint8)
    packed = pack_int4(nibbles)
    assert packed.tolist() == [[1 | (2 << 4), 15 | (0 << 4), 7 | (9 << 4)]]


def test_pack_rejects_bad_input():
    with pytest.raises(ValueError, match="0..15"):
        pack_int4(torch.tensor([[16, 0]], dtype=torch.uint8))
    with pytest.raises(ValueError, match="even"):
        pack_int4(torch.zeros(2, 3, dtype=torch.uint8))
    with pytest.raises(ValueError, match="uint8"):
        pack_int4(torch.zeros(2, 4, dtype=torch.int32))


@pytest.mark.parametrize("group_size", GROUPS)
@pytest.mark.parametrize("symmetric", [True, False])
def test_shapes_and_dtypes(group_size, symmetric):
    w = torch.randn(24, 256)
    q = quantize_int4(w, group_size=group_size, symmetric=symmetric)
    assert isinstance(q, Int4Weight)
    assert q.packed.dtype == torch.uint8 and q.packed.shape == (24, 128)
    assert q.scales.dtype == torch.float32 and q.scales.shape == (24, 256 // group_size)
    assert q.shape == (24, 256) and q.group_size == group_size and q.symmetric == symmetric
    if symmetric:
        assert q.zeros is None
    else:
        assert q.zeros.dtype == torch.uint8 and q.zeros.shape == (24, 256 // group_size)
        assert int(q.zeros.max()) <= 15
    assert bool((q.scales > 0).all())
    assert dequantize_int4(q).shape == (24, 256)
    assert dequantize_int4(q, dtype=torch.bfloat16).dtype == torch.bfloat16
    assert q.nbytes == 24 * 128 + q.scales.numel() * 4 + (0 if symmetric else q.scales.numel())


@pytest.mark.parametrize("group_size", GROUPS)
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("seed", range(8))
def test_error_at_most_half_a_step(group_size, symmetric, seed):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(16, 384, generator=gen) * (0.01 + seed) + (seed % 3) * 0.5
    q = quantize_int4(w, group_size=group_size, symmetric=symmetric)
    err = (w - dequantize_int4(q)).abs().reshape(16, -1, group_size)
    bound = q.scales[..., None] / 2
    assert bool((err <= bound * (1 + 1e-5) + 1e-7).all()), float((err - bound).max())


@pytest.mark.parametrize("group_size", GROUPS)
def test_symmetric_exact_on_grid(group_size):
    gen = torch.Generator().manual_seed(0)
    n, k = 8, 256
    step = 2.0 ** torch.randint(-8, 3, (n, k // group_size, 1), generator=gen).float()
    codes = torch.randint(-7, 8, (n, k // group_size, group_size), generator=gen).float()
    codes[..., 0] = 7  # every group reaches its max, so max|w| / 7 is exactly the step
    w = (codes * step).reshape(n, k)
    q = quantize_int4(w, group_size=group_size)
    assert torch.equal(q.scales, step.squeeze(-1))
    assert torch.equal(dequantize_int4(q), w)


@pytest.mark.parametrize("group_size", GROUPS)
def test_asymmetric_exact_on_grid(group_size):
    gen = torch.Generator().manual_seed(1)
    n, k = 8, 256
    step = 2.0 ** torch.randint(-6, 2, (n, k // group_size, 1), generator=gen).float()
    zero = torch.randint(0, 16, (n, k // group_size, 1), generator=gen)
    codes = torch.randint(0, 16, (n, k // group_size, group_size), generator=gen)
    codes[..., 0], codes[..., 1] = 0, 15  # the group spans the whole code range
    codes[..., 2] = zero[..., 0]  # and holds 0.0, so the range is not widened
    w = ((codes - zero).float() * step).reshape(n, k)
    q = quantize_int4(w, group_size=group_size, symmetric=False)
    assert torch.equal(q.zeros, zero.squeeze(-1).to(torch.uint8))
    assert torch.equal(dequantize_int4(q), w)


@pytest.mark.parametrize("symmetric", [True, False])
def test_zero_groups(symmetric):
    w = torch.randn(4, 128)
    w[1] = 0.0
    w[2, 32:64] = 0.0
    q = quantize_int4(w, group_size=32, symmetric=symmetric)
    assert q.scales[1].eq(1.0).all() and q.scales[2, 1] == 1.0
    deq = dequantize_int4(q)
    assert torch.equal(deq[1], torch.zeros(128)) and torch.equal(deq[2, 32:64], torch.zeros(32))
    assert bool(torch.isfinite(deq).all())
    codes = unpack_int4(q.packed)
    if symmetric:
        assert codes[1].eq(8).all()  # q = 0 stored as 0 + 8
    else:
        assert q.zeros[1].eq(0).all() and codes[1].eq(0).all()


def test_zero_is_exact_in_both_schemes():
    w = torch.randn(4, 128) + 3.0  # all-positive groups
    w[:, ::5] = 0.0
    for symmetric in (True, False):
        deq = dequantize_int4(quantize_int4(w, group_size=64, symmetric=symmetric))
        assert bool((deq[:, ::5] == 0).all())


def test_asymmetric_beats_symmetric_on_a_shifted_distribution():
    gen = torch.Generator().manual_seed(0)
    w = torch.rand(64, 512, generator=gen) * 0.2 + 1.0  # values in [1.0, 1.2]: all on one side of 0
    sym = (w - dequantize_int4(quantize_int4(w, 128, symmetric=True))).pow(2).mean()
    asym = (w - dequantize_int4(quantize_int4(w, 128, symmetric=False))).pow(2).mean()
    assert asym < sym / 3, (float(asym), float(sym))


def test_smaller_groups_lower_error():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(64, 512, generator=gen) * torch.rand(1, 512, generator=gen).pow(4) * 4  # outlier columns
    errs = [float((w - dequantize_int4(quantize_int4(w, g))).pow(2).mean()) for g in (32, 64, 128)]
    assert errs[0] < errs[1] < errs[2], errs


@pytest.mark.parametrize("k,group_size", [(100, 32), (96, 64), (192, 128), (256, 16), (256, 48), (256, 256)])
def test_bad_k_or_group_raises(k, group_size):
    with pytest.raises(ValueError) as info:
        quantize_int4(torch.randn(4, k), group_size=group_size)
    message = str(info.value)
    assert f"K={k}" in message and f"G={group_size}" in message


def test_bad_k_message_says_what_to_do():
    with pytest.raises(ValueError, match=r"use group_size in \[32\]"):
        quantize_int4(torch.randn(4, 96), group_size=64)
    with pytest.raises(ValueError, match="pad in_features up to a multiple of 32"):
        quantize_int4(torch.randn(4, 100), group_size=32)


def test_rejects_non_2d_and_integer_weights():
    with pytest.raises(ValueError, match="2-D"):
        quantize_int4(torch.randn(128))
    with pytest.raises(ValueError, match="floating"):
        quantize_int4(torch.ones(2, 128, dtype=torch.int32))


def test_outputs_contiguous_for_a_transposed_weight():
    w = torch.randn(128, 16).t()  # a non-contiguous [16, 128] view
    for symmetric in (True, False):
        q = quantize_int4(w, group_size=32, symmetric=symmetric)
        assert q.packed.is_contiguous() and q.scales.is_contiguous()
        assert q.zeros is None or q.zeros.is_contiguous()
        assert torch.equal(dequantize_int4(q), dequantize_int4(quantize_int4(w.contiguous(), 32, symmetric)))
