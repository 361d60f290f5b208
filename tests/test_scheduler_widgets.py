"""Module 03's widgets: the scheduler stepper, the token-budget explorer and sweep, the preemption
timeline and the hash-chain picture."""

import matplotlib
import pytest

from course_lib.engine.block_hash import hash_request_blocks
from course_lib.engine.llm import LLM
from course_lib.engine.sampling_params import SamplingParams
from course_lib.engine.simulated import SimulatedEngine, simulate_budget
from course_lib.perf.hardware import get_gpu
from course_lib.perf.models import get_model
from course_lib.perf.workloads import document_among_chats, poisson
from course_lib.widgets.budget_explorer import (
    WORST_GAP,
    TokenBudgetExplorer,
    document_prefill,
    latency_summary,
    plot_budget_sweep,
    plot_step_times,
)
from course_lib.widgets.hash_chain import draw_hash_chains, prefix_hits
from course_lib.widgets.preemption_timeline import cumulative_preemptions, preemption_timeline_figure
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
SCENARIO_DOCUMENT_OUTPUT = 200  # document_among_chats's summary length


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
    assert summaries[512][WORST_GAP] < summaries[8192][WORST_GAP] / 4
    assert summaries[512]["document TTFT"] > summaries[8192]["document TTFT"]
    fig = plot_budget_sweep(summaries, slo_ms=50)
    traces = {trace.name: trace for trace in fig.data}
    assert list(traces) == ["chat ITL P99", WORST_GAP, "target 50 ms", "document TTFT"]
    for key in ("chat ITL P99", WORST_GAP):  # the simulated values, in ms, at each budget
        assert list(traces[key].x) == [512, 8192] and list(traces[key].y) == [summaries[b][key] for b in (512, 8192)]
        assert "ms" in traces[key].hovertemplate and "budget" in traces[key].hovertemplate
    assert list(traces["document TTFT"].y) == [summaries[b]["document TTFT"] / 1000 for b in (512, 8192)]
    assert " s<" in traces["document TTFT"].hovertemplate and traces["document TTFT"].xaxis == "x2"
    assert list(traces["target 50 ms"].y) == [50, 50]
    assert fig.layout.title.text
    for axis in (fig.layout.xaxis, fig.layout.xaxis2):
        assert axis.type == "log" and "(tokens" in axis.title.text and list(axis.tickvals) == [512, 8192]
    assert "(ms" in fig.layout.yaxis.title.text and "(s)" in fig.layout.yaxis2.title.text
    assert [a.text for a in fig.layout.annotations] == ["Chat users while a 16k-token document arrives",
                                                       "What the document pays for smaller steps"]


@pytest.mark.parametrize("budget, cap", [(8192, 1024), (8192, 0), (512, 0)])
def test_worst_chat_gap_is_the_stall_the_documents_chunks_cause(budget, cap):
    """The worst gap counts only gaps that end while the document is prefilled: with every chat user in
    every step, it is the longest step that reads a chunk of the document's prompt, whatever the
    chats' own start-up prefill cost before the document arrived."""
    report = simulate_budget(get_model("Llama-3.1-8B"), get_gpu("H100-80GB"), document_among_chats(**SCENARIO),
                             budget, cap)
    document, arrival, first_token = document_prefill(report)
    chunks = [s for s in report.steps if document in s.scheduled and s.time_s <= first_token]
    assert sum(s.scheduled[document] for s in chunks) == SCENARIO["document_tokens"]
    assert all(arrival < s.time_s for s in chunks)
    gap_ms = latency_summary(report)[WORST_GAP]
    assert gap_ms == pytest.approx(1000 * max(s.duration_s for s in chunks))
    start_up = max(s.duration_s for s in report.steps if s.time_s <= arrival)  # the chats' own prompts
    if cap:  # capped chunks are shorter than the chats' start-up step, which is not the document's doing
        assert gap_ms < 1000 * start_up / 2


def test_step_times_mark_the_documents_prompt_chunks_apart_from_its_decode():
    report = simulate_budget(get_model("Llama-3.1-8B"), get_gpu("H100-80GB"), document_among_chats(**SCENARIO),
                             8192, 1024)
    document, _, first_token = document_prefill(report)
    fig, ax = matplotlib.pyplot.subplots()
    plot_step_times(ax, report, "budget 8192")
    chunks, decodes, others = (collection.get_offsets() for collection in ax.collections)
    assert [label.get_text() for label in ax.get_legend().get_texts()] == [
        "steps with a chunk of the document's prompt", "steps with the document decoding", "steps with no document"]
    assert list(chunks[:, 0]) == [s.time_s for s in report.steps if document in s.scheduled and s.time_s <= first_token]
    assert len(chunks) == 8 and len(decodes) == SCENARIO_DOCUMENT_OUTPUT - 1  # 8,000 tokens in chunks of 1,024
    assert len(chunks) + len(decodes) + len(others) == len(report.steps)
    assert ax.get_xlabel() == "simulated time (s)" and ax.get_ylabel() == "step duration (ms)"


def test_preemption_timeline_draws_what_the_simulation_reported():
    busy = poisson(200, rate_per_s=50, mean_prompt=256, mean_output=512, seed=3)
    model, l4 = get_model("Llama-3.1-8B"), get_gpu("L4-24GB")
    runs = {f"max_num_seqs={n}": SimulatedEngine(model, l4, max_model_len=8192, max_num_seqs=n).run(busy)
            for n in (1024, 32)}
    thrashing = runs["max_num_seqs=1024"]
    assert thrashing.preemptions > 0  # else the picture would show nothing worth reading
    counts = cumulative_preemptions(thrashing)
    assert counts[-1] == thrashing.preemptions and counts == sorted(counts)
    fig = preemption_timeline_figure(runs, title="Llama-3.1-8B on the L4")
    assert len(fig.data) == 4 and fig.layout.title.text == "Llama-3.1-8B on the L4"
    count_trace, usage_trace = fig.data[0], fig.data[1]
    assert count_trace.name == usage_trace.name == "max_num_seqs=1024"
    assert count_trace.showlegend is not False and usage_trace.showlegend is False  # one legend entry per run
    assert list(count_trace.x) == [step.time_s for step in thrashing.steps] == list(usage_trace.x)
    assert list(count_trace.y) == counts
    assert list(usage_trace.y) == [100 * step.kv_usage for step in thrashing.steps]
    assert max(usage_trace.y) > 95  # thrashing: the cache sits full
    assert list(fig.data[2].y) == [0] * len(runs["max_num_seqs=32"].steps)  # 32 sequences: no preemption
    assert "s:" in count_trace.hovertemplate and "preemptions" in count_trace.hovertemplate
    assert "% of KV blocks" in usage_trace.hovertemplate
    assert fig.layout.xaxis.title.text == fig.layout.xaxis2.title.text == "simulated time (s)"
    assert "(count)" in fig.layout.yaxis.title.text and "(%)" in fig.layout.yaxis2.title.text
    assert "vllm:num_preemptions_total" in fig.layout.annotations[0].text


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
