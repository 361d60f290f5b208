"""Simulated mode schedules exactly like the real engine, on a clock driven by the roofline model."""

import random

import pytest
import torch

from course_lib.engine.llm import LLM
from course_lib.engine.sampling_params import SamplingParams
from course_lib.engine.simulated import SimulatedEngine, percentile
from course_lib.perf.hardware import get_gpu
from course_lib.perf.models import ModelSpec, get_model
from course_lib.perf.workloads import (
    WorkloadRequest,
    agent_sessions,
    document_among_chats,
    document_stream,
    poisson,
)

TINY_SPEC = ModelSpec("tiny", 2, 4, 2, 8, 1e5, 256, hidden_size=32, intermediate_size=64, vocab_size=256)


@pytest.mark.parametrize("settings", [
    dict(max_num_batched_tokens=16, num_gpu_blocks=64),
    dict(max_num_batched_tokens=64, num_gpu_blocks=20, long_prefill_token_threshold=8),  # forces preemption
    dict(max_num_batched_tokens=32, num_gpu_blocks=40, scheduling_policy="static", max_num_seqs=3),
])
def test_simulated_schedule_equals_the_real_engines(tiny_model, settings):
    rng = random.Random(5)
    system = [rng.randrange(2, 64) for _ in range(20)]
    prompts = [system + [rng.randrange(2, 64) for _ in range(rng.randint(1, 25))] for _ in range(8)]
    outputs = [rng.randint(1, 12) for _ in prompts]
    common = dict(max_model_len=64, block_size=4, **settings)
    real = LLM(tiny_model, dtype=torch.float64, **common)
    for prompt, n in zip(prompts, outputs):
        real.add_request(prompt, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    while real.scheduler.has_unfinished_requests():
        real.step()
    simulated = SimulatedEngine(TINY_SPEC, get_gpu("H100-80GB"), **common)
    report = simulated.run([WorkloadRequest(0.0, tuple(p), n) for p, n in zip(prompts, outputs)])
    assert [s.scheduled for s in report.steps] == [r.scheduled for r in real.step_trace]
    assert report.output_tokens == sum(outputs)


def test_clock_follows_the_roofline_and_reports_latency():
    engine = SimulatedEngine(get_model("Llama-3.1-8B"), get_gpu("H100-80GB"), max_model_len=8192)
    report = engine.run(poisson(200, rate_per_s=10, system_prompt_len=256, seed=1))
    times = [0.0] + [s.time_s for s in report.steps]
    # each step advances the clock by its roofline cost, plus any idle wait for the next arrival
    assert all(after - before >= step.duration_s - 1e-12 > 0
               for before, after, step in zip(times, times[1:], report.steps))
    latency = report.latency()
    assert 0 < latency["itl_p50_ms"] <= latency["itl_p99_ms"] and latency["ttft_p50_ms"] > 0
    assert report.prefix_hit_rate > 0.2  # the shared system prompt hits
    assert {s.bound for s in report.steps} <= {"compute", "memory"} and report.tokens_per_s > 0


def test_a_long_document_delays_chat_tokens_less_with_a_small_budget():
    """The token budget is the TTFT/ITL dial: the document's TTFT against chat users' worst gaps."""
    worst_gap, document_ttft = {}, {}
    for budget in (512, 8192):
        engine = SimulatedEngine(get_model("Llama-3.1-8B"), get_gpu("H100-80GB"), max_model_len=32768,
                                 max_num_batched_tokens=budget)
        report = engine.run(document_among_chats(num_chat_users=8, follow_up_rate_per_s=1, duration_s=3))
        worst_gap[budget] = max(report.itl["chat"])
        document_ttft[budget] = report.ttft["document"][0]
    assert worst_gap[512] < worst_gap[8192] / 4
    assert document_ttft[512] > document_ttft[8192]


def test_percentile_interpolates():
    assert percentile([1, 2, 3, 4], 50) == 2.5 and percentile([5], 99) == 5 and percentile([], 50) == 0


def test_swap_preemption_pays_for_its_pcie_copies():
    model, gpu = get_model("Llama-3.1-8B"), get_gpu("H100-80GB")
    # one block of 16 tokens x 128 KiB per token, over 64 GB/s of PCIe Gen5
    assert SimulatedEngine(model, gpu, preemption_mode="swap").swap_s_per_block == pytest.approx(16 * 131072 / 64e9)
    workload = poisson(60, rate_per_s=200, mean_prompt=256, mean_output=256, seed=2)
    runs = {mode: SimulatedEngine(model, gpu, max_model_len=4096, num_gpu_blocks=200, preemption_mode=mode).run(workload)
            for mode in ("recompute", "swap")}
    assert runs["recompute"].preemptions > 0 and runs["swap"].preemptions > 0
    assert all(step.swap_s == 0 for step in runs["recompute"].steps)
    per_block = 16 * 131072 / 64e9
    swapping = [step for step in runs["swap"].steps if step.swap_s]
    assert swapping and all(round(step.swap_s / per_block, 6).is_integer() for step in swapping)
    # swapped requests keep their KV, so the GPU computes fewer tokens than under recompute
    computed = {mode: sum(sum(s.scheduled.values()) for s in r.steps) for mode, r in runs.items()}
    assert computed["swap"] < computed["recompute"]


def test_agent_sessions_reuse_earlier_turns_through_the_prefix_cache():
    workload = agent_sessions(num_sessions=6, turns=4, seed=1)
    by_turn = {}
    for request in workload:
        by_turn.setdefault(request.tag, []).append(request)
    assert len(workload) == 24 and len(by_turn["turn 4"]) == 6
    model, gpu = get_model("Llama-3.1-8B"), get_gpu("H100-80GB")
    reports = {caching: SimulatedEngine(model, gpu, max_model_len=8192, enable_prefix_caching=caching).run(workload)
               for caching in (True, False)}
    # later turns quote the whole earlier conversation, the model's answers included
    assert reports[True].prefix_hit_rate > 0.7 and reports[False].prefix_hit_rate == 0
    # nothing is preempted: without caching the GPU computes exactly what is needed, with it less
    assert reports[False].tokens_computed == reports[False].tokens_needed == reports[True].tokens_needed
    assert reports[True].tokens_computed < reports[True].tokens_needed / 2
    assert sum(reports[True].ttft["turn 4"]) < sum(reports[False].ttft["turn 4"]) / 2


def test_scripted_output_tokens_must_match_the_length():
    with pytest.raises(ValueError, match="make them agree"):
        WorkloadRequest(0.0, (1, 2), 3, output_token_ids=(5,))


L4_SERVER = dict(max_model_len=8192, max_num_batched_tokens=2048, enable_prefix_caching=False)  # vllm serve's L4 budget


def serve_on_l4(workload, **settings):
    return SimulatedEngine(get_model("Llama-3.1-8B"), get_gpu("L4-24GB"), **{**L4_SERVER, **settings}).run(workload)


def test_max_num_seqs_1024_with_short_chats_costs_tails_and_repeated_work_not_throughput():
    """Each preemption throws away a few hundred tokens, cheap to prefill again, while the bigger
    batch shares each step's weight reads among more decodes: more tokens per second, worse tails."""
    chats = poisson(200, rate_per_s=50, mean_prompt=256, mean_output=512, seed=3)
    many, safe = serve_on_l4(chats, max_num_seqs=1024), serve_on_l4(chats, max_num_seqs=32)
    assert safe.preemptions == 0 and safe.tokens_computed == safe.tokens_needed
    assert many.preemptions > 100 and many.tokens_computed > 1.2 * many.tokens_needed
    assert many.max_preemptions_per_request < 20
    assert many.tokens_per_s > 1.05 * safe.tokens_per_s
    assert many.latency()["itl_p99_ms"] > 2 * safe.latency()["itl_p99_ms"]


def test_max_num_seqs_1024_with_long_documents_collapses_throughput():
    """V1 admits a waiting request when its next chunk fits, not its whole context. A preempted
    document is re-admitted, prefills one budget-sized chunk, finds no room for the next and, being
    the last running request, preempts itself: without prefix caching the chunk is lost, over and over
    (the loop vLLM pull requests 21809 and 37307 describe)."""
    documents = document_stream(30, rate_per_s=1, seed=3)
    many, safe = serve_on_l4(documents, max_num_seqs=1024), serve_on_l4(documents, max_num_seqs=4)
    assert safe.preemptions == 0 and safe.tokens_computed == safe.tokens_needed
    assert many.max_preemptions_per_request > 50 and many.tokens_computed > 5 * many.tokens_needed
    assert many.tokens_per_s < 0.7 * safe.tokens_per_s
    # the loop needs both a context longer than the budget and nothing cached to come back to
    for loop_breaker in (dict(enable_prefix_caching=True), dict(max_num_batched_tokens=8192)):
        unbroken = serve_on_l4(documents, max_num_seqs=1024, **loop_breaker)
        assert unbroken.max_preemptions_per_request < 10 and unbroken.tokens_per_s > safe.tokens_per_s


def test_document_stream_lengths_stay_in_their_ranges():
    documents = document_stream(50, rate_per_s=2, prompt_len=(100, 120), output_len=(5, 9), seed=1)
    assert documents == document_stream(50, rate_per_s=2, prompt_len=(100, 120), output_len=(5, 9), seed=1)
    assert all(100 <= len(r.prompt_token_ids) <= 120 and 5 <= r.output_len <= 9 and r.tag == "document"
               for r in documents)
    times = [r.arrival_time for r in documents]
    assert times == sorted(times) and 15 < times[-1] < 40  # 50 arrivals at 2 per second
    with pytest.raises(ValueError, match="shortest <= longest"):
        document_stream(3, prompt_len=(10, 5))
