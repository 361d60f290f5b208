"""The attention kernels on an fp8 (e4m3) KV cache, under TRITON_INTERPRET=1 on a CPU: every byte
is decoded exactly, decode (single pass and split) and prefill equal their PyTorch references
(which dequantize the same way), and the Triton backend's write stores what the PyTorch backend's
does."""

import pytest
import torch

from course_lib.engine.attention import build_metadata
from course_lib.kernels.paged_attention import (paged_decode_attention, paged_decode_attention_ref,
                                                paged_prefill_attention, paged_prefill_attention_ref)
from course_lib.kv_cache.fp8 import FP8_DTYPE, quantize_fp8

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytest.importorskip("triton")
TOLERANCE = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}  # as test_kernels.py


def fp8_cache(blocks, block_size, kv_heads, dim, scale, generator):
    """Standard normal values stored with ``scale`` (codes of about +-1 / scale)."""
    return quantize_fp8(torch.randn(blocks, block_size, kv_heads, dim, generator=generator), scale).to(DEVICE)


def test_every_finite_e4m3_code_is_decoded_exactly():
    """One-token contexts: each output row is the one cached V row, decoded and scaled (weight 1)."""
    codes = torch.arange(256, dtype=torch.uint8)
    codes = codes[(codes & 0x7F) != 0x7F]  # all but the two NaNs: 254 codes
    v = torch.zeros(8, 1, 2, 32, dtype=torch.uint8)
    v.view(-1)[:len(codes)] = codes
    v_cache = v.view(FP8_DTYPE).to(DEVICE)
    k_cache = torch.zeros_like(v_cache)
    q = torch.randn(8, 2, 32, device=DEVICE)
    out = paged_decode_attention(q, k_cache, v_cache, torch.arange(8, dtype=torch.int32, device=DEVICE)[:, None],
                                 torch.ones(8, dtype=torch.int32, device=DEVICE), 1.0, k_scale=1.0, v_scale=0.5)
    want = v_cache.float().flatten(1, 2) * 0.5  # torch's own e4m3 -> float32
    assert torch.equal(out.cpu(), want.cpu())


def close(got, want, dtype):
    """tests/kernels/test_kernels.py's tolerances: the interpreter rounds bfloat16 its own way, so a
    GPU agrees more closely than this."""
    torch.testing.assert_close(got.float(), want.float(), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_decode_and_prefill_on_an_fp8_cache_equal_their_references(dtype):
    gen = torch.Generator().manual_seed(0)
    k_scale, v_scale = 1 / 100, 1 / 50
    k_cache, v_cache = (fp8_cache(12, 16, 2, 32, s, gen) for s in (k_scale, v_scale))
    tables = torch.randperm(12, generator=gen)[:12].reshape(3, 4).int().to(DEVICE)
    lens = torch.tensor([64, 17, 40], device=DEVICE)
    scales = dict(k_scale=k_scale, v_scale=v_scale)
    q = torch.randn(3, 4, 32, generator=gen).to(dtype).to(DEVICE)
    want = paged_decode_attention_ref(q, k_cache, v_cache, tables, lens, 0.2, **scales)
    for parts in (1, 2):
        got = paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.2, num_partitions=parts, **scales)
        close(got, want, dtype)
    starts = torch.tensor([0, 5, 6, 26], device=DEVICE)
    q = torch.randn(26, 4, 32, generator=gen).to(dtype).to(DEVICE)
    got = paged_prefill_attention(q, k_cache, v_cache, tables, starts, lens, 0.2, **scales)
    want = paged_prefill_attention_ref(q, k_cache, v_cache, tables, starts, lens, 0.2, **scales)
    close(got, want, dtype)


def test_the_triton_write_stores_the_pytorch_backends_bytes():
    from course_lib.engine.triton_attention import TritonAttentionMetadata

    gen = torch.Generator().manual_seed(1)
    slots, query_lens, seq_lens, tables = [3, 17, 18, 30], [1, 3], [4, 19], [[0], [0, 1]]
    k, v = (torch.randn(4, 2, 32, generator=gen).to(DEVICE) for _ in range(2))
    caches = []
    for build in (build_metadata, TritonAttentionMetadata.build):
        cache = torch.zeros(2, 2, 16, 2, 32, dtype=FP8_DTYPE, device=DEVICE)
        build(slots, query_lens, seq_lens, tables, 16, DEVICE).write(cache, k, v, (0.01, 0.02))
        caches.append(cache.view(torch.uint8))
    assert torch.equal(caches[0], caches[1]) and caches[0].any()
