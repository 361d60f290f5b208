"""Each Triton kernel against its PyTorch reference (under TRITON_INTERPRET=1 on a CPU)."""

import random

import pytest
import torch

from course_lib.kernels.cache_write import write_kv_cache, write_kv_cache_ref
from course_lib.kernels.paged_attention import (
    paged_decode_attention,
    paged_decode_attention_ref,
    paged_prefill_attention,
    paged_prefill_attention_ref,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def scattered_cache(lengths, block_size, kv_heads, dim, dtype, seed):
    """Random caches with each sequence's blocks scattered over the pool, and its block table."""
    rng = random.Random(seed)
    counts = [-(-n // block_size) for n in lengths]
    num_blocks = sum(counts) + 3
    order = list(range(num_blocks))
    rng.shuffle(order)
    width = max(counts)
    tables = torch.zeros(len(lengths), width, dtype=torch.int32)
    used = 0
    for r, count in enumerate(counts):
        tables[r, :count] = torch.tensor(order[used:used + count])
        used += count
    shape = (num_blocks, block_size, kv_heads, dim)
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(shape, generator=gen).to(dtype)
    v = torch.randn(shape, generator=gen).to(dtype)
    return k.to(DEVICE), v.to(DEVICE), tables.to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("block_size, heads, kv_heads, dim, lengths", [
    (4, 4, 4, 16, [1, 4, 9]),  # MHA; a single token, an exact block, a partial block
    (8, 8, 2, 32, [16, 3, 17, 8]),  # GQA 4:1
    (16, 6, 2, 16, [33, 1, 16]),  # GQA 3:1 (padded group)
    (2, 4, 1, 16, [5, 2]),  # MQA, tiny blocks
])
def test_decode_kernel_matches_reference(dtype, block_size, heads, kv_heads, dim, lengths):
    k_cache, v_cache, tables = scattered_cache(lengths, block_size, kv_heads, dim, dtype, seed=len(lengths))
    q = torch.randn(len(lengths), heads, dim, generator=torch.Generator().manual_seed(1)).to(dtype).to(DEVICE)
    seq_lens = torch.tensor(lengths, device=DEVICE)
    got = paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, dim ** -0.5)
    want = paged_decode_attention_ref(q, k_cache, v_cache, tables, seq_lens, dim ** -0.5)
    torch.testing.assert_close(got.float(), want.float(), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("block_size, heads, kv_heads, num_partitions, lengths", [
    (4, 4, 2, 3, [12, 13, 11]),  # partitions of 4 tokens: exact, one token over, one short (an empty third)
    (4, 4, 2, 5, [1, 20, 6]),  # length 1: four empty partitions; 20 fills all five
    (8, 8, 2, 2, [9, 16, 17]),  # a partition boundary inside a block's range, at an exact block, past it
    (2, 2, 2, 8, [15, 3]),  # many short partitions of 2-token blocks
    (4, 6, 2, 3, [12, 5]),  # GQA 3 padded to 4: the padded row's state is never stored
])
def test_split_kv_decode_matches_reference(dtype, block_size, heads, kv_heads, num_partitions, lengths):
    """Flash-decoding: each partition's softmax state, combined by the reduction kernel."""
    dim = 16
    k_cache, v_cache, tables = scattered_cache(lengths, block_size, kv_heads, dim, dtype, seed=7)
    q = torch.randn(len(lengths), heads, dim, generator=torch.Generator().manual_seed(3)).to(dtype).to(DEVICE)
    seq_lens = torch.tensor(lengths, device=DEVICE)
    got = paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, dim ** -0.5, num_partitions=num_partitions)
    want = paged_decode_attention_ref(q, k_cache, v_cache, tables, seq_lens, dim ** -0.5)
    torch.testing.assert_close(got.float(), want.float(), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


def test_the_default_split_of_a_long_context_matches_reference():
    """One sequence of 600 tokens on 2 KV heads: the wrapper picks 2 partitions (600 // 256) itself."""
    lengths, dim = [600], 16
    k_cache, v_cache, tables = scattered_cache(lengths, 16, 2, dim, torch.float32, seed=9)
    q = torch.randn(1, 4, dim, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    seq_lens = torch.tensor(lengths, device=DEVICE)
    got = paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, dim ** -0.5, max_seq_len=600)
    want = paged_decode_attention_ref(q, k_cache, v_cache, tables, seq_lens, dim ** -0.5)
    torch.testing.assert_close(got, want, atol=TOLERANCE[torch.float32], rtol=TOLERANCE[torch.float32])


def test_the_context_is_split_only_when_the_gpu_would_idle():
    from course_lib.perf.attention_roofline import (MAX_PARTITIONS, MIN_PARTITION_TOKENS, choose_num_partitions,
                                                    partition_plan)

    assert choose_num_partitions(batch=1, kv_heads=8, max_len=16384, sm_count=132) == 33  # 2 x 132 SMs / 8
    assert partition_plan(16384, 16, 33) == (32, 512)  # whole blocks: 32 partitions of 512 tokens
    assert partition_plan(17, 16, 2) == (2, 16) and partition_plan(5, 16, 3) == (1, 16)
    assert choose_num_partitions(batch=1, kv_heads=1, max_len=131072, sm_count=132) == MAX_PARTITIONS
    assert choose_num_partitions(batch=64, kv_heads=8, max_len=16384, sm_count=132) == 1  # 512 programs already
    assert choose_num_partitions(batch=1, kv_heads=8, max_len=1024, sm_count=132) == 1024 // MIN_PARTITION_TOKENS
    assert choose_num_partitions(batch=1, kv_heads=8, max_len=100, sm_count=132) == 1  # too short to split


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("block_size, heads, kv_heads, query_lens, seq_lens", [
    (4, 4, 2, [5, 1, 3], [5, 9, 12]),  # a fresh prompt, a decode, a chunk after cached tokens
    (8, 4, 4, [20, 8], [20, 24]),  # queries spanning several query tiles and exact blocks
    (16, 2, 1, [7], [39]),  # a prefix-cache hit: 32 cached tokens, 7 new
])
def test_prefill_kernel_matches_reference(dtype, block_size, heads, kv_heads, query_lens, seq_lens):
    """Tiles of 4 queries: the broadcast multiply-add path."""
    check_prefill(dtype, block_size, heads, kv_heads, query_lens, seq_lens, dim=16, block_m=4)


BF16_DOT = pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    DEVICE == "cpu", reason="Triton 3.9's interpreter multiplies bfloat16's raw bits in tl.dot (its create_dot "
    "converts only fp8 inputs), so the bf16 tensor-core path is checked on a GPU (./course gpu-report)"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, BF16_DOT], ids=str)
@pytest.mark.parametrize("block_size, dim, query_lens, seq_lens", [
    (16, 16, [5, 1, 3], [5, 9, 12]),  # short rows in a 16-query tile, a decode row among them
    (16, 32, [40, 8], [40, 56]),  # three query tiles, and a chunk after 48 cached tokens
    (32, 16, [17], [81]),  # 64 cached tokens in 32-token blocks, a tile of 16 plus one query
])
def test_prefill_kernel_on_tensor_cores_matches_reference(dtype, block_size, dim, query_lens, seq_lens):
    """Tiles of 16 queries, blocks and head sizes of 16 or more: the tl.dot path."""
    from course_lib.kernels.paged_attention import prefill_constants

    assert prefill_constants(1, block_size, dim, dtype=dtype)["USE_DOT"]
    check_prefill(dtype, block_size, 4, 2, query_lens, seq_lens, dim=dim, block_m=16)


def test_bf16_prefill_in_the_interpreter_avoids_its_tl_dot():
    """The interpreter's tl.dot is wrong for bfloat16, so there the wrapper keeps the broadcast path."""
    from course_lib.kernels.paged_attention import prefill_constants

    interpreting = DEVICE == "cpu"
    assert prefill_constants(4, 16, 32, dtype=torch.bfloat16)["USE_DOT"] is not interpreting
    assert prefill_constants(4, 16, 32, dtype=torch.float16)["USE_DOT"]
    check_prefill(torch.bfloat16, 16, 4, 2, [40, 8], [40, 56], dim=32, block_m=16)


def check_prefill(dtype, block_size, heads, kv_heads, query_lens, seq_lens, dim, block_m):
    k_cache, v_cache, tables = scattered_cache(seq_lens, block_size, kv_heads, dim, dtype, seed=3)
    q = torch.randn(sum(query_lens), heads, dim, generator=torch.Generator().manual_seed(2)).to(dtype).to(DEVICE)
    starts = torch.tensor([0] + list(torch.tensor(query_lens).cumsum(0)), device=DEVICE)
    lens = torch.tensor(seq_lens, device=DEVICE)
    got = paged_prefill_attention(q, k_cache, v_cache, tables, starts, lens, dim ** -0.5, block_m=block_m)
    want = paged_prefill_attention_ref(q, k_cache, v_cache, tables, starts, lens, dim ** -0.5)
    torch.testing.assert_close(got.float(), want.float(), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_cache_write_matches_reference(dtype):
    caches = [torch.zeros(6, 4, 2, 16, dtype=dtype, device=DEVICE) for _ in range(4)]
    k = torch.randn(5, 2, 16).to(dtype).to(DEVICE)
    v = torch.randn(5, 2, 16).to(dtype).to(DEVICE)
    slots = torch.tensor([0, 23, 7, 8, 13], device=DEVICE)
    write_kv_cache(k, v, caches[0], caches[1], slots)
    write_kv_cache_ref(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


def test_non_power_of_two_blocks_are_refused():
    cache = torch.zeros(4, 3, 1, 16)
    with pytest.raises(ValueError, match="block_size=3 must be a power of two"):
        paged_decode_attention(torch.zeros(1, 1, 16), cache, cache, torch.zeros(1, 1, dtype=torch.int32),
                               torch.tensor([2]), 1.0)
