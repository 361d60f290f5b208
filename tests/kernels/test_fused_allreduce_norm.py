"""The fused all-reduce + residual + RMSNorm kernel against its PyTorch reference (under
TRITON_INTERPRET=1 on a CPU), its input checks, and on two real CPU ranks against
``dist.all_reduce`` followed by the residual add and RMSNorm, unfused."""

import pytest
import torch

from course_lib.collectives.launch import run_on_ranks
from course_lib.kernels.fused_allreduce_norm import (allreduce_residual_rmsnorm,
                                                     allreduce_residual_rmsnorm_reference, fused_against_unfused)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Both sides sum in fp32 and round once, so fp32 and fp16 agree to fp32 noise (fp16 rounds the same
# way on both). bf16: the interpreter casts fp32 -> bf16 by truncating (GPUs round to nearest
# even), so an output may be one bf16 ulp (at most 2^-7 relative) off the reference.
TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=1e-3, atol=1e-3),
             torch.bfloat16: dict(rtol=2 ** -7, atol=1e-3)}


def inputs(peers, tokens, hidden, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    partials = torch.randn(peers, tokens, hidden, generator=gen)
    residual = 2 * torch.randn(tokens, hidden, generator=gen)
    weight = 1 + 0.1 * torch.randn(hidden, generator=gen)
    return tuple(t.to(dtype).to(DEVICE) for t in (partials, residual, weight))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("hidden", [64, 96, 192])  # 96 and 192: BLOCK pads to 128 and 256, masked
@pytest.mark.parametrize("tokens", [1, 5])
@pytest.mark.parametrize("peers", [1, 2, 4])
def test_matches_the_reference(peers, tokens, hidden, dtype):
    partials, residual, weight = inputs(peers, tokens, hidden, dtype)
    normed, new_residual = allreduce_residual_rmsnorm(partials, residual, weight, 1e-6)
    want_normed, want_residual = allreduce_residual_rmsnorm_reference(partials, residual, weight, 1e-6)
    assert normed.dtype == new_residual.dtype == dtype and normed.shape == residual.shape
    torch.testing.assert_close(new_residual, want_residual, **TOLERANCE[dtype])
    torch.testing.assert_close(normed, want_normed, **TOLERANCE[dtype])


def test_the_reference_is_residual_plus_sum_then_rmsnorm():
    partials, residual, weight = inputs(3, 4, 32, torch.float64)
    normed, new_residual = allreduce_residual_rmsnorm_reference(partials.float(), residual.float(), weight.float(), 1e-5)
    total = residual + partials.sum(0)
    want = total / torch.sqrt((total ** 2).mean(-1, keepdim=True) + 1e-5) * weight
    torch.testing.assert_close(new_residual, total.float())
    torch.testing.assert_close(normed, want.float())


def test_strided_views_are_read_in_place():
    """Partials as every other token of a bigger tensor and the residual as a column slice: the
    kernel follows the strides of dim 0 and 1."""
    big, residual_wide, weight = inputs(2, 10, 128, torch.float32)
    partials, residual = big[:, ::2, :64], residual_wide[:5, 32:96]
    got = allreduce_residual_rmsnorm(partials, residual, weight[:64], 1e-6)
    want = allreduce_residual_rmsnorm_reference(partials, residual, weight[:64], 1e-6)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **TOLERANCE[torch.float32])


@pytest.mark.parametrize("change, message", [
    (lambda p, r, w: (p[0], r, w), r"\[N, tokens, hidden\]"),
    (lambda p, r, w: (p, r[:, :-1], w), r"\[N, tokens, hidden\]"),
    (lambda p, r, w: (p, r, w[:-1]), r"weight .* must be \[hidden\]"),
    (lambda p, r, w: (p, r.half(), w), "cast them"),
    (lambda p, r, w: (p.double(), r.double(), w.double()), "cast them"),
    (lambda p, r, w: (p[:, :, ::2], r[:, ::2], w[::2]), "contiguous"),
])
def test_bad_inputs_say_what_to_change(change, message):
    with pytest.raises(ValueError, match=message):
        allreduce_residual_rmsnorm(*change(*inputs(2, 3, 64, torch.float32)), 1e-6)


def test_on_two_cpu_ranks_it_equals_all_reduce_then_residual_then_rmsnorm():
    errors = run_on_ranks(fused_against_unfused, 2, 3, 96, 1e-6, backend="gloo", timeout_s=60)
    assert all(error < 1e-5 for error in errors), errors
