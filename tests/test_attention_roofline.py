"""The roofline's prediction for the decode-attention sweep that lesson 01 shows before any GPU result exists."""

import pytest

from course_lib.perf.attention_roofline import (BATCHES, CONTEXTS, decode_attention_bytes, predicted_decode_seconds,
                                                predicted_decode_sweep)
from course_lib.perf.hardware import get_gpu

H100 = get_gpu("H100-80GB")


def test_bytes_are_the_kv_of_every_context_token_plus_queries_and_outputs():
    # batch 2, context 100, 4 query heads, 2 KV heads, dim 8, bf16: K+V 2*2*100*2*8*2, q+out 2*2*4*8*2
    assert decode_attention_bytes(2, 100, 4, 2, 8, 2) == 12800 + 256


def test_big_batches_reach_the_bandwidth_roof_and_small_ones_cannot():
    sweep = predicted_decode_sweep(H100)
    share = {(r["batch"], r["context"]): r["paged_gb_per_s"] * 1e9 / H100.hbm_bandwidth for r in sweep["rows"]}
    assert set(share) == {(b, c) for b in BATCHES for c in CONTEXTS}
    assert share[(128, 16384)] > 0.95
    # batch 1 at 512 tokens: 8 programs (one per KV head, too short to split) on 132 SMs
    assert share[(1, 512)] <= 8 / 132 + 1e-9
    # at 16k the context splits into 32 partitions: 256 programs fill the GPU, two launches
    assert 0.5 < share[(1, 16384)] < share[(128, 16384)]
    assert all(share[(b, 512)] < share[(b, 16384)] for b in BATCHES), "the launch cost matters most for small calls"
    assert sweep["predicted"] is True


def test_a_split_pays_a_second_launch_and_its_partial_states():
    from course_lib.perf.attention_roofline import LAUNCH_S

    seconds = predicted_decode_seconds(H100, 1, 16384)  # 32 partitions x 8 KV heads = 256 programs
    moved = decode_attention_bytes(1, 16384, 32, 8, 128, 2) + 2 * 32 * 32 * 130 * 4
    assert seconds == pytest.approx(2 * LAUNCH_S + moved / H100.hbm_bandwidth)


def test_time_is_launch_plus_bytes_over_the_drawn_bandwidth():
    # 264 sequences x 1 KV head: two programs per SM already, so no split
    seconds = predicted_decode_seconds(H100, 264, 4096, heads=8, kv_heads=1, head_dim=128, launch_s=0)
    assert seconds == pytest.approx(decode_attention_bytes(264, 4096, 8, 1, 128, 2) / H100.hbm_bandwidth)
