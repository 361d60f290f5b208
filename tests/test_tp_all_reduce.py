"""The TP all-reduce model: one-shot, two-shot and the ring at hand-computed values, and their crossovers."""

import re

import pytest

from course_lib.perf.comm import RING
from course_lib.perf.interconnect import NVLINK_4, get_link
from course_lib.perf.tp_all_reduce import (
    ALL_REDUCES_PER_LAYER,
    DEFAULT_ALPHA_S,
    DEFAULT_BANDWIDTH,
    all_reduce_time,
    alpha_for_crossover,
    crossover_in_tokens,
    fastest,
    one_shot_max_tokens,
    one_shot_ring_crossover_bytes,
    one_shot_time,
    ring_time,
    tp_all_reduces_per_forward,
    tp_message_bytes,
    two_shot_crossover_bytes,
    two_shot_time,
)
from course_lib.perf import vllm_all_reduce
from course_lib.perf.units import KiB, format_bytes
from course_lib.quiz.bank import load_bank

ALPHA, B = 5e-6, 400e9


def test_times_at_hand_computed_values():
    k = 1 << 20  # 1 MiB on 8 GPUs
    assert one_shot_time(8, k, ALPHA, B) == pytest.approx(5e-6 + 7 * k / 400e9)
    assert two_shot_time(8, k, ALPHA, B) == pytest.approx(10e-6 + 2 * 7 / 8 * k / 400e9)
    assert ring_time(8, k, ALPHA, B) == pytest.approx(14 * 5e-6 + 2 * 7 / 8 * k / 400e9)
    assert ring_time(8, k, ALPHA, B) == RING.time(8, k, ALPHA, 1 / B)  # the ring is perf.comm's
    assert all_reduce_time("two-shot", 8, k, ALPHA, B) == two_shot_time(8, k, ALPHA, B)
    assert one_shot_time(1, k) == two_shot_time(1, k) == ring_time(1, k) == 0.0
    with pytest.raises(KeyError, match="one-shot"):
        all_reduce_time("tree", 8, k)
    with pytest.raises(ValueError):
        one_shot_time(8, k, alpha_s=0)


def test_crossover_at_hand_computed_value_and_closed_form():
    assert two_shot_crossover_bytes(8, ALPHA, B) == pytest.approx(380952.38, abs=0.01)  # 5e-6 * 400e9 * 8 / 42
    for n in (3, 4, 8, 16, 64):
        closed = ALPHA * B * n / ((n - 1) * (n - 2))
        assert two_shot_crossover_bytes(n, ALPHA, B) == pytest.approx(closed)
        assert one_shot_ring_crossover_bytes(n, ALPHA, B) == pytest.approx((2 * n - 3) * closed)


@pytest.mark.parametrize("n", [1, 2])
def test_two_ranks_never_cross(n):
    assert two_shot_crossover_bytes(n, ALPHA, B) is None
    assert one_shot_ring_crossover_bytes(n, ALPHA, B) is None
    for k in (1, 1 << 10, 1 << 30):
        assert fastest(n, k, ALPHA, B) == "one-shot"


@pytest.mark.parametrize("n", [3, 4, 8, 16])
def test_crossover_is_where_the_curves_cross(n):
    star = two_shot_crossover_bytes(n, ALPHA, B)
    assert one_shot_time(n, star, ALPHA, B) == pytest.approx(two_shot_time(n, star, ALPHA, B), rel=1e-12)
    assert one_shot_time(n, 0.9 * star, ALPHA, B) < two_shot_time(n, 0.9 * star, ALPHA, B)
    assert one_shot_time(n, 1.1 * star, ALPHA, B) > two_shot_time(n, 1.1 * star, ALPHA, B)
    assert fastest(n, 0.9 * star, ALPHA, B) == "one-shot" and fastest(n, 1.1 * star, ALPHA, B) == "two-shot"
    ring = one_shot_ring_crossover_bytes(n, ALPHA, B)
    assert one_shot_time(n, ring, ALPHA, B) == pytest.approx(ring_time(n, ring, ALPHA, B), rel=1e-12)
    assert one_shot_time(n, 0.9 * ring, ALPHA, B) < ring_time(n, 0.9 * ring, ALPHA, B)
    assert one_shot_time(n, 1.1 * ring, ALPHA, B) > ring_time(n, 1.1 * ring, ALPHA, B)
    for k in (1, star, ring, 1 << 30):  # two-shot: the ring's bytes in two rounds, never slower
        assert two_shot_time(n, k, ALPHA, B) <= ring_time(n, k, ALPHA, B)


def test_monotonic():
    sizes = [2**k for k in range(10, 27)]
    for name in ("one-shot", "two-shot", "ring"):
        times = [all_reduce_time(name, 8, k, ALPHA, B) for k in sizes]
        assert times == sorted(times) and len(set(times)) == len(times)
    # K* grows with alpha and bandwidth, falls with N
    assert two_shot_crossover_bytes(8, 2 * ALPHA, B) == pytest.approx(2 * two_shot_crossover_bytes(8, ALPHA, B))
    assert two_shot_crossover_bytes(8, ALPHA, 2 * B) == pytest.approx(2 * two_shot_crossover_bytes(8, ALPHA, B))
    stars = [two_shot_crossover_bytes(n, ALPHA, B) for n in (3, 4, 8, 16, 32)]
    assert stars == sorted(stars, reverse=True)


def test_defaults_are_the_nvlink_4_preset():
    link = get_link(NVLINK_4)
    assert (DEFAULT_ALPHA_S, DEFAULT_BANDWIDTH) == (link.alpha_s, link.bandwidth) == (1e-6, 450e9)
    assert two_shot_crossover_bytes(8) == pytest.approx(1e-6 * 450e9 * 8 / 42)


def test_tp_message_bytes_and_count():
    assert tp_message_bytes(1, 4096) == 8192  # one decode token of an 8B-class model, bf16
    assert tp_message_bytes(128, 8192, dtype_bytes=4) == 128 * 8192 * 4
    assert ALL_REDUCES_PER_LAYER == 2 and tp_all_reduces_per_forward(32) == 64
    with pytest.raises(ValueError):
        tp_message_bytes(0, 4096)
    with pytest.raises(ValueError):
        tp_all_reduces_per_forward(0)


def test_one_shot_max_tokens_is_where_fastest_stops_saying_one_shot():
    for n in (3, 4, 8, 16):
        for alpha, bandwidth in ((DEFAULT_ALPHA_S, DEFAULT_BANDWIDTH), (ALPHA, B)):
            most = one_shot_max_tokens(n, 8192, alpha, bandwidth)
            per_token = tp_message_bytes(1, 8192)
            if most:
                assert fastest(n, most * per_token, alpha, bandwidth) == "one-shot"
            assert fastest(n, (most + 1) * per_token, alpha, bandwidth) == "two-shot"
    assert one_shot_max_tokens(8, 8192) == 5 and one_shot_max_tokens(4, 8192) == 18  # K* 83.7 and 293 KiB
    assert one_shot_max_tokens(2, 8192) is None
    assert one_shot_max_tokens(8, 8192, alpha_s=1e-8) == 0  # K* below one token's 16 KiB


def test_the_alpha_that_makes_this_model_leave_one_shot_where_vllm_does():
    for n in (4, 6, 8):
        limit = vllm_all_reduce.one_shot_below(n)
        assert two_shot_crossover_bytes(n, alpha_for_crossover(n, limit)) == pytest.approx(limit)
    assert vllm_all_reduce.one_shot_below(8) == 256 * KiB
    assert alpha_for_crossover(8, 256 * KiB) == pytest.approx(3.06e-6, abs=0.01e-6)  # 3x the preset's 1 us
    with pytest.raises(ValueError, match="never overtakes"):
        alpha_for_crossover(2, 256 * KiB)


def test_256_kib_on_eight_gpus_has_one_answer_and_vllm_another():
    """Lesson 08's 16-token row and the review's row: this model picks two-shot on 8 GPUs, one-shot on
    4. vLLM on 8 H100s takes it off its custom kernel (which stops strictly below 256 KiB, always
    one-shot there) and runs PyTorch's multimem all-reduce; on 4 it runs one-shot too."""
    size = tp_message_bytes(16, 8192)
    assert size == 256 * KiB
    assert fastest(8, size) == "two-shot" and vllm_all_reduce.route(8, size) == vllm_all_reduce.MULTIMEM
    assert fastest(4, size) == "one-shot" == vllm_all_reduce.ALGORITHMS[vllm_all_reduce.route(4, size)]


@pytest.mark.parametrize("n", [2, 3, 4, 6, 8])
def test_the_crossover_line_quotes_the_model_and_vllm(n):
    lines = crossover_in_tokens(n, 8192).splitlines()
    most = one_shot_max_tokens(n, 8192)
    if most is None:
        assert lines[0].endswith("one-shot at every size (two-shot never wins)")
    else:
        assert f"one-shot for 1 to {most} tokens, two-shot from {most + 1}" in lines[0]
        assert f"(K* = {format_bytes(two_shot_crossover_bytes(n))})" in lines[0]
    phrases = vllm_all_reduce.phrases(n)
    assert lines[1].strip() == f"vLLM on {n} H100s, by message size:"
    assert [line.strip().split(": 1 to")[0] for line in lines[2:2 + len(phrases)]] == phrases
    limit = vllm_all_reduce.one_shot_below(n)
    if limit is not None:
        assert lines[2].endswith(f": 1 to {(limit - 1) // tp_message_bytes(1, 8192)} tokens")
    if limit is not None and n >= 3:
        assert f"α = {alpha_for_crossover(n, limit) * 1e6:.2f} µs instead of 1 µs" in lines[-1]
    assert all(len(line) <= 100 for line in lines), "long lines wrap mid-word in the notebook"


def test_quiz_08_crossover_question_is_this_models_k_star():
    """The bank's numbers are typed in its prompt: the answer it accepts must be K* for them."""
    question = load_bank("08_fused_tp").question("crossover-size")
    n, alpha_us, gb_s = re.search(r"N = (\d+), a = ([\d.]+) µs and B = ([\d.]+) GB/s", question.prompt).groups()
    star = two_shot_crossover_bytes(int(n), float(alpha_us) * 1e-6, float(gb_s) * 1e9)
    assert question.check(star / 1000).correct  # KB, as the prompt asks
    assert not question.check(star / 1024 * 0.9).correct


def test_quiz_08_crossover_question_flags_its_link_against_the_lessons():
    """Its link is not the lesson's: the prompt says so, and a learner who types the lesson's K* (in
    KB or KiB) is told which α and B this question uses."""
    question = load_bank("08_fused_tp").question("crossover-size")
    lesson = f"a = {DEFAULT_ALPHA_S * 1e6:g} µs and B = {DEFAULT_BANDWIDTH / 1e9:g} GB/s"
    assert lesson in question.prompt
    n, alpha_us, gb_s = re.search(r"N = (\d+), a = ([\d.]+) µs and B = ([\d.]+) GB/s", question.prompt).groups()
    assert (float(alpha_us) * 1e-6, float(gb_s) * 1e9) != (DEFAULT_ALPHA_S, DEFAULT_BANDWIDTH)
    for typed in (two_shot_crossover_bytes(int(n)) / 1000, two_shot_crossover_bytes(int(n)) / 1024):
        feedback = question.check(round(typed, 1))
        assert not feedback.correct and f"a = {alpha_us} µs and B = {gb_s} GB/s" in feedback.message
    assert f"K* is {two_shot_crossover_bytes(int(n)) / 1000:.1f} KB" in question.explanation
