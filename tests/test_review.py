"""The final review's resource map: every module 01-09 has a row, each row's figures are what the
cost models compute, and the rendered table quotes them and links each lesson."""

import re

import pytest

from course_lib import review
from course_lib.paths import QUIZ_DIR
from course_lib.perf import kv_tiers, quant_cost, tp_all_reduce
from course_lib.perf.comm import DOUBLE_BINARY_TREE, RING, TREE_CHUNK_BYTES, crossover_bytes
from course_lib.perf.hardware import get_gpu
from course_lib.perf.interconnect import INFINIBAND_NDR, NVLINK_4, get_link
from course_lib.perf.kv import model_kv_bytes_per_token
from course_lib.perf.models import get_model
from course_lib.perf.roofline import step_cost
from course_lib.perf.serving import expected_tokens_per_step
from course_lib.perf.units import format_bytes

ROWS = review.resource_map()
H100, LLAMA_8B, LLAMA_70B = get_gpu("H100-80GB"), get_model("Llama-3.1-8B"), get_model("Llama-3.1-70B")


def test_every_module_has_a_row_in_order_with_one_of_the_four_resources():
    assert [row.module for row in ROWS] == ["01", "02", "03", "04", "05", "06", "07", "08", "09", "09"]
    assert {row.resource for row in ROWS} == set(review.RESOURCES)
    assert review.RESOURCES == ("KV memory", "memory bandwidth", "interconnect bandwidth", "latency")


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r.module} {r.title}")
def test_each_row_names_its_module_lesson(row):
    """A lesson and its quiz bank share a name (01_paging.ipynb, quizzes/01_paging.yaml)."""
    assert (QUIZ_DIR / row.lesson.replace(".ipynb", ".yaml")).exists(), row.lesson


def test_the_figures_are_the_cost_models_own():
    by = {(row.module, row.resource): row.figures for row in ROWS}
    assert by["01", "KV memory"]["kv_bytes_per_token"] == model_kv_bytes_per_token(LLAMA_8B, "bf16") == 131072
    assert by["01", "KV memory"]["reserve_waste"] > 0.6 > 0.04 > by["01", "KV memory"]["paged_waste"]
    one = step_cost(LLAMA_8B, H100, [(1024, 1)])
    assert (by["02", "memory bandwidth"]["batch1_bytes"], by["02", "memory bandwidth"]["batch1_flops"]) == (one.bytes, one.flops)
    assert by["03", "latency"]["whole_prefill_s"] > by["03", "latency"]["chunked_s"] > by["03", "latency"]["decodes_s"]
    assert by["04", "memory bandwidth"]["tokens_per_step"] == expected_tokens_per_step(0.8, 4)
    assert by["04", "memory bandwidth"]["decode_intensity"] < by["04", "memory bandwidth"]["ridge_point"] \
        < by["04", "memory bandwidth"]["prefill_intensity"]
    assert by["05", "interconnect bandwidth"]["all_reduce_s"] == RING.time(8, 2**30, 0.0, get_link(NVLINK_4).beta)
    assert by["06", "latency"]["tree_s"] < by["06", "latency"]["ring_s"]
    seven = by["07", "interconnect bandwidth"]
    assert seven["hierarchical_nic_bytes"] < seven["flat_nic_bytes"] and seven["nvlink_bandwidth"] == 9 * seven["nic_bandwidth"]
    size = tp_all_reduce.tp_message_bytes(16, LLAMA_70B.hidden_size)
    assert by["08", "latency"]["one_shot_s"] == tp_all_reduce.one_shot_time(8, size) * 160
    assert by["08", "latency"]["two_shot_s"] == tp_all_reduce.two_shot_time(8, size) * 160
    assert by["09", "memory bandwidth"]["bf16_gpus"] == quant_cost.min_gpus_for_weights(LLAMA_70B, "BF16", H100) == 2
    nine = by["09", "memory bandwidth"]
    assert nine["w4a16_bytes"] == quant_cost.weight_memory(LLAMA_70B, "W4A16")
    assert nine["w4a16_checkpoint_bytes"] == quant_cost.weight_memory(LLAMA_70B, "W4A16", quantized_embeddings=False)
    offload = by["09", "KV memory"]
    assert offload["reload_s"] == kv_tiers.reload_time(LLAMA_8B, 10_100, kv_tiers.get_tier(kv_tiers.CPU_DRAM))
    assert 0.025 < offload["reload_s"] < 0.03 and 0.3 < offload["recompute_s"] < 0.35  # ~26 ms against ~0.3 s


@pytest.mark.parametrize("num_ranks, tokens", [(8, 16), (8, 1), (4, 16), (2, 256)])
def test_the_tp_row_names_the_models_fastest_all_reduce_and_its_time(num_ranks, tokens):
    """The row quotes the algorithm ``tp_all_reduce.fastest`` picks at its size, never a fixed one."""
    row = review.fused_tp(num_ranks, tokens)
    size = tp_all_reduce.tp_message_bytes(tokens, LLAMA_70B.hidden_size)
    best = tp_all_reduce.fastest(num_ranks, size)
    assert row.figures["fastest_s"] == tp_all_reduce.all_reduce_time(best, num_ranks, size) * 160
    assert row.figures["fastest_s"] == min(row.figures[key] for key in ("ring_s", "one_shot_s", "two_shot_s"))
    assert f"{row.figures['fastest_s'] * 1e3:,.1f} ms {best} (the fastest at this size" in row.evidence
    if (num_ranks, tokens) == (8, 16):  # the review's own row: 256 KiB on 8 GPUs goes two-shot, as in lesson 08's table
        assert best == "two-shot" and row.evidence == review.fused_tp().evidence


def test_the_table_links_every_lesson_and_quotes_the_figures():
    table = review.as_markdown(ROWS, link_prefix="../notebooks/")
    lines = table.splitlines()
    assert len(lines) == 2 + len(ROWS) and all(line.count(" | ") == 3 for line in lines[2:])
    for row, line in zip(ROWS, lines[2:]):
        assert f"](../notebooks/{row.lesson})" in line and f"**{row.resource}**" in line and row.evidence in line
    assert "128.0 KiB" in table and "62.6%" in table and "3.36 tokens" in table and "1.32 GB" in table


def test_the_quantization_row_gives_w4a16_as_modelled_and_as_checkpoints_ship_it():
    """As lesson 09 and quiz 09 say: 36.4 GB with every weight quantized, about 39.5 GB with the
    embeddings and lm_head in 16 bits, as GPTQ and AWQ checkpoints keep them; one H100 either way."""
    row = review.quantization()
    assert "36.4 GB with every weight quantized (1)" in row.evidence
    assert "about 39.5 GB as checkpoints ship it, embeddings and lm_head in 16 bits (1)" in row.evidence
    assert row.figures["w4a16_checkpoint_gpus"] == row.figures["w4a16_gpus"] == 1


def test_the_ring_row_quotes_one_tree_for_its_time_and_its_crossover():
    """The double binary tree's time and the crossover with the ring come from the same pipelined tree
    (the row quoted the double tree's 90.2 µs but a single, unpipelined tree's 119.5 MiB)."""
    ib = get_link(INFINIBAND_NDR)
    (row,) = [r for r in ROWS if r.module == "06"]
    assert row.figures["tree_s"] == DOUBLE_BINARY_TREE.time(512, 4096, ib.alpha_s, ib.beta, TREE_CHUNK_BYTES)
    assert row.figures["crossover_bytes"] == crossover_bytes(DOUBLE_BINARY_TREE, RING, 512, ib.alpha_s, ib.beta,
                                                             TREE_CHUNK_BYTES)
    assert "5.11 ms" in row.evidence and "90.2 µs" in row.evidence
    assert format_bytes(row.figures["crossover_bytes"]) == "250.2 MiB" and "only above 250.2 MiB" in row.evidence


def test_the_figures_print_without_e_notation_and_wrap_between_figures():
    text = review.figures_text(ROWS)
    assert not re.search(r"\d[eE][+-]?\d", text)  # 9.016e-05 and 1.253e+08 were printed
    assert "tree_s = 90.16 µs" in text and "crossover_bytes = 262,380,011" in text
    lines = text.splitlines()
    assert max(map(len, lines)) <= 96 and len(lines) > len(ROWS)
    for line in lines:  # every line holds whole figures: name = value, ...
        assert re.fullmatch(r"(\d\d [a-zA-Z ]{22}| {25})( [a-z0-9_]+ = -?[\d,.]+(?: [µnm]?s)?,?)+", line), line


def test_a_row_refuses_an_unknown_resource_or_module_and_takes_its_title_from_the_outline():
    with pytest.raises(ValueError, match="resource must be one of"):
        review.Bound("01", "compute", "", "")
    with pytest.raises(KeyError, match="No module '11'"):
        review.Bound("11", review.LATENCY, "", "")
    row = review.Bound("04", review.LATENCY, "", "")
    assert (row.title, row.lesson) == ("Throughput versus latency", "04_roofline.ipynb")


def test_the_staff_questions_follow_the_course_then_the_through_line():
    keys = [q.key for q in review.STAFF_QUESTIONS]
    assert keys == ["memory-bound-serving", "paging", "continuous-batching", "v1-scheduler", "prefix-caching",
                    "scheduling", "disaggregation", "speculative-decoding", "collectives-behind-parallelism",
                    "ring-or-tree", "dp-at-scale", "column-then-row", "fused-all-reduce", "quantization",
                    "reload-or-recompute", "through-line"]
    assert [q.lesson for q in review.STAFF_QUESTIONS] == sorted(q.lesson for q in review.STAFF_QUESTIONS)
    for q in review.STAFF_QUESTIONS:
        assert (QUIZ_DIR / q.lesson.replace(".ipynb", ".yaml")).exists(), q.lesson
        assert q.question.endswith("?") and q.answer and q.compare.startswith("did you")
    assert review.staff_question("paging").lesson == "01_paging.ipynb"
    assert "1.3 GB" in review.staff_question("reload-or-recompute").answer
    with pytest.raises(KeyError, match="choose one of"):
        review.staff_question("sharding")


def test_the_fused_tp_row_counts_sequences_in_words():
    assert "decoding 1 sequence:" in review.fused_tp(8, 1).evidence
    assert "decoding 16 sequences:" in review.fused_tp().evidence
