"""The engine's CPU attention backend (``attention_backend="cpu"``), vLLM's split on a CPU:
decoding requests (one new token each) through a C++ kernel that reads their K/V blocks in place
(``kernels/cpu_paged_attention.py``), all of them in one call; prefill chunks and speculative
verifications through the PyTorch backend's SDPA (``attention.py``), whose cache write it also
uses. Same contract as the other backends: metadata built once per step, then ``write`` and
``attend`` in every layer. float32 and float64 KV caches (``engine/backend.py`` picks it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from course_lib.engine.attention import (TorchAttentionMetadata, build_metadata, pad_block_tables, paged_attention,
                                         query_starts, row_index)
from course_lib.kernels.cpu_paged_attention import paged_decode_attention_cpu


@dataclass
class CpuAttentionMetadata:
    others: TorchAttentionMetadata  # the PyTorch backend's metadata, without decode buckets
    decode_rows: slice | torch.Tensor | None  # decoding requests' query rows (a slice when consecutive)
    decode_tables: torch.Tensor  # [decodes, longest table], padded with block 0
    decode_lens: torch.Tensor  # [decodes] context lengths, the new token included

    @classmethod
    def build(cls, slot_mapping: list[int], query_lens: list[int], seq_lens: list[int],
              block_tables: list[list[int]], block_size: int, device) -> "CpuAttentionMetadata":
        others = build_metadata(slot_mapping, query_lens, seq_lens, block_tables, block_size, device,
                                with_decodes=False)
        starts = query_starts(query_lens)
        decode = [r for r, n in enumerate(query_lens) if n == 1]
        decode_rows = row_index([starts[r] for r in decode], device) if decode else None
        return cls(others, decode_rows, pad_block_tables([block_tables[r] for r in decode], device),
                   torch.tensor([seq_lens[r] for r in decode], dtype=torch.long, device=device))

    def write(self, kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              kv_scales: tuple[float, float] | None = None) -> None:
        self.others.write(kv_cache, k, v, kv_scales)

    def attend(self, q: torch.Tensor, kv_cache: torch.Tensor, scale: float,
               kv_scales: tuple[float, float] | None = None) -> torch.Tensor:
        out = paged_attention(q, kv_cache, self.others, scale, kv_scales)
        rows = self.decode_rows
        if isinstance(rows, slice) and out[rows].is_contiguous():  # the kernel writes straight into ``out``
            paged_decode_attention_cpu(q[rows], kv_cache[0], kv_cache[1], self.decode_tables, self.decode_lens,
                                       scale, out=out[rows])
        elif rows is not None:
            out[rows] = paged_decode_attention_cpu(q[rows], kv_cache[0], kv_cache[1], self.decode_tables,
                                                   self.decode_lens, scale)
        return out
