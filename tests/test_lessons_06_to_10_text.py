"""What lessons 06, 07, 09 and 10 and their quiz banks write agrees with what their cells run and with
the course's units: the hand ring's measured ratio is described for the sizes and repeats the cell
measures, with what load does; microseconds are written µs, never 'us'."""

from __future__ import annotations

import ast
import json
import re

import pytest

from course_lib.paths import REPO_ROOT
from course_lib.perf.units import format_bytes

LESSONS = ("06_ring_vs_tree", "07_nccl_topology", "09_serving_tradeoffs", "10_review")


def cells(lesson: str) -> list[dict]:
    return json.loads((REPO_ROOT / "notebooks" / f"{lesson}.ipynb").read_text(encoding="utf-8"))["cells"]


def source(cell: dict) -> str:
    return "".join(cell["source"])


def test_the_hand_ring_prose_describes_the_run_the_cell_makes():
    """The prose quotes ratios for the largest size the shortened run measures (it spoke of 4 MiB and up
    while the run showed 2x there), says how many repeats each median takes, and what load does."""
    book = cells("06_ring_vs_tree")
    (index,) = [i for i, c in enumerate(book) if c["cell_type"] == "code" and "ring_bench import benchmark" in source(c)]
    call = next(node for node in ast.walk(ast.parse(source(book[index])))
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "benchmark")
    arguments = {k.arg: eval(compile(ast.Expression(k.value), "cell", "eval")) for k in call.keywords}
    before, after = source(book[index - 1]), source(book[index + 1])
    assert f"median of {arguments['repeats']} repeats" in before and "interleaved" in before
    assert f"**At {format_bytes(max(arguments['sizes']), whole=True)}**" in after
    assert "other work" in after and "2-core" in after


@pytest.mark.parametrize("path", [*(f"notebooks/{lesson}.ipynb" for lesson in LESSONS),
                                  *(f"quizzes/{lesson}.yaml" for lesson in LESSONS)])
def test_microseconds_are_written_as_lessons_write_them(path):
    text = (REPO_ROOT / path).read_text(encoding="utf-8")
    if path.endswith(".ipynb"):  # what the learner reads in sources; stored outputs are refreshed on re-execution
        text = "\n".join(source(c) for c in json.loads(text)["cells"])
    assert not re.search(r"(\d|\})\s?us\b", text), re.search(r".{40}(\d|\})\s?us\b.{0,20}", text)


@pytest.mark.parametrize("lesson", LESSONS)
def test_lessons_point_learners_at_what_they_can_see_not_at_the_test_suite(lesson):
    """Lesson 09 sent learners to 'the property tests in tests/engine/test_kv_offload.py'."""
    text = "\n".join(source(c) for c in cells(lesson))
    assert not re.search(r"\btests/|\bproperty tests\b|\btest suite\b", text)
