"""Lesson 08 says one computed thing: its wrong-order error, its timers, its one-shot/two-shot
crossover and its DeepSeek premise come from the models the tests of those models check."""

import contextlib
import io
import json
import re

import pytest

from course_lib import review
from course_lib.paths import REPO_ROOT
from course_lib.perf import vllm_all_reduce
from course_lib.perf.hardware import get_gpu
from course_lib.perf.moe_serving import DEFAULT_GPU, one_node_verdict
from course_lib.perf.tp_all_reduce import (all_reduce_time, fastest, one_shot_time, ring_time, tp_message_bytes,
                                           two_shot_crossover_bytes, two_shot_time)
from course_lib.perf.units import GiB, KiB, format_bytes
from course_lib.quiz.bank import load_bank
from course_lib.widgets.tp_derivation import RIGHT, WRONG, derive, summary

CELLS = json.loads((REPO_ROOT / "notebooks" / "08_fused_tp.ipynb").read_text(encoding="utf-8"))["cells"]
SIZE = re.compile(r"(?:(?<![\w.-])\d[\d,.]*|tens of|hundreds of|a few)\s*(?:B|KiB|MiB|GiB|KB|MB|GB)\b")
"""A message size typed in words or digits ("16 KiB", "tens of KiB"); not a model's name ("Llama-3.1-70B")."""


def sources(kind: str) -> list[str]:
    return ["".join(c["source"]) for c in CELLS if c["cell_type"] == kind]


def code_cell(needle: str) -> dict:
    found = [c for c in CELLS if c["cell_type"] == "code" and needle in "".join(c["source"])]
    assert len(found) == 1, f"{len(found)} code cells contain {needle!r}"
    return found[0]


def printed(cell: dict) -> str:
    return "".join("".join(o.get("text", "")) for o in cell["outputs"])


@pytest.mark.parametrize("num_ranks", [2, 4])
def test_the_wrong_order_error_is_the_widgets_number(num_ranks):
    """The printed walk-through and the widget's summary quote the same quantity, the output's error
    without the middle all-reduce; the real-rank cell names the widget's number beside its own block's."""
    skipped = f"{derive(WRONG, num_ranks).skipped_error:.2f}"
    assert f"off by up to {skipped}" in summary(derive(RIGHT, num_ranks), derive(WRONG, num_ranks))
    walk = printed(code_cell("derive(order, num_ranks)"))
    assert f"N={num_ranks} row-column" in walk and f"skipping the middle all-reduce: off by {skipped}" in walk
    ranks = printed(code_cell("tensor_parallel_report"))
    assert f"TP={num_ranks} wrong order" in ranks and f"(the widget's MLP: {skipped})" in ranks
    assert f"{derive(WRONG, num_ranks).nonlinearity_error:.2f}" not in walk  # not a second, different number


def test_the_engine_timers_cover_generate_only():
    source = "".join(code_cell("tensor_parallel_size=2, max_num_seqs").get("source"))
    timed = re.findall(r"started = time\.perf_counter\(\).*?- started", source, flags=re.DOTALL)
    assert len(timed) == 2 and all("generate(" in t and "LLM(" not in t for t in timed)
    # like for like: the one-rank engine on one thread, as each rank worker (collectives.launch) runs
    assert source.index("torch.set_num_threads(1)") < source.index(timed[0])


def test_the_crossover_text_is_computed_not_typed():
    """No sentence about one-shot, two-shot or K* types a size: the sizes are printed by the model."""
    for text in sources("markdown"):
        for sentence in re.split(r"(?<=[.:;])\s+", text):
            if re.search(r"one-shot|two-shot|K\\\*", sentence):
                assert not SIZE.search(sentence), sentence
    cell = "".join(code_cell("crossover_in_tokens(").get("source"))
    assert "vllm_all_reduce.route(" in cell and "fastest(" in cell


def test_the_lesson_compares_with_vllm_and_names_what_it_read():
    text = "".join(sources("markdown"))
    for name in ("custom_all_reduce.cuh", "VLLM_ALLREDUCE_USE_SYMM_MEM", "multimem"):
        assert name in text, name


def test_the_deepseek_premise_is_the_sheets_default_gpu():
    """The lesson's premise names the memory of the sheet's default GPU, prints the one-node verdict
    for it, and opens the sheet with its defaults."""
    premise = next(t for t in sources("markdown") if "does not fit on one node" in t)
    assert f"{get_gpu(DEFAULT_GPU).memory_bytes / GiB:.0f} GB GPUs" in premise
    assert one_node_verdict() in printed(code_cell("one_node_verdict()"))
    assert "MoEDesignSheet()" in "".join(code_cell("MoEDesignSheet").get("source"))


STEP_16 = tp_message_bytes(16, 8192)
"""Section 3's 16-token decode step of Llama-3.1-70B: 256 KiB, the size issue 29 asked one answer for."""


def run_cells(*needles: str) -> str:
    """What the code cells containing ``needles`` print when run in order in one namespace (the
    crossover widget's import given, as the lesson's earlier cell makes it)."""
    namespace: dict = {}
    exec("from course_lib.widgets.all_reduce_crossover import AllReduceCrossover", namespace)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for needle in needles:
            exec("".join(code_cell(needle)["source"]), namespace)
    return out.getvalue()


def test_the_table_and_the_prose_under_it_name_the_same_winners():
    """Cell 12 once said "fewer rounds, even at the cost of more bytes" (one-shot) under a table whose
    fastest column is two-shot in 4 of 5 rows. The table prints the model's choice, and the prose says
    one-shot for the single-token step and two-shot for every larger one: that is what the model picks."""
    table = run_cells("tp_all_reduces_per_forward(80)").splitlines()[3:]
    winners = [line.split()[6] for line in table]
    tokens = [int(line.split()[0]) for line in table]
    assert winners == [fastest(8, tp_message_bytes(t, 8192)) for t in tokens]
    assert tokens[0] == 1 and winners[0] == "one-shot" and set(winners[1:]) == {"two-shot"}
    prose = next(t for t in sources("markdown") if "fastest column" in t)
    assert "one-shot for the single-token step" in prose and "two-shot for every larger step" in prose
    assert "even at the cost of more bytes" not in prose


def test_the_16_token_lines_print_what_the_model_and_vllm_choose():
    """Cell 18 once printed "this model picks two-shot, vLLM two-shot" while vLLM on 8 H100s hands
    256 KiB to multimem (its custom kernel takes only messages strictly below it)."""
    printed_now = run_cells("tp_all_reduces_per_forward(80)", "crossover_in_tokens(")
    for n in (4, 8):
        assert (f"16 tokens ({format_bytes(STEP_16)}) on {n} GPUs: this model picks {fastest(n, STEP_16)};\n"
                f"    vLLM on H100s runs {vllm_all_reduce.route(n, STEP_16)}") in printed_now
    assert fastest(8, STEP_16) == "two-shot" and vllm_all_reduce.route(8, STEP_16) == vllm_all_reduce.MULTIMEM
    assert all(len(line) <= 100 for line in printed_now.splitlines()), "a long printed line wraps mid-word"


def test_what_the_vllm_paragraph_says_is_what_vllm_all_reduce_encodes():
    text = next(t for t in sources("markdown") if t.startswith("**What vLLM does instead.**"))
    hopper = vllm_all_reduce.HOPPER
    # "on 8 H100s it equals the kernel's own one-shot limit: there the custom kernel only ever runs one-shot"
    assert "on 8 H100s it equals the kernel's own one-shot limit" in text
    assert vllm_all_reduce.custom_limit(8) == vllm_all_reduce.ONE_SHOT_BELOW[8]
    assert vllm_all_reduce.CUSTOM_TWO_SHOT not in {name for _, _, name in vllm_all_reduce.segments(8)}
    # "vLLM's custom path ends exactly at that message's size ... so vLLM hands it to multimem"; "On 4 GPUs both pick one-shot"
    assert vllm_all_reduce.one_shot_below(8) == STEP_16 and "hands it to multimem" in text
    assert "On 4 GPUs both pick one-shot" in text
    assert fastest(4, STEP_16) == vllm_all_reduce.ALGORITHMS[vllm_all_reduce.route(4, STEP_16)] == "one-shot"
    # "on 4, 6 or 8 H100s the multimem all-reduce ...; PyTorch's two-shot on 2"
    assert "on 4, 6 or 8 H100s the multimem all-reduce" in text and "PyTorch's two-shot on 2" in text
    assert vllm_all_reduce.MULTIMEM_SIZES[hopper] == (4, 6, 8)
    assert vllm_all_reduce.route(2, 16 * 2**20) == vllm_all_reduce.SYMM_TWO_SHOT
    # "vLLM's own two-shot still runs on 4 or 6 H100s"; "An A100 ... keeps its own one-shot/two-shot switch"
    assert "vLLM's own two-shot still runs on 4 or 6 H100s" in text
    runs_own_two_shot = {n for n in (2, 4, 6, 8) if vllm_all_reduce.CUSTOM_TWO_SHOT in
                         {name for _, _, name in vllm_all_reduce.segments(n)}}
    assert runs_own_two_shot == {4, 6}
    assert vllm_all_reduce.route(8, STEP_16, "8.0") == vllm_all_reduce.CUSTOM_TWO_SHOT
    # "Over PCIe vLLM uses its custom kernel on 2 GPUs only"
    assert "on 2 GPUs only" in text and vllm_all_reduce.PCIE_GROUP_MAX == 2


SIZE_256 = re.compile(r"256(?:\.0)? ?KiB|262,144|quarter of a MiB|\b16 tokens|16-token")
EIGHT_GPUS = re.compile(r"\b8 (?:GPUs|H100s|ranks)|N ?= ?8\b|TP=8\b")
ONE_SHOT_WINS = re.compile(r"(?:picks|goes|runs|uses|chooses?|prefers?) one-shot|one-shot (?:wins|is (?:the )?fastest)"
                           r"|[\d.]+ ms one-shot\b(?! 0)")


def pairs_one_shot_with_256_kib_on_8_gpus(sentence: str) -> bool:
    """A sentence about the 256 KiB step on 8 GPUs that gives it to one-shot: it names one-shot as the
    choice, or names one-shot and not two-shot at all."""
    if not (SIZE_256.search(sentence) and EIGHT_GPUS.search(sentence) and "one-shot" in sentence):
        return False
    return bool(ONE_SHOT_WINS.search(sentence)) or "two-shot" not in sentence


def learner_texts() -> list[str]:
    """Lesson 08's Markdown, quiz 08's every text, every staff answer and the review's rows."""
    quiz = load_bank("08_fused_tp")
    texts = sources("markdown")
    for q in quiz.questions:
        texts += [q.prompt, getattr(q, "explanation", "") or ""]
        texts += [part for o in getattr(q, "options", ()) for part in (o.text, o.why or "")]
        texts += [w.why for w in getattr(q, "wrong", ())]
    texts += [text for q in review.STAFF_QUESTIONS for text in (q.question, q.answer)]
    texts += [text for row in review.resource_map() for text in (row.evidence, row.technique)]
    return texts


def test_the_detector_catches_the_sentences_the_walk_found():
    for bad in ("Llama-3.1-70B at TP=8, decoding 16 sequences: 160 all-reduces of 256.0 KiB per step, 0.8 ms one-shot.",
                "16 tokens (256.0 KiB) on 8 GPUs: this model picks one-shot, vLLM two-shot"):
        assert pairs_one_shot_with_256_kib_on_8_gpus(bad), bad
    fine = ("On the lesson's 8 H100s it is past K*: one-shot would spend 4.1 of its 5.1 µs reading, so two-shot "
            "wins a 256 KiB message.")
    assert not pairs_one_shot_with_256_kib_on_8_gpus(fine)


def test_no_learner_text_gives_the_256_kib_step_on_8_gpus_to_one_shot():
    assert fastest(8, STEP_16) == "two-shot"
    for text in learner_texts():
        for sentence in re.split(r"(?<=[.?!])\s+", text):
            assert not pairs_one_shot_with_256_kib_on_8_gpus(sentence), sentence


def test_the_quiz_says_what_the_model_says_about_256_kib():
    """Quiz Q4 once called 256 KiB "mostly fixed per-call latency, not bandwidth"; in the lesson's model
    most of one-shot's time there is bytes, which is why two-shot wins. Its figures are the model's."""
    explanation = load_bank("08_fused_tp").question("tp-message-size").explanation
    assert "mostly fixed per-call latency" not in explanation
    spend, total = (float(x) for x in re.search(r"spend ([\d.]+) of its ([\d.]+) µs", explanation).groups())
    reading = one_shot_time(8, STEP_16) - all_reduce_time("one-shot", 8, 1)  # less the round: the bytes
    assert (spend, total) == (round(reading * 1e6, 1), round(one_shot_time(8, STEP_16) * 1e6, 1))
    winner, winner_us = re.search(r"so (\S+) wins it in ([\d.]+) µs", explanation).groups()
    assert winner == fastest(8, STEP_16) and float(winner_us) == round(two_shot_time(8, STEP_16) * 1e6, 1)
    assert f"ring's 14 rounds make it {ring_time(8, STEP_16) * 1e6:.1f} µs" in explanation
    assert "K*" in explanation and STEP_16 > two_shot_crossover_bytes(8)


def test_every_answer_about_the_kernels_names_both_one_and_two_shot():
    """Quiz Q6's feedback, the staff answers and the habit table named only one-shot."""
    quiz = load_bank("08_fused_tp").question("tp-not-ddp")
    right = next(o for o in quiz.options if o.correct)
    assert "two-shot" in quiz.prompt and "one- and two-shot" in right.why
    for key in ("fused-all-reduce", "through-line"):
        answer = review.staff_question(key).answer
        assert re.search(r"two-shot", answer) and re.search(r"one-shot|one- or two-shot", answer), key
    habit = next(t for t in sources("markdown") if t.startswith("## 8 · The habit so far"))
    latency = next(line for line in habit.splitlines() if line.startswith("| latency"))
    assert "one-shot all-reduce up to K\\*, two-shot above it" in latency
