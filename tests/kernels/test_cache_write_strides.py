"""The cache-write kernel addresses caches and inputs through their strides: a cache that is a
view (K and V halves of one tensor) or a strided k/v gets exactly what the reference writes, and
nothing else changes."""

import pytest
import torch

from course_lib.kernels.cache_write import write_kv_cache, write_kv_cache_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SLOTS = [0, 23, 7, 8, 13, 4]  # 6 blocks of 4: first and last slots, both sides of a block edge


def filled(shape, seed, dtype=torch.float32):
    """Distinct non-zero values everywhere, so a stray write is always visible."""
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) + 10).to(dtype).to(DEVICE)


def new_kv(n, heads, dim, dtype=torch.float32):
    return filled((n, heads, dim), 1, dtype), filled((n, heads, dim), 2, dtype)


def written(cache, slots):
    """Mask of the (block, offset) rows the slots point at."""
    mask = torch.zeros(cache.shape[:2], dtype=torch.bool, device=cache.device)
    mask.view(-1)[slots] = True
    return mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("heads, dim", [(2, 16), (3, 12), (1, 5)])
def test_separate_contiguous_caches(dtype, heads, dim):
    slots = torch.tensor(SLOTS, device=DEVICE)
    k, v = new_kv(len(SLOTS), heads, dim, dtype)
    before = [filled((6, 4, heads, dim), 3 + i, dtype) for i in range(2)]
    got, want = [c.clone() for c in before], [c.clone() for c in before]
    write_kv_cache(k, v, got[0], got[1], slots)
    write_kv_cache_ref(k, v, want[0], want[1], slots)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    rows = written(before[0], slots)
    assert torch.equal(got[0][~rows], before[0][~rows]) and torch.equal(got[1][~rows], before[1][~rows])
    assert torch.equal(got[0].view(-1, heads, dim)[slots], k) and torch.equal(got[1].view(-1, heads, dim)[slots], v)


@pytest.mark.parametrize("heads, dim", [(2, 16), (3, 12)])
def test_k_and_v_as_halves_of_one_tensor(heads, dim):
    """[blocks, 2, block, heads, dim]: kv[:, 0] has stride(0) = 2 * block * heads * dim, so
    slot * stride(1) alone would land in a V block."""
    slots = torch.tensor(SLOTS, device=DEVICE)
    k, v = new_kv(len(SLOTS), heads, dim)
    before = filled((6, 2, 4, heads, dim), 4)
    got, want = before.clone(), before.clone()
    write_kv_cache(k, v, got[:, 0], got[:, 1], slots)
    write_kv_cache_ref(k, v, want[:, 0], want[:, 1], slots)
    assert torch.equal(got, want)
    for half, new in ((0, k), (1, v)):
        blocks, offsets = slots // 4, slots % 4
        assert torch.equal(got[:, half][blocks, offsets], new)
        rows = written(got[:, half], slots)
        assert torch.equal(got[:, half][~rows], before[:, half][~rows])  # untouched slots of this half
    other_rows = written(got[:, 0], slots)
    assert torch.equal(got[:, 1][~other_rows], before[:, 1][~other_rows])


def test_strided_inputs_are_read_through_their_strides():
    heads, dim = 3, 12
    slots = torch.tensor(SLOTS, device=DEVICE)
    qkv = filled((len(SLOTS), 3 * heads + 1, dim + 4), 5)  # k and v are slices of a fused projection
    k, v = qkv[:, heads:2 * heads, 2:2 + dim], qkv[:, 2 * heads:3 * heads, 1:1 + dim]
    assert not k.is_contiguous() and not v.is_contiguous()
    before = filled((6, 2, 4, heads, dim), 6)
    got, want = before.clone(), before.clone()
    write_kv_cache(k, v, got[:, 0], got[:, 1], slots)
    write_kv_cache_ref(k, v, want[:, 0], want[:, 1], slots)
    assert torch.equal(got, want)
    assert torch.equal(got[:, 0][slots // 4, slots % 4], k) and torch.equal(got[:, 1][slots // 4, slots % 4], v)
    every_other_token = filled((2 * len(SLOTS), heads, dim), 7)[::2]  # a stride(0) that is not heads * dim
    got2, want2 = before.clone(), before.clone()
    write_kv_cache(every_other_token, every_other_token, got2[:, 0], got2[:, 1], slots)
    write_kv_cache_ref(every_other_token, every_other_token, want2[:, 0], want2[:, 1], slots)
    assert torch.equal(got2, want2)


def test_a_cache_with_permuted_heads_and_dims():
    """A cache stored [blocks, heads, block, dim] and viewed as [blocks, block, heads, dim]."""
    heads, dim = 2, 8
    slots = torch.tensor(SLOTS, device=DEVICE)
    k, v = new_kv(len(SLOTS), heads, dim)
    before = [filled((6, heads, 4, dim), 8 + i).transpose(1, 2) for i in range(2)]
    got, want = [c.clone(memory_format=torch.preserve_format) for c in before], [c.clone() for c in before]
    assert not got[0].is_contiguous()
    write_kv_cache(k, v, got[0], got[1], slots)
    write_kv_cache_ref(k, v, want[0], want[1], slots)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_the_reference_handles_views_that_view_refuses():
    heads, dim = 2, 4
    kv = torch.zeros(3, 2, 2, heads, dim, device=DEVICE)
    with pytest.raises(RuntimeError):
        kv[:, 0].view(-1, heads, dim)  # what the reference used to do
    k, v = new_kv(2, heads, dim)
    write_kv_cache_ref(k, v, kv[:, 0], kv[:, 1], torch.tensor([5, 0], device=DEVICE))
    assert torch.equal(kv[2, 0, 1], k[0]) and torch.equal(kv[0, 1, 0], v[1])
    assert kv.count_nonzero() == 4 * heads * dim


def test_no_tokens_is_a_no_op_and_bad_shapes_are_refused():
    cache = torch.zeros(2, 4, 2, 8, device=DEVICE)
    empty = torch.zeros(0, 2, 8, device=DEVICE)
    write_kv_cache(empty, empty, cache, cache.clone(), torch.zeros(0, dtype=torch.long, device=DEVICE))
    assert cache.count_nonzero() == 0
    with pytest.raises(ValueError, match="must be \\[num_blocks, block_size, 2, 8\\]"):
        write_kv_cache(torch.zeros(1, 2, 8), torch.zeros(1, 2, 8), torch.zeros(2, 4, 8, 2), cache,
                       torch.zeros(1, dtype=torch.long))
