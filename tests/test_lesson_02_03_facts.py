"""What lessons 02 and 03 (and quiz 03) state in prose agrees with what course_lib computes: the
lessons' own cells are run here where a claim depends on them."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import matplotlib
import pytest

from course_lib.engine.simulated import simulate_budget
from course_lib.paths import REPO_ROOT
from course_lib.perf.hardware import get_gpu
from course_lib.perf.models import get_model
from course_lib.perf.workloads import document_among_chats
from course_lib.widgets.budget_explorer import WORST_GAP, latency_summary
from course_lib.widgets.hash_chain import hash_chains

matplotlib.use("Agg")


def cells(lesson: str) -> list[dict]:
    return json.loads((REPO_ROOT / "notebooks" / f"{lesson}.ipynb").read_text(encoding="utf-8"))["cells"]


def source(cell: dict) -> str:
    return "".join(cell["source"])


def cell_with(lesson: str, needle: str, kind: str = "code") -> str:
    found = [source(c) for c in cells(lesson) if c["cell_type"] == kind and needle in source(c)]
    assert len(found) == 1, f"{len(found)} {kind} cells of {lesson} contain {needle!r}"
    return found[0]


def run_cell(lesson: str, needle: str, namespace: dict | None = None) -> dict:
    """Run the one code cell of ``lesson`` that contains ``needle``; returns its namespace."""
    namespace = {} if namespace is None else namespace
    exec(compile(cell_with(lesson, needle), f"{lesson}: {needle}", "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def document_runs():
    """Lesson 03's scenario at budget 8,192: first come first served and priority, each without and with the cap."""
    model, gpu = get_model("Llama-3.1-8B"), get_gpu("H100-80GB")
    namespace = {}
    exec(compile(cell_with("03_scheduler", "document_among_chats(").split("explorer =")[0], "03", "exec"), namespace)
    workload = namespace["workload"]
    rank = {"follow-up": 0, "chat": 1, "document": 2}
    ranked = [replace(request, priority=rank[request.tag]) for request in workload]
    return {(policy, cap): latency_summary(simulate_budget(model, gpu, requests, 8192, cap, policy))
            for policy, requests in (("fcfs", workload), ("priority", ranked)) for cap in (0, 1024)}


def test_lesson_03_date_sits_where_the_prose_says():
    namespace = run_cell("03_scheduler", "draw_hash_chains(ax, prompts")
    prompts = namespace["prompts"]
    chains, _ = hash_chains(prompts, 16)
    user2, user3 = chains[1], chains[2]
    first_miss = next(i for i, (a, b) in enumerate(zip(user2, user3)) if a != b)
    text = cell_with("03_scheduler", "Two requests sharing a system prompt", "markdown")
    assert f"in block {first_miss} of the {len(user3)} full blocks" in text
    assert "early token" not in text


def test_lesson_03_quotes_the_simulated_follow_up_ttft_and_the_cap_shortens_the_stall(document_runs):
    plain, capped = document_runs[("fcfs", 0)], document_runs[("fcfs", 1024)]
    assert document_runs[("priority", 0)] == plain and document_runs[("priority", 1024)] == capped  # priority: no change
    quiz = (REPO_ROOT / "quizzes" / "03_scheduler.yaml").read_text(encoding="utf-8")
    assert (f"TTFT P99 is {plain['follow-up TTFT P99']:.0f} ms with or without priority; a long_prefill_token_threshold "
            f"of 1,024 brings it to {capped['follow-up TTFT P99']:.0f} ms") in quiz
    # the stall the document causes: a capped chunk's step, not the chats' own start-up prefill
    assert capped[WORST_GAP] < plain[WORST_GAP] / 5 and capped[WORST_GAP] < 60


def test_lesson_03_times_the_zero_hit_cost_robustly():
    code = cell_with("03_scheduler", "measure_cache_cost(")
    pairs = int(re.search(r"PAIRS = (\d+)", code).group(1))
    assert pairs >= 10 and "perf_counter" not in code
    text = cell_with("03_scheduler", "**Cost at a 0% hit rate.**", "markdown")
    assert "half of them fall in" in text and "within a few percent of noise either way" not in text


def test_lesson_02_says_what_its_timelines_show():
    """Section 1's prose: static batching idles about half its slot-steps; continuous batching idles only
    once the queue has run dry (every idle slot-step comes after the last request was admitted)."""
    namespace = run_cell("02_batching", "traces[policy] = llm.step_trace")
    run_cell("02_batching", "idle = plot_slot_timelines(", namespace)
    from course_lib.engine.batch_slots import slot_occupancy

    idle, traces = namespace["idle"], namespace["traces"]
    text = cell_with("02_batching", "Both timelines share one step scale.", "markdown")
    assert "about half of its slot-steps idle" in text and 0.4 <= idle["static"] <= 0.6
    assert "most of its steps" not in text
    steps = [record.scheduled for record in traces["continuous"]]
    last_admission = max(min(i for i, s in enumerate(steps) if rid in s) for rid in {r for s in steps for r in s})
    grid = slot_occupancy(steps, 4)
    assert 0 < idle["continuous"] < idle["static"]
    assert all(None not in row for row in grid[:last_admission + 1])  # idle only in the tail


def readme_benchmark() -> dict[str, str]:
    readme = " ".join((REPO_ROOT / "README.md").read_text(encoding="utf-8").split())
    found = re.search(r"engine ([\d,]+) tok/s; engine with static batching ([\d,]+) \(([\d.]+)x\); transformers "
                      r"continuous batching ([\d,]+) \(([\d.]+)x\); transformers `generate` ([\d,]+) \(([\d.]+)x\)",
                      readme)
    assert found, "README's benchmark section no longer lists the four systems' tokens per second"
    names = ("engine", "static", "static ratio", "hf continuous", "hf continuous ratio", "generate", "generate ratio")
    command = re.search(r"\.venv/bin/python -m course_lib\.engine\.benchmark --requests 128 --repeats 3", readme)
    return dict(zip(names, found.groups())) | {"command": command.group(0) if command else ""}


def test_lesson_02_quotes_the_readmes_benchmark_run():
    figures = readme_benchmark()
    assert figures["command"], "README's benchmark section no longer gives the command of its quoted run"
    text = cell_with("02_batching", "## 3 · Against a real baseline", "markdown")
    assert figures["command"] in text
    assert (f"**{figures['engine']}, {figures['static']}, {figures['hf continuous']} and {figures['generate']} "
            "output tokens/s**") in text
    assert (f"{figures['static ratio']}x the engine's own static mode, {figures['hf continuous ratio']}x `transformers`' "
            f"continuous batching and {figures['generate ratio']}x its `generate`") in text
    engine = float(figures["engine"].replace(",", ""))
    for system in ("static", "hf continuous", "generate"):  # the ratios are the figures' own
        assert engine / float(figures[system].replace(",", "")) == pytest.approx(float(figures[f"{system} ratio"]),
                                                                                 abs=0.006)
