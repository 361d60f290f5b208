"""The engine's Triton attention backend (``attention_backend="triton"``).

Same contract as the PyTorch backend in ``attention.py``: metadata built once per step, then
``write`` and ``attend`` per layer. Decoding requests go through the decode kernel in one
launch; requests with several new tokens (prefill chunks) through the prefill kernel.

An fp8 cache (``kv_cache_dtype="fp8"``): ``write`` quantizes K and V with the layer's scales
(``quantize_fp8``, the PyTorch backend's rounding) and the write kernel stores their bytes; the
attention kernels decode the bytes in registers (``kernels/paged_attention.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from course_lib.engine.attention import pad_block_tables, query_starts
from course_lib.kernels.cache_write import write_kv_cache
from course_lib.kernels.paged_attention import (
    paged_decode_attention,
    paged_prefill_attention,
)
from course_lib.kv_cache.fp8 import is_fp8, quantize_fp8, required_scales


@dataclass
class TritonAttentionMetadata:
    slot_mapping: torch.Tensor
    decode_rows: torch.Tensor  # rows of decoding requests' queries
    decode_tables: torch.Tensor
    decode_lens: torch.Tensor
    prefill_rows: torch.Tensor  # rows of all other requests' queries, request after request
    prefill_starts: torch.Tensor  # [P + 1] offsets into prefill_rows
    prefill_tables: torch.Tensor
    prefill_lens: torch.Tensor
    decode_max_len: int  # the longest decoding context, known here without asking the GPU
    prefill_max_query_len: int

    @classmethod
    def build(cls, slot_mapping: list[int], query_lens: list[int], seq_lens: list[int],
              block_tables: list[list[int]], block_size: int, device) -> "TritonAttentionMetadata":
        starts = query_starts(query_lens)
        decode = [r for r, n in enumerate(query_lens) if n == 1]
        prefill = [r for r, n in enumerate(query_lens) if n > 1]
        prefill_starts = [0]
        for r in prefill:
            prefill_starts.append(prefill_starts[-1] + query_lens[r])

        def ints(values):
            return torch.tensor(values, dtype=torch.int32, device=device)

        return cls(
            slot_mapping=torch.tensor(slot_mapping, dtype=torch.long, device=device),
            decode_rows=torch.tensor([starts[r] for r in decode], dtype=torch.long, device=device),
            decode_tables=pad_block_tables([block_tables[r] for r in decode], device, torch.int32),
            decode_lens=ints([seq_lens[r] for r in decode]),
            prefill_rows=torch.tensor([i for r in prefill for i in range(starts[r], starts[r + 1])],
                                      dtype=torch.long, device=device),
            prefill_starts=ints(prefill_starts),
            prefill_tables=pad_block_tables([block_tables[r] for r in prefill], device, torch.int32),
            prefill_lens=ints([seq_lens[r] for r in prefill]),
            decode_max_len=max((seq_lens[r] for r in decode), default=0),
            prefill_max_query_len=max((query_lens[r] for r in prefill), default=0),
        )

    def write(self, kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              kv_scales: tuple[float, float] | None = None) -> None:
        if is_fp8(kv_cache):  # the kernel copies elements: e4m3 codes as bytes
            k_scale, v_scale = required_scales(kv_scales)
            k, v = quantize_fp8(k, k_scale).view(torch.uint8), quantize_fp8(v, v_scale).view(torch.uint8)
            kv_cache = kv_cache.view(torch.uint8)
        write_kv_cache(k, v, kv_cache[0], kv_cache[1], self.slot_mapping)

    def attend(self, q: torch.Tensor, kv_cache: torch.Tensor, scale: float,
               kv_scales: tuple[float, float] | None = None) -> torch.Tensor:
        k_scale, v_scale = required_scales(kv_scales) if is_fp8(kv_cache) else (1.0, 1.0)  # ignored unless fp8
        out = torch.empty_like(q)
        if len(self.decode_rows):
            out[self.decode_rows] = paged_decode_attention(q[self.decode_rows], kv_cache[0], kv_cache[1],
                                                           self.decode_tables, self.decode_lens, scale,
                                                           max_seq_len=self.decode_max_len,
                                                           k_scale=k_scale, v_scale=v_scale)
        if len(self.prefill_rows):
            out[self.prefill_rows] = paged_prefill_attention(q[self.prefill_rows], kv_cache[0], kv_cache[1],
                                                             self.prefill_tables, self.prefill_starts,
                                                             self.prefill_lens, scale,
                                                             max_query_len=self.prefill_max_query_len,
                                                             k_scale=k_scale, v_scale=v_scale)
        return out
