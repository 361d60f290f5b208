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
    # batch 1 runs 8 programs (one per KV head) on 132 SMs: at most 8/132 of the peak
    assert share[(1, 16384)] <= 8 / 132 + 1e-9
    assert all(share[(b, 512)] < share[(b, 16384)] for b in BATCHES), "the launch cost matters most for small calls"
    assert sweep["predicted"] is True


def test_time_is_launch_plus_bytes_over_the_drawn_bandwidth():
    seconds = predicted_decode_seconds(H100, 132, 4096, heads=8, kv_heads=1, head_dim=128, launch_s=0)
    assert seconds == pytest.approx(decode_attention_bytes(132, 4096, 8, 1, 128, 2) / H100.hbm_bandwidth)
