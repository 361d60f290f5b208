"""int8 quantization: weight-only per output channel, and W8A8 with dynamic per-token activations.

Conventions (all symmetric, round to nearest, codes in -127..127 so that negation never overflows):

* Weight ``W [N, K]`` (``torch.nn.Linear`` layout): one scale per output row,
  ``scales[n] = max_k |W[n, k]| / 127``; ``q = round(W / scales[:, None])``; ``W ~= q * scales[:, None]``,
  with ``|W - dequantize| <= scales / 2`` elementwise. An all-zero row gets scale 1.
* Activations ``x [..., K]``: one scale per token (per row of the last dimension), computed at run
  time from the values themselves ("dynamic"): ``scales[..., 0] = max |x[..., :]| / 127``.
* ``y = x @ W.T`` in W8A8 is ``(q_x @ q_w.T) * s_x * s_w.T``: the integer product is accumulated in
  int32, and the two scales are applied once per output element afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

QMAX = 127
INT_MM = "torch._int_mm"
EMULATED = "emulated int32"


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

    Why float64 is exact here: each product has ``|a*b| <= 128 * 128 = 2**14`` and a dot product
    of length K is at most ``K * 2**14`` in magnitude; every partial sum is an integer of that
    size, and float64 represents every integer up to ``2**53`` exactly, so no addition rounds
    as long as ``K <= 2**39`` -- whatever order the matmul sums in. (float32, exact only to
    ``2**24``, would already round for K > 1024.) The result is then cast to int32, which holds
    it exactly while ``K * 2**14 < 2**31``, i.e. K <= 131071: the same limit a real int32
    accumulator has. int64 matmul would also be exact but is not implemented on CUDA.
    """
    if a.dtype != torch.int8 or b.dtype != torch.int8:
        raise ValueError(f"int_mm_emulated expects int8 operands, got {a.dtype} and {b.dtype}")
    if a.shape[1] >= 2**31 // 2**14:
        raise ValueError(f"K={a.shape[1]} could overflow an int32 accumulator; split K into chunks below 131072")
    return (a.to(torch.float64) @ b.to(torch.float64)).to(torch.int32)


def int_mm_constraints_met(m: int, k: int, n: int, device: torch.device) -> bool:
    """Whether ``torch._int_mm`` accepts an ``[M, K] @ [K, N]`` product on ``device``.

    On CUDA it requires M > 16, and K and N multiples of 8 (K > 16); on CPU (torch 2.13 has a CPU
    kernel) any shape works. Anything else falls back to :func:`int_mm_emulated`.
    """
    if not hasattr(torch, "_int_mm"):
        return False
    if device.type == "cuda":
        return m > 16 and k > 16 and k % 8 == 0 and n % 8 == 0
    return device.type == "cpu"


def int8_matmul(a: torch.Tensor, b: torch.Tensor, force_emulation: bool = False) -> tuple[torch.Tensor, str]:
    """``a [M, K] int8 @ b [K, N] int8 -> (int32 [M, N], path)``; path says which implementation ran."""
    m, k = a.shape
    n = b.shape[1]
    if not force_emulation and int_mm_constraints_met(m, k, n, a.device):
        try:
            return torch._int_mm(a.contiguous(), b), INT_MM
        except (RuntimeError, NotImplementedError):
            pass  # an unsupported layout or build: the emulation below is exact
    return int_mm_emulated(a, b), EMULATED


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
