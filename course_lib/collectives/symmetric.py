"""One-shot and two-shot all-reduce over symmetric buffers, on CPU ranks.

Symmetric memory: every rank allocates a buffer of the same size, and every rank can address
every peer's buffer directly, loading and storing into it without the peer taking part. On GPUs
``torch.distributed._symmetric_memory`` gives this: ``empty`` allocates the buffer,
``rendezvous`` exchanges the IPC handles over NVLink and returns a handle with every peer's
buffer and a signal pad, and the kernels ``torch.ops.symm_mem.one_shot_all_reduce`` and
``torch.ops.symm_mem.two_shot_all_reduce_`` reduce by reading the peers' buffers. Here each
rank's buffer is a file in ``/dev/shm`` that every rank maps (``torch.from_file(shared=True)``),
and the signal pad is one int64 counter per rank, in a file of its own, spun on by the readers.

One-shot: copy in, signal, wait for every peer, sum all N buffers locally. One synchronisation
round; each rank reads (N-1)·K of its peers' memory. Two-shot: copy in, signal, wait; rank r
sums slice r (K/N) of every buffer and writes the sum back into its own buffer's slice r
(reduce-scatter by reading); signal, wait; copy every peer's reduced slice (all-gather by
reading). Two rounds; each rank reads about 2(N-1)/N·K of its peers' memory, so two-shot wins
once bandwidth, not the extra round, dominates.

The data written before a signal is visible to a reader that sees the signal because x86 keeps
stores in order (and loads in order); GPUs need release/acquire atomics on the signal pad.

On CUDA ranks (NCCL, a GPU each) ``DeviceSymmetricBuffers`` takes ``SymmetricBuffers``' place:
the same two functions then run PyTorch's kernels on a buffer from ``_symmetric_memory.empty``.
``symmetric_buffers`` picks the right one for the process group. (PyTorch marks that module
alpha: its names may change between releases.)
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from typing import Callable

import torch
import torch.distributed as dist

from course_lib.collectives.launch import progress_lines, run_on_ranks
from course_lib.collectives.ring import ring_all_reduce
from course_lib.perf.units import KiB

SIZES = [KiB * 4**k for k in range(9)]  # 1 KiB .. 64 MiB
STEP_MARKER = "@@symmetric-step "  # rank 0's progress line; ``benchmark`` turns it into on_step calls


class SymmetricTimeout(TimeoutError):
    """A rank waited too long for its peers' signals (a peer skipped the call, or died)."""


class SymmetricBuffers:
    """Every rank's buffer of ``numel`` elements (two slots, see below) mapped by every rank,
    plus each rank's signal counter. Collective: every rank of the world group constructs it,
    with the same arguments, and then makes the same sequence of all-reduce calls on it.

    The files are created in a fresh directory (under ``parent``, default ``/dev/shm``) whose
    name rank 0 picks and broadcasts, and removed as soon as every rank has mapped them: the
    memory lives on in the mappings, and nothing is left behind however the ranks end.

    Invariants. ``signals`` counts this rank's signals so far; every rank signals the same
    number of times per call, so waiting for signal ``s`` means waiting for the peers to reach
    the same point of the same call. Call number ``c`` uses slot ``c % 2``. Before writing slot
    ``c % 2`` in call ``c``, this rank has seen, in call ``c - 1``, every peer's first signal,
    which each peer sent after finishing call ``c - 2``, the last one to read that slot: no peer
    still reads what this rank overwrites, with no second signal round for it.
    """

    def __init__(self, numel: int, dtype: torch.dtype = torch.float32, timeout_s: float = 10.0,
                 parent: str | None = None) -> None:
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.numel, self.dtype, self.timeout_s = numel, dtype, timeout_s
        self.calls = self.signals = 0
        chosen = [None]
        if self.rank == 0:
            default = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
            chosen[0] = tempfile.mkdtemp(prefix="symmetric_", dir=parent or default)
        dist.broadcast_object_list(chosen, src=0)
        self.directory: str = chosen[0]
        try:
            for name, count, itemsize in (("data", 2 * numel, dtype.itemsize), ("signal", 1, 8)):
                with open(os.path.join(self.directory, f"{name}{self.rank}"), "wb") as file:
                    file.truncate(count * itemsize)
            dist.barrier()  # every rank's files exist
            self.slots = [torch.from_file(os.path.join(self.directory, f"data{peer}"), shared=True,
                                          size=2 * numel, dtype=dtype).view(2, numel)
                          for peer in range(self.world_size)]
            self._signals = [torch.from_file(os.path.join(self.directory, f"signal{peer}"), shared=True,
                                             size=1, dtype=torch.int64).numpy()
                             for peer in range(self.world_size)]
            dist.barrier()  # every rank has mapped every file
        finally:
            if self.rank == 0:
                shutil.rmtree(self.directory, ignore_errors=True)

    def signal(self) -> None:
        """Tell every peer this rank has reached its next signal point (its writes before it done)."""
        self.signals += 1
        self._signals[self.rank][0] = self.signals

    def wait(self) -> None:
        """Spin until every peer has signalled as often as this rank; raise ``SymmetricTimeout``
        after ``timeout_s``."""
        deadline = time.monotonic() + self.timeout_s
        waiting = [peer for peer in range(self.world_size) if peer != self.rank]
        while waiting:
            waiting = [peer for peer in waiting if self._signals[peer][0] < self.signals]
            if waiting and time.monotonic() > deadline:
                seen = ", ".join(f"rank {peer} at {int(self._signals[peer][0])}" for peer in waiting)
                raise SymmetricTimeout(
                    f"rank {self.rank} waited {self.timeout_s:g} s for signal {self.signals} "
                    f"(call {self.calls}) of its peers, but saw {seen}: every rank must make the same "
                    "all-reduce calls on the same SymmetricBuffers; a peer skipped one or died.")
            os.sched_yield()  # ranks may outnumber cores: let the peer being waited for run

    def begin(self, tensor: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Start a call: check ``tensor``, copy it into this rank's slot; return the flat tensor
        and every rank's slot for this call, cut to the tensor's size."""
        if tensor.dtype != self.dtype or tensor.numel() > self.numel or not tensor.is_contiguous():
            raise ValueError(f"expected a contiguous {self.dtype} tensor of at most {self.numel} elements, got "
                             f"{tensor.dtype} of {tensor.numel()} (contiguous: {tensor.is_contiguous()})")
        slot = self.calls % 2
        self.calls += 1
        flat = tensor.view(-1)
        views = [slots[slot, :flat.numel()] for slots in self.slots]
        views[self.rank].copy_(flat)
        return flat, views

    def close(self) -> None:
        """Drop this rank's mappings (the memory goes once every rank has closed or exited)."""
        self.slots, self._signals = [], []

    def __enter__(self) -> SymmetricBuffers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class DeviceSymmetricBuffers:
    """One rank's CUDA buffer of ``numel`` elements from ``torch.distributed._symmetric_memory.empty``,
    rendezvoused with every rank of the world group (which exchanges the peers' addresses and sets
    up the signal pads). Collective, like ``SymmetricBuffers``; the reductions are PyTorch's kernels
    ``torch.ops.symm_mem.one_shot_all_reduce`` and ``two_shot_all_reduce_``, which read the peers'
    buffers over NVLink."""

    def __init__(self, numel: int, dtype: torch.dtype = torch.bfloat16) -> None:
        from torch.distributed import _symmetric_memory as symm_mem

        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.numel, self.dtype = numel, dtype
        self.group_name = dist.group.WORLD.group_name
        self.buffer = symm_mem.empty(numel, dtype=dtype, device=torch.device("cuda", torch.cuda.current_device()))
        self.handle = symm_mem.rendezvous(self.buffer, self.group_name)

    def staged(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` copied into the front of this rank's symmetric buffer (the kernels read it there)."""
        if tensor.dtype != self.dtype or tensor.numel() > self.numel or tensor.device != self.buffer.device:
            raise ValueError(f"expected a {self.dtype} tensor of at most {self.numel} elements on {self.buffer.device}, "
                             f"got {tensor.dtype} of {tensor.numel()} on {tensor.device}")
        view = self.buffer[:tensor.numel()]
        view.copy_(tensor.reshape(-1))
        return view

    def close(self) -> None:
        self.buffer = self.handle = None

    def __enter__(self) -> DeviceSymmetricBuffers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def symmetric_buffers(numel: int, dtype: torch.dtype, timeout_s: float = 10.0) -> SymmetricBuffers | DeviceSymmetricBuffers:
    """The symmetric buffers for this process group: on the GPU under NCCL, in shared memory otherwise."""
    if dist.get_backend() != "gloo" and torch.cuda.is_available():
        return DeviceSymmetricBuffers(numel, dtype)
    return SymmetricBuffers(numel, dtype, timeout_s)


def one_shot_all_reduce(tensor: torch.Tensor, buffers: SymmetricBuffers | DeviceSymmetricBuffers) -> torch.Tensor:
    """Sum ``tensor`` over all ranks, in place, by reading every peer's buffer; return it.
    Every rank adds in rank order, so all ranks get the same bits."""
    if isinstance(buffers, DeviceSymmetricBuffers):
        summed = torch.ops.symm_mem.one_shot_all_reduce(buffers.staged(tensor), "sum", buffers.group_name)
        return tensor.copy_(summed.view_as(tensor))
    flat, views = buffers.begin(tensor)
    buffers.signal()
    buffers.wait()
    flat.copy_(views[0])
    for view in views[1:]:
        flat.add_(view)
    return tensor


def two_shot_all_reduce(tensor: torch.Tensor, buffers: SymmetricBuffers | DeviceSymmetricBuffers) -> torch.Tensor:
    """Sum ``tensor`` over all ranks, in place: reduce this rank's 1/N slice (``tensor_split``)
    from every buffer into its own buffer, then gather the peers' reduced slices; return it.
    Slice r of any buffer is written only by rank r, and only after every rank's data is in."""
    if isinstance(buffers, DeviceSymmetricBuffers):
        staged = buffers.staged(tensor)
        torch.ops.symm_mem.two_shot_all_reduce_(staged, "sum", buffers.group_name)
        return tensor.copy_(staged.view_as(tensor))
    rank = buffers.rank
    flat, views = buffers.begin(tensor)
    buffers.signal()
    buffers.wait()
    mine = flat.tensor_split(buffers.world_size)
    slices = [view.tensor_split(buffers.world_size) for view in views]
    mine[rank].copy_(slices[0][rank])
    for peer_slices in slices[1:]:
        mine[rank].add_(peer_slices[rank])
    slices[rank][rank].copy_(mine[rank])
    buffers.signal()
    buffers.wait()
    for peer in range(buffers.world_size):
        if peer != rank:
            mine[peer].copy_(slices[peer][peer])
    return tensor


def largest_difference(sizes: tuple[int, ...] = (1, 7, 1000, 1 << 20), dtype: torch.dtype = torch.float32) -> float:
    """Run on every rank: the largest |one-shot or two-shot - ``dist.all_reduce``| over random
    tensors of each size (each algorithm twice on the same buffers), on this rank's device."""
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() != "gloo" else torch.device("cpu")
    worst = 0.0
    with symmetric_buffers(max(sizes), dtype) as buffers:
        for repeat in range(2):
            for size in sizes:
                for all_reduce in (one_shot_all_reduce, two_shot_all_reduce):
                    generator = torch.Generator().manual_seed(1000 * dist.get_rank() + 10 * size + repeat)
                    data = torch.randn(size, dtype=dtype, generator=generator).to(device)
                    expected = data.clone()
                    dist.all_reduce(expected)
                    worst = max(worst, (all_reduce(data, buffers) - expected).abs().max().item())
    return worst


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_all_reduces(sizes: list[int], repeats: int, report_steps: bool = False) -> list[dict]:
    """Run on every rank: for each message size (bytes of float32), the slowest rank's median
    seconds of one-shot, two-shot, the hand-written ring (``collectives/ring.py``) and the
    backend's own ``dist.all_reduce`` (keyed ``gloo_s`` or ``nccl_s``), interleaved repeat by
    repeat. Under NCCL the tensors live on each rank's GPU. Every rank returns the same rows;
    ``report_steps``: rank 0 prints ``STEP_MARKER`` and the size's index as each size is done."""
    backend = dist.get_backend()
    device = torch.device("cuda", torch.cuda.current_device()) if backend != "gloo" else torch.device("cpu")
    contenders: dict[str, Callable] = {"one_shot_s": one_shot_all_reduce, "two_shot_s": two_shot_all_reduce,
                                       "ring_s": lambda tensor, _buffers: ring_all_reduce(tensor),
                                       f"{'gloo' if backend == 'gloo' else 'nccl'}_s":
                                           lambda tensor, _buffers: dist.all_reduce(tensor)}
    rows = []
    with symmetric_buffers(max(sizes) // 4, torch.float32, timeout_s=60.0) as buffers:
        for step, size in enumerate(sizes):
            data = torch.ones(size // 4, device=device)
            samples: dict[str, list[float]] = {name: [] for name in contenders}
            for _ in range(repeats):
                for name, all_reduce in contenders.items():
                    dist.barrier()
                    _synchronize(device)
                    started = time.perf_counter()
                    all_reduce(data, buffers)
                    _synchronize(device)
                    samples[name].append(time.perf_counter() - started)
                    data.fill_(1.0)
            medians = {name: statistics.median(values) for name, values in samples.items()}
            everyone = [None] * buffers.world_size
            dist.all_gather_object(everyone, medians)
            rows.append({"bytes": size, **{name: max(m[name] for m in everyone) for name in contenders}})
            if report_steps and buffers.rank == 0:
                print(f"{STEP_MARKER}{step}", flush=True)
    return rows


def benchmark(world_size: int, sizes: list[int] = SIZES, repeats: int = 5,
              on_step: Callable[[int], None] | None = None, timeout_s: float = 600.0,
              backend: str = "gloo") -> list[dict]:
    """``time_all_reduces`` on ``world_size`` local ranks (``backend="nccl"``: a GPU each); its rows.
    ``on_step(i)`` is called for i = 0 .. ``len(sizes) - 1`` as rank 0 finishes each size."""
    return run_on_ranks(time_all_reduces, world_size, sizes, repeats, report_steps=True, backend=backend,
                        timeout_s=timeout_s, trace_calls=False, on_print=progress_lines(STEP_MARKER, on_step))[0]


BASELINES = ("gloo", "nccl", "ring")  # what the symmetric all-reduces are compared with, when a row has it


def crossovers(rows: list[dict]) -> dict[str, int | None]:
    """For each pairing (two-shot over one-shot, then each symmetric all-reduce over each baseline
    the rows hold), the smallest message size (bytes) from which the first is faster at every
    larger size of ``rows``; None if it is not faster at the largest."""
    pairs = {"two_shot_over_one_shot": ("two_shot_s", "one_shot_s")}
    for baseline in BASELINES:
        if f"{baseline}_s" in rows[0]:
            for shot in ("one_shot", "two_shot"):
                pairs[f"{shot}_over_{baseline}"] = (f"{shot}_s", f"{baseline}_s")
    found: dict[str, int | None] = {}
    for label, (faster, slower) in pairs.items():
        found[label] = None
        for row in reversed(rows):
            if row[faster] >= row[slower]:
                break
            found[label] = row["bytes"]
    return found
