"""Write new keys and values into the paged KV cache through a slot mapping.

Slot ``s`` is position ``s % block_size`` of block ``s // block_size``. Both the caches and the
new keys/values are addressed through their own strides, so a cache may be a view: e.g. K and V
as ``kv[:, 0]`` and ``kv[:, 1]`` of one ``[num_blocks, 2, block_size, kv_heads, head_dim]``
tensor, where a block's K rows are followed by its V rows and ``stride(0)`` is twice
``block_size * stride(1)``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _write_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slots_ptr, block_size,
                  stride_kn, stride_kh, stride_kd, stride_vn, stride_vh, stride_vd,
                  stride_kcb, stride_kcs, stride_kch, stride_kcd,
                  stride_vcb, stride_vcs, stride_vch, stride_vcd,
                  HEADS: tl.constexpr, DIM: tl.constexpr, HEADS_PAD: tl.constexpr, DIM_PAD: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + token).to(tl.int64)  # large pools overflow int32
    block = slot // block_size
    offset = slot % block_size
    heads = tl.arange(0, HEADS_PAD)[:, None]  # one [heads, head_dim] tile per token
    dims = tl.arange(0, DIM_PAD)[None, :]
    ok = (heads < HEADS) & (dims < DIM)
    k = tl.load(k_ptr + token * stride_kn + heads * stride_kh + dims * stride_kd, mask=ok)
    v = tl.load(v_ptr + token * stride_vn + heads * stride_vh + dims * stride_vd, mask=ok)
    tl.store(k_cache_ptr + block * stride_kcb + offset * stride_kcs + heads * stride_kch + dims * stride_kcd,
             k, mask=ok)
    tl.store(v_cache_ptr + block * stride_vcb + offset * stride_vcs + heads * stride_vch + dims * stride_vcd,
             v, mask=ok)


def write_constants(kv_heads: int, head_dim: int) -> dict:
    """The write kernel's constexprs: one [kv_heads, head_dim] tile per token, padded to powers of two."""
    return dict(HEADS=kv_heads, DIM=head_dim, HEADS_PAD=triton.next_power_of_2(kv_heads),
                DIM_PAD=triton.next_power_of_2(head_dim))


def write_kv_cache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   slot_mapping: torch.Tensor) -> None:
    """Store ``k``/``v`` ``[N, kv_heads, head_dim]`` at slots ``slot_mapping[N]`` of caches
    ``[num_blocks, block_size, kv_heads, head_dim]`` (one program per token).

    Any strides work, for the caches and for ``k``/``v``: nothing is copied to make them
    contiguous."""
    n, heads, dim = k.shape
    if v.shape != k.shape or slot_mapping.shape != (n,):
        raise ValueError(f"k {tuple(k.shape)}, v {tuple(v.shape)} and slot_mapping {tuple(slot_mapping.shape)} "
                         "must be [N, kv_heads, head_dim], the same, and [N].")
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if cache.dim() != 4 or cache.shape[2:] != (heads, dim) or cache.shape[1] != k_cache.shape[1]:
            raise ValueError(f"{name} {tuple(cache.shape)} must be [num_blocks, block_size, {heads}, {dim}] "
                             "with the same block_size as k_cache.")
    if n == 0:
        return
    _write_kernel[(n,)](k, v, k_cache, v_cache, slot_mapping.contiguous(), k_cache.shape[1],
                        *k.stride(), *v.stride(), *k_cache.stride(), *v_cache.stride(),
                        **write_constants(heads, dim))


def write_kv_cache_ref(k, v, k_cache, v_cache, slot_mapping) -> None:
    """Plain-PyTorch reference: index assignment by block and offset (works on strided views of
    a larger tensor too, which ``.view(-1, ...)`` refuses)."""
    block_size = k_cache.shape[1]
    blocks, offsets = slot_mapping // block_size, slot_mapping % block_size
    k_cache[blocks, offsets] = k
    v_cache[blocks, offsets] = v
