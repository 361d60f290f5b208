"""Disaggregated prefill/decode in simulated mode, against the same GPUs colocated."""

import time

import pytest

from course_lib.engine.disaggregated import (
    ColocatedCluster,
    DisaggregatedCluster,
    compare_disaggregation,
    long_prompts_among_chats,
)
from course_lib.perf.hardware import get_gpu
from course_lib.perf.models import get_model
from course_lib.perf.roofline import step_cost
from course_lib.perf.workloads import WorkloadRequest, burst, poisson

MODEL, GPU = get_model("Llama-3.1-8B"), get_gpu("H100-80GB")
KV_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # bytes: Llama-3.1-8B in bf16
SMALL = dict(max_model_len=8192, max_num_batched_tokens=2048)


def small_scenario():
    return long_prompts_among_chats(document_tokens=4000, num_documents=2, num_chat_users=8, chat_output_len=150,
                                    follow_up_rate_per_s=4, duration_s=2)


@pytest.mark.parametrize("cluster", [
    ColocatedCluster(MODEL, GPU, 3, **SMALL),
    ColocatedCluster(MODEL, GPU, 2, routing="fewest_tokens", **SMALL),
    DisaggregatedCluster(MODEL, GPU, 1, 2, **SMALL),
    DisaggregatedCluster(MODEL, GPU, 2, 1, pipelined=False, routing="fewest_tokens", **SMALL),
])
def test_every_request_finishes_once_with_its_output_length(cluster):
    workload = small_scenario() + [WorkloadRequest(0.5, tuple(range(100, 180)), 1, "one token")]
    report = cluster.run(workload)
    assert [r.index for r in report.requests] == list(range(len(workload)))
    assert all(len(r.token_times) == workload[r.index].output_len and r.tag == workload[r.index].tag
               for r in report.requests)
    assert report.output_tokens == sum(w.output_len for w in workload)
    assert all(r.ttft_s > 0 and all(gap > 0 for gap in r.itl_s) for r in report.requests)
    assert len(report.busy_s) == report.num_gpus and 0 < report.utilization <= 1


@pytest.mark.parametrize("pipelined", [False, True])
def test_a_lone_requests_ttft_is_its_prefill_plus_its_kv_transfer(pipelined):
    prompt, arrival = tuple(range(1000, 2000)), 0.25
    workload = [WorkloadRequest(arrival, prompt, 20)]
    prefill_s = step_cost(MODEL, GPU, [(0, 1000)]).time_s  # the whole prompt in one step
    transfer_s = 1000 * KV_PER_TOKEN / 50e9  # over the H100 preset's 50 GB/s NIC: 2.6 ms
    exposed_s = transfer_s / 32 if pipelined else transfer_s  # pipelined: the last of 32 layers only
    (lone,) = DisaggregatedCluster(MODEL, GPU, pipelined=pipelined, **SMALL).run(workload).requests
    assert lone.ttft_s == pytest.approx(prefill_s + exposed_s, rel=1e-9)
    assert lone.transfer_s == pytest.approx(exposed_s, rel=1e-9)
    assert lone.kv_ready_s == pytest.approx(arrival + prefill_s + exposed_s, rel=1e-9)
    (colocated,) = ColocatedCluster(MODEL, GPU, 1, **SMALL).run(workload).requests
    assert colocated.ttft_s == pytest.approx(prefill_s, rel=1e-9)
    # after the first token, both decode one token per step of the same cost
    assert lone.itl_s == pytest.approx(colocated.itl_s, rel=1e-6)


def test_pipelining_the_transfer_lowers_ttft_and_a_slow_link_raises_it():
    workload = burst(6, prompt_len=3000, output_len=5)
    ttft = {(piped, link): sum(DisaggregatedCluster(MODEL, GPU, pipelined=piped, link_bandwidth=link, **SMALL)
                               .run(workload).ttft())
            for piped in (False, True) for link in (5e9, 50e9)}
    assert ttft[True, 50e9] < ttft[False, 50e9] < ttft[False, 5e9]
    assert ttft[True, 5e9] < ttft[False, 5e9]


def test_a_decode_pool_too_small_for_the_kv_makes_requests_wait_not_fail():
    workload = burst(8, prompt_len=100, output_len=60)  # 160 tokens = 10 blocks each at the end
    roomy = DisaggregatedCluster(MODEL, GPU, **SMALL).run(workload)
    tight = DisaggregatedCluster(MODEL, GPU, decode_settings=dict(num_gpu_blocks=24), **SMALL).run(workload)
    assert tight.output_tokens == roomy.output_tokens == 8 * 60
    waits = [r.token_times[0] - r.kv_ready_s for r in tight.requests]
    assert max(waits) > 0.05 and max(r.token_times[0] - r.kv_ready_s for r in roomy.requests) < 0.01
    assert tight.duration_s > roomy.duration_s and max(tight.ttft()) > 3 * max(roomy.ttft())
    with pytest.raises(ValueError, match="give that pool more KV blocks"):
        DisaggregatedCluster(MODEL, GPU, decode_settings=dict(num_gpu_blocks=5), **SMALL).run(workload)


def test_same_inputs_give_the_same_report():
    runs = [compare_disaggregation(MODEL, GPU, workload=small_scenario(), num_prefill=1, num_decode=2)
            for _ in range(2)]
    assert runs[0].colocated == runs[1].colocated and runs[0].disaggregated == runs[1].disaggregated


def test_disaggregation_protects_tail_itl_on_long_prompts_among_chats():
    started = time.perf_counter()
    comparison = compare_disaggregation(MODEL, GPU, workload=small_scenario(), num_prefill=1, num_decode=2)
    assert time.perf_counter() - started < 5
    table = comparison.table("chat")
    assert table["itl_max_ms"][1] < table["itl_max_ms"][0] / 3  # a document chunk never lands in a decode step
    assert set(comparison.table()) >= {"ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p90_ms",
                                       "itl_p99_ms", "itl_max_ms", "output_tokens_per_s", "requests_per_s"}
    assert "disaggregated, 1 prefill GPU + 2 decode GPUs" in str(comparison)


def test_disaggregation_does_not_raise_throughput_at_load():
    """Saturated, the same GPUs split into pools serve no more tokens per second than colocated."""
    workload = poisson(200, rate_per_s=150, mean_prompt=300, mean_output=100, seed=4)
    comparison = compare_disaggregation(MODEL, GPU, workload=workload, num_prefill=1, num_decode=1)
    colocated, disaggregated = comparison.colocated, comparison.disaggregated
    assert disaggregated.output_tokens_per_s <= colocated.output_tokens_per_s
    assert disaggregated.utilization < colocated.utilization
    assert max(disaggregated.itl()) < max(colocated.itl())


@pytest.mark.parametrize("bad, match", [
    (dict(num_prefill=0), "num_prefill must be a whole number"),
    (dict(routing="random"), "routing must be one of"),
    (dict(link_bandwidth=0.0), "link_bandwidth must be a positive number"),
])
def test_bad_settings_say_what_to_change(bad, match):
    with pytest.raises(ValueError, match=match):
        compare_disaggregation(MODEL, GPU, workload=burst(2, 50, 5), **bad)
