"""Real DDP on 2 gloo ranks: bucket order, rebuild, overlap; the hand-written reducer against it."""

import time

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from course_lib.collectives.bucketed_reducer import BucketedReducer, against_ddp
from course_lib.collectives.buckets import MIB, assign_buckets, ddp_caps
from course_lib.collectives.ddp_timeline import bucket_cap_sweep, mlp, record_ddp_step, sweep_step_count
from course_lib.collectives.launch import run_on_ranks

CAPS_MB = (0.5, 2, None)  # None: DDP's default, a 1 MiB first bucket then 25 MiB


def _record_each(caps):
    return [record_ddp_step(cap) for cap in caps]


@pytest.fixture(scope="module")
def timelines():
    """timelines[rank][i]: the last of 3 DDP steps at CAPS_MB[i]."""
    return run_on_ranks(_record_each, 2, CAPS_MB, trace_calls=False)


def test_buckets_hold_the_parameters_in_reverse_order(timelines):
    for timeline in timelines[0] + timelines[1]:
        assert timeline.in_reverse_order()
        assert timeline.buckets[0].params[0] == timeline.param_names[-1]


@pytest.mark.parametrize("i", range(len(CAPS_MB)))
def test_steady_state_buckets_equal_assign_buckets(timelines, i):
    model = mlp()
    names = [name for name, _ in model.named_parameters()]
    sizes = [p.numel() * p.element_size() for p in model.parameters()]
    expected = [[names[j] for j in bucket] for bucket in assign_buckets(sizes, *ddp_caps(CAPS_MB[i]))]
    for rank in range(2):
        timeline = timelines[rank][i]
        assert [bucket.params for bucket in timeline.buckets] == expected
        assert [bucket.num_bytes for bucket in timeline.buckets] == [
            sum(sizes[j] for j in bucket) for bucket in assign_buckets(sizes, *ddp_caps(CAPS_MB[i]))]


def test_first_iteration_is_one_bucket_of_every_parameter(timelines):
    for timeline in timelines[0]:
        assert timeline.first_iteration_buckets == [timeline.param_names]


def test_a_small_cap_launches_buckets_while_backward_computes(timelines):
    timeline = timelines[0][0]
    assert len(timeline.buckets) == 8
    assert timeline.overlapped()
    assert timeline.buckets[0].start_s < timeline.compute_end_s


def test_a_bucket_starts_after_its_gradients_and_backward_waits_for_all(timelines):
    for timeline in timelines[0]:
        for bucket in timeline.buckets:
            assert bucket.start_s >= max(timeline.grad_ready_s[name] for name in bucket.params)
            assert bucket.start_s <= bucket.end_s <= timeline.backward_s < timeline.step_s


def test_fewer_buckets_as_the_cap_grows():
    caps, steps = (0.5, 2, 4, 25), []
    rows = bucket_cap_sweep(caps, repeats=1, on_step=steps.append)
    assert [row["bucket_cap_mb"] for row in rows] == list(caps)
    assert [row["num_buckets"] for row in rows] == [8, 4, 2, 1]
    assert steps == list(range(sweep_step_count(caps, repeats=1)))
    assert all(row["median_step_s"] > 0 and row["timeline"].in_reverse_order() for row in rows)


class _DefinedOutOfOrder(torch.nn.Module):
    """`late` is defined first but runs last: gradients arrive out of model.parameters() order."""

    def __init__(self):
        super().__init__()
        self.late, self.early = torch.nn.Linear(64, 48), torch.nn.Linear(32, 64)

    def forward(self, x):
        return self.late(torch.relu(self.early(x)))


def _models(kind):
    torch.manual_seed(3)
    if kind == "mlp":
        return mlp((32, 64, 64, 48)), (32, 48)
    return _DefinedOutOfOrder(), (32, 48)


def _compare_with_ddp(cases, rows_per_rank):
    """Per rank: for each (model, cap) the largest |reducer grad - DDP grad| over 2 steps, and
    whether the reducer's first bucket launched before the last gradient was ready."""
    rank, results = dist.get_rank(), []
    for kind, cap_bytes in cases:
        reference, (width_in, width_out) = _models(kind)
        mine, _ = _models(kind)
        ddp = DistributedDataParallel(reference, bucket_cap_mb=cap_bytes / MIB)
        reducer = BucketedReducer(mine, cap_bytes)
        first_param = next(mine.parameters())
        last_ready = []
        first_param.register_post_accumulate_grad_hook(lambda _: last_ready.append(time.perf_counter()))
        worst = 0.0
        for step in range(2):
            generator = torch.Generator().manual_seed(10 * step + rank)
            x = torch.randn(rows_per_rank[rank], width_in, generator=generator)
            y = torch.randn(rows_per_rank[rank], width_out, generator=generator)
            ddp.zero_grad(set_to_none=True)
            mine.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            torch.nn.functional.mse_loss(mine(x), y).backward()
            reducer.wait()
            worst = max(worst, max((a.grad - b.grad).abs().max().item()
                                   for a, b in zip(reference.parameters(), mine.parameters())))
        results.append({"diff": worst, "buckets": len(reducer.buckets),
                        "launched_early": kind == "mlp" and reducer.launched_at[0] < last_ready[-1]})
        reducer.remove()
    return results


# bucket 0 = early's gradients, bucket 1 = late's, which are ready first and must wait for bucket 0
CASES = [("mlp", 4 * 64 * 64), ("mlp", 64 * MIB), ("out_of_order", 4 * (64 * 32 + 64))]


@pytest.fixture(scope="module")
def comparisons():
    return run_on_ranks(_compare_with_ddp, 2, CASES, (5, 3), trace_calls=False)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_bucketed_reducer_gradients_equal_ddps(comparisons, case):
    for rank in range(2):
        assert comparisons[rank][case]["diff"] <= 1e-6


def test_bucketed_reducer_launches_in_bucket_order_when_gradients_come_out_of_order(comparisons):
    assert comparisons[0][2]["buckets"] == 2  # equal gradients (above) need both ranks to launch alike


def test_bucketed_reducer_fires_before_its_backward_ends(comparisons):
    assert comparisons[0][0]["buckets"] > 1
    assert all(comparisons[rank][0]["launched_early"] for rank in range(2))


def _unused_parameter():
    model = _DefinedOutOfOrder()
    reducer = BucketedReducer(model, 1)
    model.early(torch.randn(2, 32)).sum().backward()  # `late` gets no gradient
    try:
        reducer.wait()
    except RuntimeError as error:
        return str(error)
    return "no error"


def test_a_parameter_without_gradient_is_named():
    message = run_on_ranks(_unused_parameter, 1)[0]
    assert "got no gradient" in message and "[0, 1]" in message


def test_against_ddp_reports_equal_gradients_and_early_launches():
    small, whole = run_on_ranks(_against_ddp_twice, 2, trace_calls=False)[0]
    assert small["max_difference"] <= 1e-6 and whole["max_difference"] <= 1e-6
    assert small["buckets"] == 3 and small["launched_before_last_gradient"] == 2  # all but the last bucket
    assert whole["buckets"] == 1 and whole["launched_before_last_gradient"] == 0


def _against_ddp_twice():
    widths = (64, 64, 64, 64)  # three Linear layers of 16 KiB + bias
    return against_ddp(0.01, widths, 16), against_ddp(25, widths, 16)
