"""W4A16: a matmul of 16-bit (or fp32) activations by int4 weights, dequantized in registers.

Decode is memory-bound: each generated token reads every weight once. Stored as int4 (the
format of ``course_lib.quant.int4``), a weight matrix is a quarter of its fp16 size, so the
kernel reads the packed bytes and never writes a dequantized copy: one program per output tile
``y[BLOCK_M, BLOCK_N]`` walks K a ``BLOCK_K`` slice at a time, loads ``packed[BLOCK_N,
BLOCK_K // 2]`` (byte j of a row holds element 2j in its low nibble, 2j+1 in its high nibble),
splits the nibbles, interleaves them back into ``[BLOCK_N, BLOCK_K]`` and subtracts 8
(symmetric) or the group's zero point (asymmetric). ``BLOCK_K`` divides the group size G, so a
slice lies in one group: the small integers ``u - zero`` (exact in fp16, bf16 and fp32) go
through ``tl.dot`` with the activations, and the product is multiplied by the group's ``[BLOCK_N]``
scales before it is added to the fp32 accumulator. That is ``x @ ((u - zero) * scale).T``
regrouped, one multiply per output and slice instead of one per weight, and it never rounds a
dequantized weight to 16 bits.

Dtype rules: ``x`` is fp16, bf16 or fp32 (``[M, K]``, K contiguous); products and the
accumulator are fp32 (fp32 inputs via "tf32x3", about fp32's accuracy); ``y`` is ``[M, N]`` in
x's dtype, rounded once. ``scales`` are fp32, ``packed`` and ``zeros`` uint8. K must be a multiple
of G, and G a multiple of 16 (``tl.dot``'s smallest K); M and N tails are masked.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from course_lib.quant.int4 import Int4Weight, dequantize_int4

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _w4a16_kernel(x_ptr, packed_ptr, scales_ptr, zeros_ptr, y_ptr, M, N, K,
                  stride_xm, stride_pn, stride_sn, stride_zn, stride_ym,
                  GROUP: tl.constexpr, SYMMETRIC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < M, cols < N
    rows64, cols64 = rows.to(tl.int64), cols.to(tl.int64)
    ks = tl.arange(0, BLOCK_K)
    bytes_ = tl.arange(0, BLOCK_K // 2)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):  # the wrapper checks K % BLOCK_K == 0: no K mask
        x = tl.load(x_ptr + rows64[:, None] * stride_xm + (k0 + ks)[None, :], mask=row_ok[:, None], other=0.0)
        packed = tl.load(packed_ptr + cols64[:, None] * stride_pn + (k0 // 2 + bytes_)[None, :],
                         mask=col_ok[:, None], other=0)
        low, high = packed & 0xF, packed >> 4  # elements 2j and 2j+1 of the slice
        u = tl.reshape(tl.join(low, high), [BLOCK_N, BLOCK_K]).to(tl.int32)  # [n, j, (low, high)] -> [n, 2j + i]
        group = k0 // GROUP  # BLOCK_K divides GROUP: the whole slice is in one group
        if SYMMETRIC:
            w = u - 8
        else:
            zero = tl.load(zeros_ptr + cols64 * stride_zn + group, mask=col_ok, other=0).to(tl.int32)
            w = u - zero[:, None]
        scale = tl.load(scales_ptr + cols64 * stride_sn + group, mask=col_ok, other=0.0)
        partial = tl.dot(x, tl.trans(w.to(x.dtype)), input_precision=PRECISION)  # [BLOCK_M, BLOCK_N], fp32
        acc += partial * scale[None, :]
    tl.store(y_ptr + rows64[:, None] * stride_ym + cols64[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


def w4a16_constants(m: int, group_size: int, symmetric: bool) -> dict:
    """The kernel's constexprs and warps. ``BLOCK_M`` covers M up to 64 (16 at least: ``tl.dot``'s
    smallest tile, a decode batch of 1 masks the rest); ``BLOCK_N`` 32, so a 4096-wide layer is 128
    programs even for one token; ``BLOCK_K`` the group size up to 128 (a power of two dividing it)."""
    block_k = min(group_size & -group_size, 128)  # the largest power of two dividing G, at most 128
    return dict(GROUP=group_size, SYMMETRIC=symmetric, BLOCK_M=min(max(triton.next_power_of_2(m), 16), 64),
                BLOCK_N=32, BLOCK_K=block_k, PRECISION="tf32x3", num_warps=4)


def _check(x: torch.Tensor, q: Int4Weight) -> tuple[int, int]:
    n, k = q.shape
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"x {tuple(x.shape)} must be [M, K] = [M, {k}]: the weight is [N, K] = [{n}, {k}] "
                         "(nn.Linear's out x in); flatten the batch dims of x into M.")
    if x.dtype not in DTYPES:
        raise ValueError(f"x is {x.dtype}: cast it to one of float16, bfloat16, float32.")
    g = q.group_size
    if g % 16 or k % g:
        raise ValueError(f"K = {k} with group size {g}: the kernel needs G a multiple of 16 (tl.dot's smallest K "
                         f"tile) and K a multiple of G; quantize with such a group size (32, 64 or 128), or pad K.")
    groups = k // g
    if q.packed.shape != (n, k // 2) or q.packed.dtype != torch.uint8:
        raise ValueError(f"packed is {q.packed.dtype} {tuple(q.packed.shape)}: it must be uint8 [N, K // 2] = "
                         f"[{n}, {k // 2}]; build q with course_lib.quant.int4.quantize_int4.")
    if q.scales.shape != (n, groups) or q.scales.dtype != torch.float32:
        raise ValueError(f"scales is {q.scales.dtype} {tuple(q.scales.shape)}: it must be float32 [N, K // G] = "
                         f"[{n}, {groups}].")
    if q.symmetric != (q.zeros is None):
        raise ValueError("zeros must be None exactly when q is symmetric (u - 8); asymmetric weights need their "
                         "uint8 zero points.")
    if q.zeros is not None and (q.zeros.shape != (n, groups) or q.zeros.dtype != torch.uint8):
        raise ValueError(f"zeros is {q.zeros.dtype} {tuple(q.zeros.shape)}: it must be uint8 [N, K // G] = "
                         f"[{n}, {groups}].")
    return n, k


def w4a16_matmul(x: torch.Tensor, q: Int4Weight) -> torch.Tensor:
    """``y = x @ dequantize_int4(q).T``, ``[M, N]`` in x's dtype, accumulated in fp32, with the int4
    weight dequantized tile by tile in registers (one program per ``BLOCK_M x BLOCK_N`` tile of y)."""
    n, k = _check(x, q)
    x = x.contiguous()
    packed, scales = q.packed.contiguous(), q.scales.contiguous()
    zeros = q.zeros.contiguous() if q.zeros is not None else packed  # unread when symmetric
    m = x.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    constants = w4a16_constants(m, q.group_size, q.symmetric)
    grid = (triton.cdiv(m, constants["BLOCK_M"]), triton.cdiv(n, constants["BLOCK_N"]))
    _w4a16_kernel[grid](x, packed, scales, zeros, y, m, n, k,
                        x.stride(0), packed.stride(0), scales.stride(0), zeros.stride(0), y.stride(0), **constants)
    return y


def w4a16_matmul_reference(x: torch.Tensor, q: Int4Weight) -> torch.Tensor:
    """Plain PyTorch, the same signature and checks: the weight dequantized in fp32, the matmul in
    fp32, the result cast to x's dtype."""
    _check(x, q)
    return (x.float() @ dequantize_int4(q, torch.float32).T).to(x.dtype)
