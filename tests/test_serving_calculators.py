"""Serving calculators: P:D ratio, KV-transfer time, speculative decoding's tokens per step."""

import pytest

from course_lib.perf.hardware import get_gpu
from course_lib.perf.models import get_model
from course_lib.perf.roofline import step_cost
from course_lib.perf.serving import (
    decode_tpot_s,
    expected_tokens_per_step,
    kv_transfer,
    pd_ratio,
    prefill_requests_per_s,
)

H100, LLAMA_8B, LLAMA_70B = get_gpu("H100-80GB"), get_model("Llama-3.1-8B"), get_model("Llama-3.1-70B")


def test_pd_ratio_worked_example_comes_out_exactly():
    ratio = pd_ratio(num_seqs=256, tpot_s=0.040, output_len=500, prefill_requests_per_s=10)
    assert ratio.decode_tokens_per_s == 6400
    assert ratio.decode_requests_per_s == 12.8
    assert ratio.prefill_per_decode == 1.28
    assert ratio.prefill_instances_for(1) == 2 and ratio.prefill_instances_for(25) == 32


def test_pd_ratio_from_the_roofline_needs_more_prefill_for_longer_prompts():
    decode = dict(num_seqs=128, tpot_s=decode_tpot_s(LLAMA_8B, H100, 128, 2000), output_len=300)
    short, long = (pd_ratio(**decode, prefill_requests_per_s=prefill_requests_per_s(LLAMA_8B, H100, n))
                   for n in (1000, 8000))
    assert long.prefill_per_decode > 7 * short.prefill_per_decode
    # one whole prompt per step: requests/s is the inverse of the roofline's step time
    assert prefill_requests_per_s(LLAMA_8B, H100, 4000) == pytest.approx(1 / step_cost(LLAMA_8B, H100, [(0, 4000)]).time_s)
    # short prompts share each step's weight reads, so batching them serves more per second
    assert prefill_requests_per_s(LLAMA_8B, H100, 50, prompts_per_step=8) > 3 * prefill_requests_per_s(LLAMA_8B, H100, 50)


@pytest.mark.parametrize("bad", [dict(tpot_s=0), dict(num_seqs=-1), dict(prefill_requests_per_s=0)])
def test_pd_ratio_rejects_non_positive_inputs(bad):
    with pytest.raises(ValueError, match="pass a value above 0"):
        pd_ratio(**{**dict(num_seqs=256, tpot_s=0.04, output_len=500, prefill_requests_per_s=10), **bad})


def test_kv_transfer_of_10k_tokens_of_llama_70b():
    """The rule of thumb says 'about 3.3 GB, about 65 ms'; the preset gives 327,680 bytes per token
    (2 x 80 layers x 8 KV heads x 128 x 2 bytes), so 3.2768 GB and 65.5 ms at 50 GB/s."""
    transfer = kv_transfer(LLAMA_70B, 10_000, link_bandwidth=50e9)
    assert transfer.bytes == 10_000 * 2 * 80 * 8 * 128 * 2 == 3_276_800_000
    assert transfer.time_s == pytest.approx(0.065536) and transfer.exposed_s == transfer.time_s
    assert transfer.bytes / 1e9 == pytest.approx(3.3, abs=0.05) and transfer.time_s == pytest.approx(0.065, abs=0.001)


def test_pipelining_exposes_only_the_last_layers_share_when_the_link_keeps_up():
    piped = kv_transfer(LLAMA_70B, 10_000, 50e9, pipelined=True)
    assert piped.exposed_s == pytest.approx(0.065536 / 80)  # 0.82 ms
    # a 10k-token prefill of a 70B model takes seconds, far longer than the transfer
    assert kv_transfer(LLAMA_70B, 10_000, 50e9, pipelined=True, compute_s=2.0).exposed_s == piped.exposed_s
    # a link too slow to keep up leaves what the compute could not hide
    slow = kv_transfer(LLAMA_70B, 10_000, 1e9, pipelined=True, compute_s=2.0)
    assert slow.exposed_s == pytest.approx(3.2768 - 2.0 * 79 / 80)


def test_kv_transfer_scales_with_dtype_and_rejects_bad_input():
    assert kv_transfer(LLAMA_70B, 10_000, 50e9, kv_dtype="fp8").bytes == 3_276_800_000 / 2
    with pytest.raises(ValueError, match="link_bandwidth"):
        kv_transfer(LLAMA_70B, 10_000, 0)
    with pytest.raises(ValueError, match="compute_s"):
        kv_transfer(LLAMA_70B, 10_000, 50e9, pipelined=True, compute_s=-1)


def test_expected_tokens_per_step():
    assert expected_tokens_per_step(0.8, 4) == pytest.approx(3.3616)
    assert expected_tokens_per_step(1.0, 4) == 5 and expected_tokens_per_step(0.0, 4) == 1
    assert expected_tokens_per_step(0.5, 0) == 1
    gains = [expected_tokens_per_step(0.8, k + 1) - expected_tokens_per_step(0.8, k) for k in range(6)]
    assert all(later < earlier for earlier, later in zip(gains, gains[1:]))  # each extra draft adds less
    for bad in (dict(acceptance_rate=1.2, num_draft_tokens=4), dict(acceptance_rate=0.8, num_draft_tokens=-1)):
        with pytest.raises(ValueError, match="must"):
            expected_tokens_per_step(**bad)
