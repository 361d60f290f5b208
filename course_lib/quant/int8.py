"""int8 quantization: weight-only per output channel, and W8A8 with dynamic per-token activations.

Conventions (all symmetric, round to nearest, codes in -127..127 so that negation never overflows):

* Weight ``W [N, K]`` (``torch.nn.Linear`` layout): one scale per output row,
  ``scales[n] = max_k |W[n, k]| / 127``; ``q = round(W / scales[:, None])``; ``W ~= q * scales[:, None]``,
  with ``|W - dequantize| <= scales / 2`` elementwise. An all-zero row gets scale 1.
* Activations ``x [..., K]``: one scale per token (per row of the last dimension), computed at run
  time from the values themselves ("dynamic"): ``scales[..., 0] = max |x[..., :]| / 127``.
* ``y = x @ W.T`` in W8A8 is ``(q_x @ q_w.T) * s_x * s_w.T``: the integer product is accumulated in
  int32, and the two scales are applied once per output element afterwards.

Which kernels run (measured in torch 2.13 on this project's 2-core AVX2 CPU; see
``course_lib/engine/quant_benchmark.py`` for the whole-model numbers):

* Weight-only int8 on the CPU: ``torch._weight_int8pack_mm`` (int8 codes times 16-bit activations,
  per-channel scales) for bfloat16 inputs, where it is vectorised: 4-30x faster than dequantize +
  matmul at 1-256 rows. In float32 and float16 its x86 loop is scalar, 2-250x *slower* than
  dequantize + matmul, so those keep dequantize + matmul (:func:`int8pack_fits`).
* W8A8: ``torch._int_mm`` on a CPU with int8 dot-product instructions (x86 VNNI or AMX, Arm's
  dot-product or i8mm: :func:`cpu_has_int8_dot`), for every shape (torch 2.13 accepts any M, K, N
  there). Without them its loop is scalar: on this AVX2 CPU it was 14-35x slower than the exact
  float32 emulation at 16-4,096 rows, so such CPUs emulate (:func:`int_mm_emulated`). On CUDA, whose ``_int_mm`` wants
  M > 16 and K, N multiples of 8, the operands are zero-padded to such a shape and the result
  sliced (:func:`cuda_int_mm_shape`), which is exact: zero rows and columns add nothing to a sum.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from functools import cache

import torch
import torch.nn.functional as F

QMAX = 127
INT_MM = "torch._int_mm"
EMULATED = "emulated int32"
INT8PACK = "torch._weight_int8pack_mm"
INT8PACK_K_MULTIPLE = 16  # the kernel loads 16 activations at a time (AVX-512) with aligned loads
INT8_DOT_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm"})  # x86, then Arm
CUDA_MIN_ROWS = 17  # CUDA's _int_mm needs M > 16 ...
CUDA_MULTIPLE = 8  # ... and K, N multiples of 8 (K > 16 too)


@dataclass
class Int8Weight:
    """A per-output-channel int8 weight. Invariants: ``q`` int8 ``[N, K]`` in -127..127, contiguous;
    ``scales`` float32 ``[N]``, every entry > 0; both on the same device."""

    q: torch.Tensor
    scales: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    @property
    def nbytes(self) -> int:
        """Storage of the quantized form: int8 codes + float32 scales."""
        return self.q.numel() * self.q.element_size() + self.scales.numel() * self.scales.element_size()


def _symmetric_int8(x: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return torch.round(x / scales).clamp_(-QMAX, QMAX).to(torch.int8).contiguous()


def quantize_int8(weight: torch.Tensor) -> Int8Weight:
    """Quantize ``weight [N, K]`` to int8 with one scale per output channel (row)."""
    if weight.dim() != 2:
        raise ValueError(f"quantize_int8 expects a 2-D weight [N, K], got shape {tuple(weight.shape)}")
    if not weight.is_floating_point():
        raise ValueError(f"quantize_int8 expects a floating-point weight, got {weight.dtype}")
    w = weight.detach().to(torch.float32)
    scales = w.abs().amax(dim=1) / QMAX
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    return Int8Weight(q=_symmetric_int8(w, scales[:, None]), scales=scales.contiguous())


def dequantize_int8(w: Int8Weight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rebuild the ``[N, K]`` weight, ``q * scales[:, None]`` (computed in float32, cast to ``dtype``)."""
    return (w.q.to(torch.float32) * w.scales.to(torch.float32)[:, None]).to(dtype)


def quantize_activations_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token quantization of ``x [..., K]``.

    Returns ``(q, scales)``: ``q`` int8 ``[..., K]`` and ``scales`` float32 ``[..., 1]`` with
    ``x ~= q * scales`` and ``|x - q * scales| <= scales / 2``. An all-zero token gets scale 1.
    """
    if not x.is_floating_point():
        raise ValueError(f"quantize_activations_int8 expects floating-point activations, got {x.dtype}")
    x32 = x.detach().to(torch.float32)
    scales = x32.abs().amax(dim=-1, keepdim=True) / QMAX
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    return _symmetric_int8(x32, scales), scales


def int_mm_emulated(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a [M, K] int8 @ b [K, N] int8 -> int32 [M, N]``, exactly, on any device.

    Why a float matmul is exact here: each product has ``|a*b| <= 128 * 128 = 2**14`` and a dot
    product of length K is at most ``K * 2**14`` in magnitude; every partial sum is an integer of
    that size, so no addition rounds while it stays within the float's exact integers, whatever
    order the matmul sums in: float32 (``2**24``) for K <= 1024 on the CPU, float64 (``2**53``)
    otherwise (CUDA's float32 matmul may run in TF32, which rounds). The result is then cast to
    int32, which holds it exactly while ``K * 2**14 < 2**31``, i.e. K <= 131071: the same limit a
    real int32 accumulator has. int64 matmul would also be exact but is not implemented on CUDA.
    """
    if a.dtype != torch.int8 or b.dtype != torch.int8:
        raise ValueError(f"int_mm_emulated expects int8 operands, got {a.dtype} and {b.dtype}")
    if a.shape[1] >= 2**31 // 2**14:
        raise ValueError(f"K={a.shape[1]} could overflow an int32 accumulator; split K into chunks below 131072")
    exact = torch.float32 if a.device.type == "cpu" and a.shape[1] * 2**14 <= 2**24 else torch.float64
    return (a.to(exact) @ b.to(exact)).to(torch.int32)


@cache
def cpu_has_int8_dot() -> bool:
    """Whether this CPU has int8 dot-product instructions, which make ``torch._int_mm`` fast on it:
    a flag of ``INT8_DOT_FLAGS`` in /proc/cpuinfo; where that cannot be read, True on Arm64
    (Apple silicon has them) and False elsewhere."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            words = {word for line in cpuinfo if line.startswith(("flags", "Features")) for word in line.split()}
    except OSError:
        return platform.machine().lower() in ("arm64", "aarch64")
    return bool(words & INT8_DOT_FLAGS)


def int_mm_runs_on(device: torch.device | str) -> bool:
    """Whether :func:`int8_matmul` takes ``torch._int_mm`` on ``device`` (else the exact emulation)."""
    kind = torch.device(device).type
    return hasattr(torch, "_int_mm") and (kind == "cuda" or (kind == "cpu" and cpu_has_int8_dot()))


def _round_up(size: int, multiple: int) -> int:
    return -(-size // multiple) * multiple


def cuda_int_mm_shape(m: int, k: int, n: int) -> tuple[int, int, int]:
    """The smallest ``(M, K, N)`` at least ``(m, k, n)`` that CUDA's ``torch._int_mm`` accepts:
    M > 16, K > 16 and a multiple of 8, N a multiple of 8."""
    return max(m, CUDA_MIN_ROWS), max(_round_up(k, CUDA_MULTIPLE), 3 * CUDA_MULTIPLE), _round_up(n, CUDA_MULTIPLE)


def pad_for_cuda_int_mm(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``a [M, K]`` and ``b [K, N]`` (int8) zero-padded to :func:`cuda_int_mm_shape`: ``a`` row-major,
    ``b`` column-major (a transposed view, as cuBLAS wants it; left as it is when K and N fit).
    ``(a_pad @ b_pad)[:M, :N]`` is exactly ``a @ b``: the padding only adds zero terms. Pure tensor
    code, so the CPU tests check it; CUDA runs it on every w8a8 call."""
    (m, k), n = a.shape, b.shape[1]
    rows, inner, cols = cuda_int_mm_shape(m, k, n)
    a = F.pad(a, (0, inner - k, 0, rows - m)).contiguous()
    if (inner, cols) != (k, n):
        b = F.pad(b.t(), (0, inner - k, 0, cols - n)).t()
    return a, b


def int8_matmul(a: torch.Tensor, b: torch.Tensor, force_emulation: bool = False) -> tuple[torch.Tensor, str]:
    """``a [M, K] int8 @ b [K, N] int8 -> (int32 [M, N], path)``; path says which implementation ran.

    ``torch._int_mm`` on a CPU with int8 dot-product instructions as it is, on CUDA through
    :func:`pad_for_cuda_int_mm` (so decode's few rows never fall back to a float64 matmul);
    :func:`int_mm_emulated` elsewhere (:func:`int_mm_runs_on`), or with ``force_emulation``."""
    if force_emulation or not int_mm_runs_on(a.device):
        return int_mm_emulated(a, b), EMULATED
    if a.device.type == "cpu":
        return torch._int_mm(a.contiguous(), b), INT_MM
    padded_a, padded_b = pad_for_cuda_int_mm(a, b)
    return torch._int_mm(padded_a, padded_b)[: a.shape[0], : b.shape[1]], INT_MM


def int8pack_fits(x: torch.Tensor, k: int) -> bool:
    """Whether weight-only int8 runs ``torch._weight_int8pack_mm`` for input ``x [..., k]``: a CPU
    bfloat16 tensor (the dtype its x86 loop is vectorised for) with K a multiple of 16 (its vector
    loads read 16 activations at a time; other K crashed the process in torch 2.13)."""
    return (hasattr(torch, "_weight_int8pack_mm") and x.device.type == "cpu" and x.dtype == torch.bfloat16
            and k % INT8PACK_K_MULTIPLE == 0)


def int8pack_matmul(x: torch.Tensor, w: Int8Weight) -> torch.Tensor:
    """``x [..., K] @ dequantize_int8(w).T`` by PyTorch's CPU weight-only kernel, in x.dtype; the
    scales are cast to x.dtype. Only where :func:`int8pack_fits` (ValueError otherwise)."""
    n, k = w.q.shape
    if not int8pack_fits(x, k):
        raise ValueError(f"torch._weight_int8pack_mm here takes CPU bfloat16 inputs with K a multiple of "
                         f"{INT8PACK_K_MULTIPLE}; got {x.dtype} on {x.device} with K={k}: use dequantize_int8 + F.linear")
    rows = x.reshape(-1, k).contiguous()
    if rows.data_ptr() % 64:  # its aligned vector loads need an aligned start: copy a sliced view
        rows = rows.clone()
    return torch._weight_int8pack_mm(rows, w.q, w.scales.to(x.dtype)).reshape(*x.shape[:-1], n)


def w8a8_matmul(x: torch.Tensor, w: Int8Weight, force_emulation: bool = False) -> tuple[torch.Tensor, str]:
    """``y = x @ W.T`` with int8 activations (quantized per token, now) and int8 weights.

    ``x [..., K]`` floating point; returns ``(y [..., N] in x.dtype, path)`` where path is
    ``"torch._int_mm"`` or ``"emulated int32"``. Both paths give the same int32 accumulator, so
    they agree exactly up to the final float32 rescale.
    """
    n, k = w.q.shape
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} features but the weight expects K={k}")
    lead = x.shape[:-1]
    qx, sx = quantize_activations_int8(x.reshape(-1, k))
    acc, path = int8_matmul(qx, w.q.t(), force_emulation=force_emulation)
    y = acc.to(torch.float32) * sx * w.scales.to(torch.float32)[None, :]
    return y.to(x.dtype).reshape(*lead, n), path
