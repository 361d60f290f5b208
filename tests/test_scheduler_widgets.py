"""Module 03's widgets: the scheduler stepper, the token-budget explorer and the hash-chain picture."""

import matplotlib
import pytest

from course_lib.engine.block_hash import hash_request_blocks
from course_lib.engine.llm import LLM
from course_lib.engine.sampling_params import SamplingParams
from course_lib.perf.hardware import get_gpu
from course_lib.perf.models import get_model
from course_lib.perf.workloads import document_among_chats
from course_lib.widgets.budget_explorer import (
    TokenBudgetExplorer,
    latency_summary,
    plot_budget_sweep,
    simulate_budget,
)
from course_lib.widgets.hash_chain import draw_hash_chains, prefix_hits
from course_lib.widgets.scheduler_stepper import record_run, scheduler_stepper

matplotlib.use("Agg")



@pytest.fixture(scope="module")
def snapshots():
    llm = LLM("tiny-llama", max_num_seqs=2, max_num_batched_tokens=12, block_size=4, num_gpu_blocks=12,
              max_model_len=48)
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    for rid, prompt in (("A", "short"), ("B", "a prompt longer than the budget"), ("C", "third")):
        llm.add_request(prompt, params, request_id=rid)
    return record_run(llm)


def test_stepper_snapshots_follow_the_engine(snapshots):
    first = snapshots[0]
    assert first.record.scheduled == {"A": 6, "B": 6}  # 'short' + BOS, then B's first chunk fills the budget
    assert first.record.waiting == ["C"] and first.blocks["A"] == [0, 1]
    assert all(s.record.num_tokens <= 12 for s in snapshots)
    assert {rid for s in snapshots for rid in s.finished} == {"A", "B", "C"}
    # blocks in use match the snapshot's block tables, and every request's KV fits its blocks
    for s in snapshots:
        assert s.record.blocks_used == sum(len(b) for b in s.blocks.values())
        assert all(state.computed <= 4 * len(s.blocks[rid]) for rid, state in s.requests.items())
    assert snapshots[-1].cached_free  # finished requests leave cached blocks behind (lazy eviction)


def test_stepper_moves_between_steps(snapshots):
    box = scheduler_stepper(snapshots, num_blocks=12, budget=12)
    controls, view = box.children
    slider, forward = controls.children[3], controls.children[2]
    assert "<b>Step 0</b>" in view.value and "prefill" in view.value
    forward.click()
    assert slider.value == 1 and "<b>Step 1</b>" in view.value
    slider.value = len(snapshots) - 1
    assert "finished" in view.value and "cached" in view.value
    with pytest.raises(ValueError, match="add requests"):
        scheduler_stepper([], 12, 12)


SCENARIO = dict(num_chat_users=8, document_tokens=8000, document_at=0.2, follow_up_rate_per_s=2, duration_s=1.0,
                chat_output_len=150)


def test_budget_explorer_updates_and_remembers_runs():
    explorer = TokenBudgetExplorer(get_model("Llama-3.1-8B"), get_gpu("H100-80GB"),
                                   document_among_chats(**SCENARIO), budget=8192)
    before = explorer.table.value
    explorer.budget.value = 512
    assert explorer.table.value != before and "document TTFT" in explorer.table.value
    explorer.threshold.value = 256
    assert set(explorer.reports) == {(8192, 0), (512, 0), (512, 256)}
    explorer.budget.value = 8192
    explorer.threshold.value = 0
    assert len(explorer.reports) == 4  # (8192, 256) was new; (8192, 0) came from memory


def test_budget_sweep_shows_the_itl_ttft_trade():
    workload = document_among_chats(**SCENARIO)
    model, gpu = get_model("Llama-3.1-8B"), get_gpu("H100-80GB")
    summaries = {b: latency_summary(simulate_budget(model, gpu, workload, b)) for b in (512, 8192)}
    assert summaries[512]["chat worst gap"] < summaries[8192]["chat worst gap"] / 4
    assert summaries[512]["document TTFT"] > summaries[8192]["document TTFT"]
    fig = plot_budget_sweep(summaries, slo_ms=50)
    for ax in fig.axes:
        assert ax.get_title() and "(" in ax.get_ylabel() and ax.get_xlabel()


def test_hash_chain_hits_stop_at_the_first_difference():
    system = list(range(40))
    prompts = {"one": system + [100, 101], "two": system + [200], "three": [999] + system[1:] + [200]}
    chains = [hash_request_blocks(p, 8) for p in prompts.values()]
    assert prefix_hits(chains) == [0, 5, 0]
    fig, ax = matplotlib.pyplot.subplots()
    # "two" has 41 tokens: 5 full blocks hit, and the last token is never served from the cache
    assert draw_hash_chains(ax, prompts, 8) == [0, 5, 0]
    assert draw_hash_chains(ax, {"a": system, "b": system}, 8) == [0, 4]  # 40 tokens: block 5 holds the last one
    assert draw_hash_chains(ax, {"a": system, "b": system}, 8, {"a": "x", "b": "y"}) == [0, 0]
