"""DDP's reducer written out by hand: bucket the gradients, all-reduce each bucket as soon as its
last gradient is ready, while backward goes on computing the earlier layers.

    reducer = BucketedReducer(model, bucket_cap_bytes=2 * MIB)
    loss.backward()        # buckets are launched from inside backward
    reducer.wait()         # every .grad now holds the average over the ranks
    optimizer.step()

Buckets are ``assign_buckets``'s (bucket 0 holds the last parameters). One
``register_post_accumulate_grad_hook`` per parameter counts down its bucket's missing gradients;
gradients may arrive in any order. A full bucket is flattened into one buffer and launched with
``dist.all_reduce(buffer, async_op=True)``, but only after every lower-numbered bucket was
launched: each rank must issue the same all-reduces in the same order, whatever order its own
gradients came in (DDP's rule too). ``wait()`` then waits for every handle, divides by the world
size and copies each slice back into its ``.grad``.

``work.wait()`` differs by backend. On CUDA (NCCL) it makes the current stream wait for the
communication stream (a stream dependency): the CPU does not block, and the kernels queued
after it (the optimizer step) run once the all-reduce is done. On gloo (CPU) it blocks the
calling thread until the all-reduce has finished.
"""

from __future__ import annotations

import functools
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from course_lib.collectives.buckets import MIB, assign_buckets
from course_lib.collectives.ddp_timeline import DEFAULT_BATCH, DEFAULT_WIDTHS, mlp


class BucketedReducer:
    """Average gradients over the ranks bucket by bucket, overlapping communication with backward.

    Invariants between ``wait()`` calls: ``arrived`` holds the parameter indices whose gradient
    came in this backward, ``missing[b]`` counts bucket ``b``'s others;
    buckets ``0 .. next_bucket - 1`` are launched, in that order, on every rank alike.
    ``launched_at[b]`` is bucket ``b``'s launch time (``time.perf_counter()``) in the last backward.
    """

    def __init__(self, model: torch.nn.Module, bucket_cap_bytes: int,
                 first_bucket_cap_bytes: int | None = None) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        sizes = [p.numel() * p.element_size() for p in self.params]
        self.buckets = assign_buckets(sizes, bucket_cap_bytes, first_bucket_cap_bytes)
        self.bucket_of = {index: b for b, bucket in enumerate(self.buckets) for index in bucket}
        self.launched_at = [float("nan")] * len(self.buckets)
        self._reset()
        self.hooks = [p.register_post_accumulate_grad_hook(functools.partial(self._ready, index))
                      for index, p in enumerate(self.params)]

    def _reset(self) -> None:
        self.missing = [len(bucket) for bucket in self.buckets]
        self.arrived: set[int] = set()
        self.next_bucket = 0
        self.works: list[dist.Work] = []
        self.flat: list[torch.Tensor] = []

    def _ready(self, index: int, _param: torch.Tensor) -> None:
        if index in self.arrived:
            raise RuntimeError("a gradient arrived twice: call wait() after each backward.")
        self.arrived.add(index)
        self.missing[self.bucket_of[index]] -= 1
        while self.next_bucket < len(self.buckets) and self.missing[self.next_bucket] == 0:
            self._launch(self.next_bucket)
            self.next_bucket += 1

    @torch.no_grad()
    def _launch(self, bucket: int) -> None:
        flat = torch.cat([self.params[index].grad.reshape(-1) for index in self.buckets[bucket]])
        self.launched_at[bucket] = time.perf_counter()
        self.works.append(dist.all_reduce(flat, async_op=True))
        self.flat.append(flat)

    @torch.no_grad()
    def wait(self) -> None:
        """Wait for every bucket, then put the average into each ``.grad``; ready for the next backward."""
        if self.next_bucket < len(self.buckets):
            missing = sorted(set(range(len(self.params))) - self.arrived)
            raise RuntimeError(f"{len(self.buckets) - self.next_bucket} bucket(s) never launched: parameters "
                               f"{missing} (model.parameters() indices) got no gradient in this backward.")
        world = dist.get_world_size()
        for bucket, work, flat in zip(self.buckets, self.works, self.flat):
            work.wait()
            flat /= world
            offset = 0
            for index in bucket:
                grad = self.params[index].grad
                grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
                offset += grad.numel()
        self._reset()

    def remove(self) -> None:
        """Remove the gradient hooks: the model trains without this reducer again."""
        for hook in self.hooks:
            hook.remove()
        self.hooks = []


def against_ddp(bucket_cap_mb: float = 0.5, widths: tuple[int, ...] = DEFAULT_WIDTHS,
                batch: int = DEFAULT_BATCH) -> dict:
    """Per rank: one backward of ``mlp(widths)`` under DDP and one under ``BucketedReducer``, on
    this rank's own rows; the largest gradient difference, the reducer's buckets, and how many
    of them it launched before backward's last gradient was ready."""
    reference, mine = mlp(widths), mlp(widths)
    ddp = DistributedDataParallel(reference, bucket_cap_mb=bucket_cap_mb)
    ready = []  # hooks registered before the reducer's run before them
    for param in mine.parameters():
        param.register_post_accumulate_grad_hook(lambda _: ready.append(time.perf_counter()))
    reducer = BucketedReducer(mine, int(bucket_cap_mb * MIB))
    generator = torch.Generator().manual_seed(dist.get_rank())
    inputs = torch.randn(batch, widths[0], generator=generator)
    targets = torch.randn(batch, widths[-1], generator=generator)
    torch.nn.functional.mse_loss(ddp(inputs), targets).backward()
    torch.nn.functional.mse_loss(mine(inputs), targets).backward()
    reducer.wait()
    difference = max((a.grad - b.grad).abs().max().item() for a, b in zip(reference.parameters(), mine.parameters()))
    reducer.remove()
    return {"max_difference": difference, "buckets": len(reducer.buckets),
            "launched_before_last_gradient": sum(at < max(ready) for at in reducer.launched_at)}
