import math

import pytest

from course_lib.perf.hardware import GPUS, get_gpu, tensor_parallel_group
from course_lib.perf.kv import kv_bytes_per_batch
from course_lib.perf.models import get_model
from course_lib.perf.quant_cost import (
    BF16, FP8_W8A8, SCHEMES, W4A16, QuantScheme, SchemeUnavailableError, best_scheme, crossover_batch,
    decode_step_cost, decode_step_time, get_scheme, max_batch_in_memory, min_gpus_for_batch, min_gpus_for_weights,
    scheme_table, weight_memory,
)
from course_lib.perf.roofline import Efficiency, step_cost

H100, A100 = get_gpu("H100-80GB"), get_gpu("A100-80GB")
L8, L70 = get_model("Llama-3.1-8B"), get_model("Llama-3.1-70B")
EXACT = Efficiency(compute=1.0, memory=1.0, overhead_s=0.0)
FP8_GPUS = [g for g in GPUS.values() if g.fp8_flops]
NO_FP8_GPUS = [g for g in GPUS.values() if not g.fp8_flops]


def test_bytes_per_weight_include_the_group_scales():
    assert W4A16.bits_per_weight == 4 + 16 / 128 == 4.125  # one fp16 scale per 128 weights
    assert (BF16.bytes_per_weight, W4A16.bytes_per_weight, FP8_W8A8.bytes_per_weight) == (2, 0.515625, 1)
    assert QuantScheme("W4A16-g64", 4, "bf16", group_size=64, scale_bits=16).bits_per_weight == 4.25
    assert weight_memory(L8, "W4A16") < weight_memory(L8, "FP8-W8A8") < weight_memory(L8, "BF16")
    with pytest.raises(KeyError, match="choose one of"):
        get_scheme("int3")
    with pytest.raises(ValueError, match="group_size"):
        QuantScheme("bad", 4, "bf16", scale_bits=16)


def test_llama_70b_in_bf16_needs_two_h100s_before_any_kv_cache():
    assert weight_memory(L70, "BF16") == pytest.approx(141.2e9)
    assert weight_memory(L70, "BF16") > H100.memory_bytes  # 80 GiB = 85.9 GB
    assert min_gpus_for_weights(L70, "BF16", H100) == 2
    assert min_gpus_for_weights(L70, "FP8-W8A8", H100) == 1  # 70.6 GB
    assert min_gpus_for_weights(L70, "W4A16", H100) == 1  # 36.4 GB
    assert min_gpus_for_weights(L70, "W4A16", get_gpu("L4-24GB")) == 2
    assert min_gpus_for_weights(L8, "BF16", H100) == 1
    assert max_batch_in_memory(L70, "BF16", H100) == 0  # nothing left for KV
    assert max_batch_in_memory(L70, "FP8-W8A8", tensor_parallel_group(H100, 2)) > \
        max_batch_in_memory(L70, "FP8-W8A8", H100) > 0


def test_gpus_for_a_checkpoint_count_its_16_bit_embeddings():
    """Sized as weight_memory sizes them: Mixtral-8x7B in W4A16 fits one L4 (24.15 GB) with every
    weight quantized (24.08 GB), not as checkpoints ship it (24.47 GB, embeddings and lm_head in 16 bits)."""
    mixtral, l4 = get_model("Mixtral-8x7B"), get_gpu("L4-24GB")
    assert weight_memory(mixtral, "W4A16") < l4.memory_bytes < weight_memory(mixtral, "W4A16", quantized_embeddings=False)
    assert min_gpus_for_weights(mixtral, "W4A16", l4) == 1
    assert min_gpus_for_weights(mixtral, "W4A16", l4, quantized_embeddings=False) == 2
    assert min_gpus_for_weights(L70, "W4A16", H100, quantized_embeddings=False) == 1  # 39.5 GB


def test_decode_step_matches_a_hand_count_and_reuses_the_roofline():
    cost = decode_step_cost(L8, "W4A16", H100, 1, context_len=1024, efficiency=EXACT)
    attention = 4 * 32 * 32 * 128 * 1025
    assert cost.flops == pytest.approx(2 * 8.03e9 + attention)
    assert cost.bytes == pytest.approx(8.03e9 * 0.515625 + 131072 * 1026)  # weights + bf16 KV read and written
    assert cost.memory_s == pytest.approx(cost.bytes / 3.35e12) and cost.bound == "memory"
    bf16 = decode_step_cost(L8, "BF16", H100, 8, efficiency=EXACT)
    plain = step_cost(L8, H100, [(1024, 1)] * 8, efficiency=EXACT)
    assert (bf16.flops, bf16.bytes, bf16.compute_s) == pytest.approx((plain.flops, plain.bytes, plain.compute_s))
    fp8 = decode_step_cost(L8, "FP8-W8A8", H100, 1, efficiency=EXACT)  # linear on fp8 cores, attention on bf16
    assert fp8.compute_s == pytest.approx(2 * 8.03e9 / 1979e12 + attention / 989e12)
    assert fp8.bytes == pytest.approx(8.03e9 + 131072 * 1026)
    slow = decode_step_cost(L8, "W4A16", H100, 1, efficiency=EXACT, dequant_overhead=0.25)
    assert slow.compute_s == pytest.approx(2 * 8.03e9 * 1.25 / 989e12 + attention / 989e12)
    assert decode_step_time(L8, "BF16", H100, 1) == pytest.approx(decode_step_cost(L8, "BF16", H100, 1).time_s)


def test_batch_one_is_bandwidth_bound_and_w4a16_wins_everywhere():
    for gpu in GPUS.values():
        for model in (L8, L70):
            assert best_scheme(model, gpu, 1) == "W4A16", (model.name, gpu.name)
    assert decode_step_cost(L70, "W4A16", H100, 1).bound == "memory"


def test_large_compute_bound_batches_go_to_fp8_on_h100():
    assert decode_step_cost(L70, "W4A16", H100, 1024).bound == "compute"
    assert best_scheme(L70, H100, 1024) == "FP8-W8A8"
    assert best_scheme(L8, H100, 1024, context_len=128) == "FP8-W8A8"
    for gpu in FP8_GPUS:
        assert best_scheme(L70, gpu, 4096, context_len=256) == "FP8-W8A8", gpu.name
        assert decode_step_time(L70, "FP8-W8A8", gpu, 4096) < decode_step_time(L70, "BF16", gpu, 4096)


def test_a100_never_picks_fp8_and_says_why():
    for gpu in NO_FP8_GPUS:
        for batch in (1, 16, 256, 4096):
            assert best_scheme(L70, gpu, batch, context_len=128) != "FP8-W8A8"
        assert crossover_batch(L70, gpu) is None
        assert all(row["schemes"]["FP8-W8A8"] is None for row in scheme_table(L70, gpu))
    with pytest.raises(SchemeUnavailableError, match="fp8_flops == 0.*W4A16 or BF16"):
        decode_step_cost(L70, "FP8-W8A8", A100, 1)
    with pytest.raises(SchemeUnavailableError):
        best_scheme(L70, A100, 1, schemes=("FP8-W8A8",))
    # a costly dequantize hands compute-bound batches back to BF16 on a GPU without fp8
    assert best_scheme(L70, A100, 4096, context_len=128, dequant_overhead=0.2) == "BF16"


def test_crossover_is_a_single_edge():
    edge = crossover_batch(L70, H100)
    assert edge is not None and 16 < edge < 1024
    fp8 = lambda b: decode_step_time(L70, "FP8-W8A8", H100, b)  # noqa: E731
    w4 = lambda b: decode_step_time(L70, "W4A16", H100, b)  # noqa: E731
    assert fp8(edge - 1) >= w4(edge - 1) and fp8(edge) < w4(edge)
    assert all(fp8(b) >= w4(b) for b in range(1, edge))
    assert all(fp8(b) < w4(b) for b in range(edge, 4 * edge, 7))
    assert best_scheme(L70, H100, edge - 1) == "W4A16" and best_scheme(L70, H100, edge) == "FP8-W8A8"


def test_crossover_moves_the_right_way():
    for gpu in FP8_GPUS:
        base = crossover_batch(L70, gpu, context_len=512)
        assert base is not None, gpu.name
        # tensor parallelism scales both roofs alike: the edge stays put
        assert crossover_batch(L70, tensor_parallel_group(gpu, 4), context_len=512) == base
        # a costlier dequantize makes W4A16 lose sooner; longer contexts (more KV bytes) later
        assert crossover_batch(L70, gpu, context_len=512, dequant_overhead=0.3) <= base
        longer = crossover_batch(L70, gpu, context_len=2048)
        assert longer is None or longer >= base
    # the 8B's GQA KV at 1K tokens costs more bandwidth per sequence than its FLOPs cost compute:
    # decode never leaves the memory roof and the fewest bytes (W4A16) always win
    assert crossover_batch(L8, H100, context_len=1024) is None
    assert best_scheme(L8, H100, 1 << 16) == "W4A16"
    assert crossover_batch(L8, H100, context_len=128) is not None


def test_table_rows_for_a_widget():
    rows = scheme_table(L70, H100, batches=(1, 64, 1024))
    assert [r["batch"] for r in rows] == [1, 64, 1024]
    assert set(rows[0]["schemes"]) == set(SCHEMES)
    for row in rows:
        assert row["best"] == best_scheme(L70, H100, row["batch"])
        cell = row["schemes"]["W4A16"]
        assert cell["tokens_per_s"] == pytest.approx(row["batch"] / cell["time_s"])
        assert cell["weight_bytes"] == weight_memory(L70, "W4A16")
    assert rows[0]["schemes"]["BF16"]["bound"] == "memory" and rows[-1]["schemes"]["BF16"]["bound"] == "compute"


def test_errors_say_what_to_change():
    with pytest.raises(ValueError, match="batch"):
        decode_step_cost(L8, "BF16", H100, 0)
    with pytest.raises(ValueError, match="dequant_overhead"):
        decode_step_cost(L8, "W4A16", H100, 1, dequant_overhead=-0.1)
    with pytest.raises(ValueError, match="at most 1"):
        min_gpus_for_weights(L70, "BF16", H100, memory_utilization=1.5)


def test_checkpoints_with_16_bit_embeddings_weigh_what_they_ship_at():
    """GPTQ, AWQ and FP8 checkpoints keep the embedding and lm_head in bf16: 39.5 GB, not 36.4 GB, for the 70B."""
    assert L70.embedding_params == 2 * 128256 * 8192  # untied: embedding and lm_head
    assert weight_memory(L70, "W4A16", quantized_embeddings=False) == pytest.approx(39.52e9, rel=1e-3)
    assert weight_memory(L70, "FP8-W8A8", quantized_embeddings=False) == pytest.approx(72.70e9, rel=1e-3)
    assert weight_memory(L70, "BF16", quantized_embeddings=False) == weight_memory(L70, "BF16")
    tied = get_model("Llama-3.2-1B")  # one shared matrix: half the 16-bit share
    kept = weight_memory(tied, "W4A16", quantized_embeddings=False) - weight_memory(tied, "W4A16")
    assert kept == pytest.approx(128256 * 2048 * (2 - 0.515625))


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_a_batch_needs_more_gpus_exactly_when_its_kv_does_not_fit_beside_the_weights(scheme):
    room = max_batch_in_memory(L70, scheme, H100, 1024)
    assert min_gpus_for_batch(L70, scheme, H100, max(room, 1), 1024) == min_gpus_for_weights(L70, scheme, H100, 0.9)
    assert min_gpus_for_batch(L70, scheme, H100, room + 1, 1024) > 1
    kv = kv_bytes_per_batch(L70, 1024, 1024, "bf16")  # 343.6 GB at batch 1,024 of 1,024 tokens
    assert min_gpus_for_batch(L70, scheme, H100, 1024, 1024) == math.ceil(
        (weight_memory(L70, scheme) + kv) / (0.9 * H100.memory_bytes))
