"""Group-wise int4 weight quantization: two 4-bit codes per byte, one scale (and zero) per group.

Layout (the contract a kernel reading these tensors relies on):

* The weight is ``W [N, K]`` in ``torch.nn.Linear`` layout: N = out_features rows, K = in_features.
* Groups are ``group_size`` (G) consecutive elements along K inside one row; row n, group g covers
  ``W[n, g*G:(g+1)*G]``. K must be a multiple of G, and G is one of ``SUPPORTED_GROUP_SIZES``.
* Every element becomes an unsigned 4-bit code ``u`` in 0..15. ``packed[n, j]`` (uint8, shape
  ``[N, K//2]``) holds element ``2j`` in its low nibble and element ``2j+1`` in its high nibble:
  ``packed = u[:, 0::2] | (u[:, 1::2] << 4)``.
* ``scales`` is float32 ``[N, K//G]``; ``zeros`` is uint8 ``[N, K//G]`` (values 0..15) or ``None``.
* Symmetric: ``w ~= (u - 8) * scale`` (signed code q = u - 8 in -8..7; rounding only produces -7..7).
  Asymmetric: ``w ~= (u - zero) * scale``.
* Rounding is to nearest (ties to even, ``torch.round``), so every element of a group satisfies
  ``|w - dequantize(w)| <= scale / 2`` (up to float32 rounding of the division).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SUPPORTED_GROUP_SIZES = (32, 64, 128)


@dataclass
class Int4Weight:
    """An int4-quantized ``[N, K]`` weight.

    Invariants: ``packed`` uint8 ``[N, K//2]``; ``scales`` float32 ``[N, K//group_size]``, every
    entry > 0; ``zeros`` uint8 ``[N, K//group_size]`` with values 0..15 when ``symmetric`` is False,
    else None; ``shape == (N, K)``; all tensors on the same device and contiguous (row-major),
    whatever the strides of the weight passed in.
    """

    packed: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    group_size: int
    symmetric: bool
    shape: tuple[int, int]

    @property
    def nbytes(self) -> int:
        """Storage of the quantized form: packed codes + scales + zeros (if any)."""
        total = self.packed.numel() * self.packed.element_size()
        total += self.scales.numel() * self.scales.element_size()
        if self.zeros is not None:
            total += self.zeros.numel() * self.zeros.element_size()
        return total


def check_group_size(in_features: int, group_size: int) -> None:
    """Raise ValueError unless ``group_size`` is supported and divides ``in_features`` (K)."""
    if group_size not in SUPPORTED_GROUP_SIZES or group_size % 2:
        raise ValueError(
            f"group_size G={group_size} is not supported (K={in_features}): "
            f"pass group_size as one of {SUPPORTED_GROUP_SIZES}"
        )
    if in_features % group_size:
        fits = [g for g in SUPPORTED_GROUP_SIZES if in_features % g == 0]
        advice = (f"use group_size in {fits}" if fits else
                  f"pad in_features up to a multiple of {group_size} (e.g. {-(-in_features // group_size) * group_size})")
        raise ValueError(
            f"K={in_features} (in_features) is not a multiple of group_size G={group_size}: {advice}"
        )


def pack_int4(nibbles: torch.Tensor) -> torch.Tensor:
    """Pack uint8 codes 0..15 ``[..., K]`` (K even) into uint8 ``[..., K//2]``.

    Byte j holds element 2j in its low nibble and element 2j+1 in its high nibble.
    Exact inverse of :func:`unpack_int4`.
    """
    if nibbles.dtype != torch.uint8:
        raise ValueError(f"pack_int4 expects uint8 codes, got {nibbles.dtype}: convert with .to(torch.uint8)")
    if nibbles.dim() == 0 or nibbles.shape[-1] % 2:
        raise ValueError(f"pack_int4 needs an even last dimension, got shape {tuple(nibbles.shape)}: pad K to even")
    if nibbles.numel() and int(nibbles.max()) > 15:
        raise ValueError(f"pack_int4 codes must be in 0..15, found {int(nibbles.max())}: clamp or mask to 4 bits")
    return (nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)).contiguous()


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Unpack uint8 ``[..., K//2]`` into uint8 codes 0..15 ``[..., K]`` (exact inverse of :func:`pack_int4`)."""
    if packed.dtype != torch.uint8:
        raise ValueError(f"unpack_int4 expects uint8 packed bytes, got {packed.dtype}")
    low = packed & 0x0F
    high = packed >> 4
    return torch.stack((low, high), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def quantize_int4(weight: torch.Tensor, group_size: int = 128, symmetric: bool = True) -> Int4Weight:
    """Quantize ``weight [N, K]`` to int4 with one scale (and, if asymmetric, one zero) per group.

    Symmetric: ``scale = max|w| / 7`` per group; ``q = round(w / scale)`` in -7..7, stored ``q + 8``.
    A group of all zeros gets scale 1 and q = 0.

    Asymmetric: the group's range ``[lo, hi]`` is ``[min(min w, 0), max(max w, 0)]`` -- widened to
    include 0, as PyTorch's min/max observers do, so that the zero point is an integer in 0..15 and
    0.0 is exactly representable; ``scale = (hi - lo) / 15``, ``zero = round(-lo / scale)`` clamped
    to 0..15, ``u = clamp(round(w / scale) + zero, 0, 15)``; ``w ~= (u - zero) * scale``.
    An all-zero group gets scale 1 and zero 0.

    Either way ``|w - dequantize_int4(q)| <= scale / 2`` elementwise (up to float32 rounding).
    """
    if weight.dim() != 2:
        raise ValueError(f"quantize_int4 expects a 2-D weight [N, K], got shape {tuple(weight.shape)}")
    if not weight.is_floating_point():
        raise ValueError(f"quantize_int4 expects a floating-point weight, got {weight.dtype}")
    n, k = weight.shape
    check_group_size(k, group_size)
    w = weight.detach().to(torch.float32).reshape(n, k // group_size, group_size)
    if symmetric:
        scales = w.abs().amax(dim=-1) / 7.0
        scales = torch.where(scales > 0, scales, torch.ones_like(scales))
        q = torch.round(w / scales[..., None]).clamp_(-8, 7)
        codes = (q + 8).to(torch.uint8)
        zeros = None
    else:
        lo = w.amin(dim=-1).clamp(max=0.0)
        hi = w.amax(dim=-1).clamp(min=0.0)
        scales = (hi - lo) / 15.0
        scales = torch.where(scales > 0, scales, torch.ones_like(scales))
        zero = torch.round(-lo / scales).clamp_(0, 15)
        codes = (torch.round(w / scales[..., None]) + zero[..., None]).clamp_(0, 15).to(torch.uint8)
        zeros = zero.to(torch.uint8).contiguous()
    return Int4Weight(
        packed=pack_int4(codes.reshape(n, k)),
        scales=scales.contiguous(),
        zeros=zeros,
        group_size=group_size,
        symmetric=symmetric,
        shape=(n, k),
    )


def dequantize_int4(q: Int4Weight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rebuild the ``[N, K]`` weight: ``(u - 8) * scale`` (symmetric) or ``(u - zero) * scale``.

    Computed in float32, then cast to ``dtype``.
    """
    n, k = q.shape
    g = q.group_size
    codes = unpack_int4(q.packed).reshape(n, k // g, g).to(torch.float32)
    if q.symmetric:
        centred = codes - 8.0
    else:
        if q.zeros is None:
            raise ValueError("an asymmetric Int4Weight needs zeros; quantize with symmetric=False")
        centred = codes - q.zeros.to(torch.float32)[..., None]
    return (centred * q.scales.to(torch.float32)[..., None]).reshape(n, k).to(dtype)
