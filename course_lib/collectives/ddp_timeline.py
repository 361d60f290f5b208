"""Real DDP on gloo, timed bucket by bucket: when each gradient is ready, when each bucket's
all-reduce is launched and when it completes, so a lesson can draw the overlap as a timeline.

    timelines = run_on_ranks(record_ddp_step, 2, 0.5, trace_calls=False)
    timelines[0].overlapped(), timelines[0].in_reverse_order()   # -> (True, True)

Times are seconds after ``loss.backward()`` was called, on one rank's ``time.perf_counter``.
``backward_s`` is when ``loss.backward()`` returned: DDP waits for every bucket's all-reduce
at the end of backward (a final autograd callback), so it is never before the last bucket's
``end_s``. Overlap therefore means a bucket launched before the last gradient was ready
(``compute_end_s``), while backward was still computing earlier layers. The bucket rules
(``course_lib/collectives/buckets.py``) say which parameters a bucket holds; the recorded
steady-state buckets equal ``assign_buckets`` and the first iteration's is one bucket of all.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from course_lib.collectives.launch import progress_lines, run_on_ranks

DEFAULT_WIDTHS = (512,) * 9  # 8 Linear layers of 512x512 fp32: 1 MiB of weights (+2 KiB of bias) each
DEFAULT_BATCH = 128  # rows per rank: ~10 ms of backward on one CPU thread, ~25 ms a step
DEFAULT_CAPS_MB = (0.5, 1.0, 2.0, 4.0, 25.0)
WARMUP_STEPS = 2  # iteration 0 runs with one bucket; DDP rebuilds the buckets at iteration 1's forward
_PROGRESS = "ddp-sweep: finished step "  # how rank 0 tells the caller it finished a step


@dataclass
class BucketRecord:
    """One bucket's all-reduce: launched at ``start_s`` (hook entry), done at ``end_s``."""

    index: int
    params: list[str]
    num_bytes: int
    start_s: float
    end_s: float


@dataclass
class BucketTimeline:
    """One steady-state DDP step on one rank (plain data: picklable, returned by ``run_on_ranks``)."""

    bucket_cap_mb: float | None
    buckets: list[BucketRecord]
    grad_ready_s: dict[str, float]  # parameter name -> when its gradient was accumulated
    backward_s: float  # when loss.backward() returned (after every all-reduce finished)
    step_s: float  # forward + backward + optimizer step
    first_iteration_buckets: list[list[str]]
    param_names: list[str]  # model.parameters() order

    @property
    def compute_end_s(self) -> float:
        """When the last gradient became ready: backward's computation ends here."""
        return max(self.grad_ready_s.values())

    def overlapped(self) -> bool:
        """Some bucket's all-reduce was launched while gradients were still being computed."""
        return any(bucket.start_s < self.compute_end_s for bucket in self.buckets)

    def in_reverse_order(self) -> bool:
        """The buckets, by index, hold the parameters in reverse ``model.parameters()`` order,
        and they were launched in index order."""
        ordered = sorted(self.buckets, key=lambda bucket: bucket.index)
        names = [name for bucket in ordered for name in bucket.params]
        starts = [bucket.start_s for bucket in ordered]
        return names == self.param_names[::-1] and starts == sorted(starts)


def mlp(widths: tuple[int, ...] = DEFAULT_WIDTHS, seed: int = 0) -> torch.nn.Sequential:
    """Linear layers ``widths[i] -> widths[i+1]`` with ReLU between; the same weights for the same seed."""
    if len(widths) < 2:
        raise ValueError(f"widths needs at least an input and an output width, got {widths}.")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layers: list[torch.nn.Module] = []
        for fan_in, fan_out in zip(widths, widths[1:]):
            layers += [torch.nn.Linear(fan_in, fan_out), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers[:-1])


class _Recorder:
    """Times one DDP model's steps: a timing all-reduce comm hook plus per-parameter ready hooks.

    The comm hook averages like DDP's default ``allreduce_hook`` (divide by the world size, then
    an async all-reduce) and returns a future that completes when the all-reduce does."""

    def __init__(self, model: torch.nn.Module, bucket_cap_mb: float | None) -> None:
        self.bucket_cap_mb = bucket_cap_mb
        self.names = {id(p): name for name, p in model.named_parameters()}
        self.param_names = [name for name, _ in model.named_parameters()]
        self.ready: dict[str, float] = {}
        self.buckets: list[BucketRecord] = []
        self.first_iteration: list[list[str]] | None = None
        self.t0 = 0.0
        for name, param in model.named_parameters():  # tensor hooks: DDP's own hooks sit on the grad accumulator
            param.register_post_accumulate_grad_hook(lambda _, name=name: self._ready(name))
        self.ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
        self.ddp.register_comm_hook(None, self._hook)
        self.optimizer = torch.optim.SGD(self.ddp.parameters(), lr=1e-3)

    def _ready(self, name: str) -> None:
        self.ready[name] = time.perf_counter() - self.t0

    def _hook(self, _state, bucket):  # no annotations: DDP rejects string ones (this module's __future__ import)
        buffer = bucket.buffer()
        record = BucketRecord(bucket.index(), [self.names[id(p)] for p in bucket.parameters()],
                              buffer.numel() * buffer.element_size(), time.perf_counter() - self.t0, float("nan"))
        self.buckets.append(record)
        buffer.div_(dist.get_world_size())

        def done(future: torch.futures.Future) -> torch.Tensor:
            record.end_s = time.perf_counter() - self.t0
            return future.value()[0]

        return dist.all_reduce(buffer, async_op=True).get_future().then(done)

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> BucketTimeline:
        self.ready, self.buckets = {}, []
        self.optimizer.zero_grad(set_to_none=True)
        start = time.perf_counter()
        loss = torch.nn.functional.mse_loss(self.ddp(inputs), targets)
        self.t0 = time.perf_counter()
        loss.backward()
        backward_s = time.perf_counter() - self.t0
        self.optimizer.step()
        step_s = time.perf_counter() - start
        if self.first_iteration is None:
            self.first_iteration = [b.params for b in sorted(self.buckets, key=lambda b: b.index)]
        return BucketTimeline(self.bucket_cap_mb, sorted(self.buckets, key=lambda b: b.index), dict(self.ready),
                              backward_s, step_s, self.first_iteration, self.param_names)


def _batch(widths: tuple[int, ...], batch: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's slice of the data for ``step`` (different on every rank, as in data parallelism)."""
    generator = torch.Generator().manual_seed(1000 * step + dist.get_rank())
    return torch.randn(batch, widths[0], generator=generator), torch.randn(batch, widths[-1], generator=generator)


def record_ddp_step(bucket_cap_mb: float | None, widths: tuple[int, ...] = DEFAULT_WIDTHS, steps: int = 3,
                    batch: int = DEFAULT_BATCH) -> BucketTimeline:
    """Per rank: train ``mlp(widths)`` under DDP for ``steps`` steps (at least 2, so the buckets
    are rebuilt) and return the last step's timeline, with the first iteration's buckets."""
    if steps < WARMUP_STEPS:
        raise ValueError(f"steps must be at least {WARMUP_STEPS}: DDP rebuilds its buckets after the first.")
    recorder = _Recorder(mlp(widths), bucket_cap_mb)
    for step in range(steps):
        timeline = recorder.step(*_batch(widths, batch, step))
    return timeline


def _sweep_rank(caps_mb: tuple[float | None, ...], widths: tuple[int, ...], batch: int, repeats: int) -> list[dict]:
    """Per rank: one DDP model per cap, warmed up, then ``repeats`` rounds of one step per cap."""
    recorders = [_Recorder(mlp(widths), cap) for cap in caps_mb]
    times: list[list[float]] = [[] for _ in caps_mb]
    last: list[BucketTimeline | None] = [None] * len(caps_mb)
    done = 0
    for round_ in range(WARMUP_STEPS + repeats):
        for i, recorder in enumerate(recorders):
            last[i] = recorder.step(*_batch(widths, batch, round_))
            if round_ >= WARMUP_STEPS:
                times[i].append(last[i].step_s)
            if dist.get_rank() == 0:
                print(f"{_PROGRESS}{done}", flush=True)
            done += 1
    return [{"bucket_cap_mb": cap, "num_buckets": len(timeline.buckets), "step_times_s": step_times,
             "timeline": timeline} for cap, step_times, timeline in zip(caps_mb, times, last)]


def sweep_step_count(caps_mb: tuple[float | None, ...] = DEFAULT_CAPS_MB, repeats: int = 5) -> int:
    """How many times ``bucket_cap_sweep`` calls ``on_step`` (warm-up steps included)."""
    return len(caps_mb) * (WARMUP_STEPS + repeats)


def bucket_cap_sweep(caps_mb: tuple[float | None, ...] = DEFAULT_CAPS_MB, world_size: int = 2, repeats: int = 5,
                     widths: tuple[int, ...] = DEFAULT_WIDTHS, batch: int = DEFAULT_BATCH,
                     on_step: Callable[[int], None] | None = None) -> list[dict]:
    """For each cap: ``num_buckets``, ``median_step_s`` over ``repeats`` steady-state steps and
    rank 0's last ``timeline``. Caps take turns step by step, so machine noise hits them alike.
    ``on_step(i)`` is called after each of the ``sweep_step_count(caps_mb, repeats)`` steps."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}.")

    rows = run_on_ranks(_sweep_rank, world_size, tuple(caps_mb), tuple(widths), batch, repeats,
                        trace_calls=False, on_print=progress_lines(_PROGRESS, on_step))[0]
    return [{"bucket_cap_mb": row["bucket_cap_mb"], "num_buckets": row["num_buckets"],
             "median_step_s": statistics.median(row["step_times_s"]), "timeline": row["timeline"]} for row in rows]
