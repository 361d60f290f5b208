"""Write new keys and values into the paged KV cache through a slot mapping."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _write_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slots_ptr, stride_kn, stride_cs,
                  WIDTH: tl.constexpr, WIDTH_PAD: tl.constexpr):
    token = tl.program_id(0)
    slot = tl.load(slots_ptr + token).to(tl.int64)
    cols = tl.arange(0, WIDTH_PAD)
    ok = cols < WIDTH
    tl.store(k_cache_ptr + slot * stride_cs + cols, tl.load(k_ptr + token * stride_kn + cols, mask=ok), mask=ok)
    tl.store(v_cache_ptr + slot * stride_cs + cols, tl.load(v_ptr + token * stride_kn + cols, mask=ok), mask=ok)


def write_kv_cache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   slot_mapping: torch.Tensor) -> None:
    """Store ``k``/``v`` ``[N, kv_heads, head_dim]`` at slots ``slot_mapping[N]`` of caches
    ``[num_blocks, block_size, kv_heads, head_dim]`` (one program per token)."""
    k, v = k.contiguous(), v.contiguous()
    width = k.shape[1] * k.shape[2]
    _write_kernel[(k.shape[0],)](k, v, k_cache, v_cache, slot_mapping.contiguous(), k.stride(0), k_cache.stride(1),
                                 WIDTH=width, WIDTH_PAD=triton.next_power_of_2(width))


def write_kv_cache_ref(k, v, k_cache, v_cache, slot_mapping) -> None:
    """Plain-PyTorch reference: index assignment into the flattened caches."""
    k_cache.view(-1, *k.shape[1:])[slot_mapping] = k
    v_cache.view(-1, *v.shape[1:])[slot_mapping] = v
