"""Lesson 08 says one computed thing: its wrong-order error, its timers, its one-shot/two-shot
crossover and its DeepSeek premise come from the models the tests of those models check."""

import json
import re

import pytest

from course_lib.paths import REPO_ROOT
from course_lib.perf.hardware import get_gpu
from course_lib.perf.moe_serving import DEFAULT_GPU, one_node_verdict
from course_lib.perf.units import GiB
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
    assert "vllm_kernel(" in cell and "fastest(" in cell


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
