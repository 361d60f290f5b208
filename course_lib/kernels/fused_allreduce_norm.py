"""What follows a row-parallel layer, fused: one-shot all-reduce of the peers' partial outputs,
residual add, RMSNorm.

A row-parallel layer (attention's output projection, the MLP's down projection) leaves each of
the N tensor-parallel ranks with a partial sum of the layer's output. The engine then sums the
partials over the ranks, adds the residual stream and normalises the result for the next
layer. Unfused, that is three passes over ``[tokens, hidden]``; here one program per token
reads the N partials (as a one-shot all-reduce reads them from the peers' symmetric buffers,
stacked as ``partials[N, tokens, hidden]``), the residual and the weight once, and writes the
new residual and the normed row.

Dtype rules: ``partials``, ``residual`` and ``weight`` share one dtype (fp16, bf16 or fp32);
everything is accumulated in fp32 (the peers' sum in peer order, then the residual), and both
outputs are rounded once, to that dtype. ``normed`` is computed from the fp32 sum, not from the
rounded ``new_residual``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from course_lib.collectives.symmetric import SymmetricBuffers

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _allreduce_norm_kernel(partials_ptr, residual_ptr, weight_ptr, normed_ptr, new_residual_ptr, eps,
                           stride_pn, stride_pt, stride_rt, stride_ot,
                           PEERS: tl.constexpr, HIDDEN: tl.constexpr, BLOCK: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < HIDDEN  # BLOCK is HIDDEN padded to a power of two; padding lanes stay 0
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for peer in tl.static_range(PEERS):  # unrolled: the N loads are independent and overlap
        total += tl.load(partials_ptr + peer * stride_pn + token * stride_pt + cols, mask=ok, other=0.0).to(tl.float32)
    total += tl.load(residual_ptr + token * stride_rt + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(new_residual_ptr + token * stride_ot + cols, total.to(new_residual_ptr.dtype.element_ty), mask=ok)
    inv_rms = 1.0 / tl.sqrt(tl.sum(total * total, axis=0) / HIDDEN + eps)
    weight = tl.load(weight_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(normed_ptr + token * stride_ot + cols, (total * inv_rms * weight).to(normed_ptr.dtype.element_ty),
             mask=ok)


def allreduce_norm_constants(peers: int, hidden: int) -> dict:
    """The kernel's constexprs and warps: the whole row in one tile, 16 elements per thread up to
    8 warps (a 4096-wide row: 8 warps x 32 threads x 16)."""
    block = triton.next_power_of_2(hidden)
    return dict(PEERS=peers, HIDDEN=hidden, BLOCK=block, num_warps=min(max(block // 512, 1), 8))


def _check(partials: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> None:
    if partials.dim() != 3 or residual.dim() != 2 or partials.shape[1:] != residual.shape:
        raise ValueError(f"partials {tuple(partials.shape)} and residual {tuple(residual.shape)} must be "
                         "[N, tokens, hidden] and [tokens, hidden]: stack the peers' outputs along a new dim 0.")
    if weight.shape != (residual.shape[1],):
        raise ValueError(f"weight {tuple(weight.shape)} must be [hidden] = [{residual.shape[1]}].")
    if residual.dtype not in DTYPES or partials.dtype != residual.dtype or weight.dtype != residual.dtype:
        raise ValueError(f"partials, residual and weight are {partials.dtype}, {residual.dtype}, {weight.dtype}: "
                         "cast them to one of float16, bfloat16, float32.")


def allreduce_residual_rmsnorm(partials: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                               eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """``(normed, new_residual)``, both ``[tokens, hidden]`` in the inputs' dtype, where
    ``new_residual = residual + partials.sum(0)`` and ``normed = rmsnorm(new_residual) * weight``
    (one program per token). ``partials`` and ``residual`` may be strided views as long as their
    hidden dim is contiguous; nothing is copied."""
    _check(partials, residual, weight)
    if partials.stride(2) != 1 or residual.stride(1) != 1 or weight.stride(0) != 1:
        raise ValueError("the hidden dim of partials, residual and weight must be contiguous (stride 1): "
                         "call .contiguous() on them.")
    peers, tokens, hidden = partials.shape
    normed, new_residual = (torch.empty((tokens, hidden), dtype=residual.dtype, device=residual.device)
                            for _ in range(2))
    if tokens == 0:
        return normed, new_residual
    _allreduce_norm_kernel[(tokens,)](partials, residual, weight, normed, new_residual, eps,
                                      partials.stride(0), partials.stride(1), residual.stride(0), hidden,
                                      **allreduce_norm_constants(peers, hidden))
    return normed, new_residual


def allreduce_residual_rmsnorm_reference(partials: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                                         eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain PyTorch, the same signature and dtype rules: fp32 sum, both outputs rounded once."""
    _check(partials, residual, weight)
    total = partials.float().sum(0) + residual.float()
    normed = total * torch.rsqrt(total.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return normed.to(residual.dtype), total.to(residual.dtype)


def fused_against_unfused(tokens: int = 3, hidden: int = 96, eps: float = 1e-6) -> float:
    """On each rank: its own partial (as a row-parallel layer leaves it), every peer's partial
    read from the symmetric buffers, the fused kernel on them; the largest difference from
    ``dist.all_reduce`` + residual add + RMSNorm computed unfused on this rank."""
    rank = dist.get_rank()
    partial = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(10 + rank))
    residual = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(0))  # replicated
    weight = 1 + 0.1 * torch.randn(hidden, generator=torch.Generator().manual_seed(1))
    with SymmetricBuffers(partial.numel()) as buffers:
        _, views = buffers.begin(partial)  # this rank's partial into its own buffer
        buffers.signal()
        buffers.wait()  # every peer's partial is in its buffer
        partials = torch.stack([view.view(tokens, hidden) for view in views])
        normed, new_residual = allreduce_residual_rmsnorm(partials, residual, weight, eps)
        buffers.signal()
        buffers.wait()  # no peer reads this rank's buffer any more
    reduced = partial.clone()
    dist.all_reduce(reduced)
    want_residual = residual + reduced
    want_normed = want_residual * torch.rsqrt(want_residual.pow(2).mean(-1, keepdim=True) + eps) * weight
    return max((normed - want_normed).abs().max().item(), (new_residual - want_residual).abs().max().item())
