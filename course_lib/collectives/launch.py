"""Run one function on N real ``torch.distributed`` ranks, from a script or a notebook cell.

    def demo():
        t = torch.tensor([dist.get_rank() + 1.0])
        dist.all_reduce(t)
        return t

    run_on_ranks(demo, world_size=4)   # -> [tensor([10.]), tensor([10.]), tensor([10.]), tensor([10.])]

Each rank is a fresh process joined to one process group (gloo on CPUs, NCCL when every rank
can have its own GPU). Return values (tensors included) come back in rank order. What a rank
prints appears in the caller's output prefixed with ``[rank r]``.

A run never hangs: the caller watches every rank, and every collective a rank enters and leaves.
When ``timeout_s`` passes, all ranks are stopped and ``CollectiveTimeout`` names the ranks
that did not finish and the collective each is stuck in. A rank that raises or dies stops the
others and ``RankFailure`` leads with the root cause: when one rank fails, its peers often fail
too ("Connection reset by peer"), so the caller waits a moment for every rank's outcome and puts
the most telling one first (a rank that gloo aborts, e.g. on a size mismatch, is reported with
the native error text it printed), then one line per other rank.

Tracing (``trace_calls=True``) swaps torch.distributed's communication functions for wrappers;
the same wrapper is installed wherever torch looks the function up, so identity checks inside
torch (``dist.P2POp(dist.isend, ...)``, ``batch_isend_irecv``) still hold.

Ranks start by ``fork`` where the OS has it (Linux), so functions defined in a notebook cell
work; elsewhere they start by ``spawn`` and the function must be importable from a module.

The ranks meet through a file, not a TCP store, and wait for one another before running ``fn``
(``rendezvous.py`` says why). Should they still lose a connection while joining, before any rank
reached ``fn``, the launch starts again (``JOIN_ATTEMPTS`` in all), each retry logged as a warning;
a failure once any rank may have run ``fn`` is never retried, since ``fn`` may have side effects.
"""

from __future__ import annotations

import datetime
import faulthandler
import functools
import io
import logging
import multiprocessing
import os
import queue as queue_module
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from course_lib.collectives.rendezvous import StoreFile, meet


TRACED_CALLS = ("broadcast", "reduce", "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single",
                "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "all_to_all", "all_to_all_single",
                "scatter", "gather", "barrier", "monitored_barrier", "send", "recv", "isend", "irecv",
                "batch_isend_irecv", "all_gather_object", "gather_object", "broadcast_object_list",
                "scatter_object_list", "send_object_list", "recv_object_list", "new_group", "new_subgroups")

FAILURE_GRACE_S = 1.5  # after a first failure, how long to wait for the other ranks' outcomes
NATIVE_TAIL_LINES = 12  # lines of a dead rank's native output quoted in the error
JOIN_ATTEMPTS = 3  # launches tried in all when the ranks lose a connection while joining their group

# What a rank raises when a peer failed first: true, but not the cause. Matched against the
# exception lines of a traceback (the unindented ones), not its source lines.
_SECONDARY = re.compile(r"connection (reset|closed|refused)|closed by peer|reset by peer|broken pipe|"
                        r"econnreset|epipe|socket closed|remote worker (crashing|hanging)|"
                        r"peer (disconnected|closed)", re.IGNORECASE)
# A failure to join that the network, not the caller's code or set-up, explains: worth one more try.
_NETWORK = re.compile(_SECONDARY.pattern + r"|timed out|address already in use", re.IGNORECASE)

_log = logging.getLogger(__name__)


class RankFailure(RuntimeError):
    """A rank raised an exception or died; the message holds its traceback or exit code, ``cause``
    the one line that explains it best. ``ranks_in_step``: every rank answered (a result or an
    exception) after the same number of collective calls, so none is left waiting inside one."""

    def __init__(self, message: str, cause: str = "", ranks_in_step: bool = False) -> None:
        super().__init__(message)
        self.cause, self.ranks_in_step = cause, ranks_in_step


class CollectiveTimeout(TimeoutError):
    """The run passed its time limit; the message says which ranks were stuck where."""


def default_backend(world_size: int) -> str:
    """NCCL when there is a GPU for every rank, gloo otherwise. Also gloo once this process has
    started CUDA: forked ranks cannot use CUDA then."""
    if torch.cuda.is_initialized() or not torch.cuda.is_available() or torch.cuda.device_count() < world_size:
        return "gloo"
    return "nccl"


class _QueueWriter(io.TextIOBase):
    """A rank's stdout/stderr: whole lines go to the caller as ('print', rank, text)."""

    def __init__(self, messages, rank: int) -> None:
        self.messages, self.rank, self.buffer = messages, rank, ""

    def write(self, text: str) -> int:
        self.buffer += text
        while "\n" in self.buffer:
            line, self.buffer = self.buffer.split("\n", 1)
            self.messages.put(("print", self.rank, line))
        return len(text)

    def flush(self) -> None:
        if self.buffer:
            self.messages.put(("print", self.rank, self.buffer))
            self.buffer = ""


def _trace_collectives(messages, rank: int) -> None:
    """Wrap torch.distributed's communication calls (in this rank's process only) so the caller
    knows which one each rank is inside.

    Each wrapper replaces the function both in ``torch.distributed`` and in
    ``torch.distributed.distributed_c10d``, where torch's own code finds it (``P2POp`` checks
    ``op in [isend, irecv]`` there, ``batch_isend_irecv`` checks ``op.op is isend``). A call made
    from inside another traced call (``all_gather_object`` calls ``all_gather``) is not reported
    separately: the caller sees the call the rank's code made."""
    depth = threading.local()  # traced calls this thread is inside
    for name in TRACED_CALLS:
        original = getattr(dist, name, None)
        if original is None or getattr(original, "_launch_traced", False):  # not in this torch release, or done
            continue
        traced = _traced(original, name, messages, rank, depth)
        for namespace in (dist, c10d):
            if getattr(namespace, name, None) is original:
                setattr(namespace, name, traced)


def _traced(original: Callable, name: str, messages, rank: int, depth: threading.local) -> Callable:
    @functools.wraps(original)
    def traced(*args, **kwargs):
        outermost = getattr(depth, "n", 0) == 0
        depth.n = getattr(depth, "n", 0) + 1
        if outermost:
            messages.put(("enter", rank, name))
        try:
            return original(*args, **kwargs)
        finally:
            depth.n -= 1
            if outermost:
                messages.put(("exit", rank, name))

    traced._launch_traced = True
    return traced


@dataclass(frozen=True)
class RankPlan:
    """What every rank of one launch attempt needs to join it (inherited by ``fork``, pickled by ``spawn``).

    ``joined`` is set by the first rank past the barrier that ends joining: once it is set, a rank
    may be running the caller's code."""

    world_size: int
    backend: str
    store_path: str
    timeout_s: float
    trace_calls: bool
    messages: Any  # the caller's queue: prints, calls entered and left, results and errors
    native_logs: tuple[str, ...]
    joined: Any  # a multiprocessing Event


def join_process_group(rank: int, plan: RankPlan) -> None:
    """Set this rank's process up: native output to its log, Python output to the caller as lines,
    one thread, its GPU under NCCL, and the process group (traced when ``plan.trace_calls``);
    return once every rank has joined."""
    # What native code writes (gloo's abort message on a size mismatch, C++ warnings) bypasses
    # sys.stdout/sys.stderr: it goes to a file the caller reads, and outlives a rank that aborts.
    log_fd = os.open(plan.native_logs[rank], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    if faulthandler.is_enabled():  # inherited from pytest or ipykernel, writing to their own copy of stderr
        faulthandler.enable(file=2, all_threads=True)
    sys.stdout = sys.stderr = _QueueWriter(plan.messages, rank)
    if sys.platform == "linux":  # this launcher's ranks share one machine: loopback, whatever its network
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)  # N ranks share the machine's cores
    if plan.backend == "nccl":
        torch.cuda.set_device(rank)
    # the backend's own timeout comes later than the caller's, whose message says more
    meet(rank, plan.world_size, "cpu:gloo,cuda:nccl" if plan.backend == "nccl" else plan.backend,  # CPU tensors work under NCCL too
         plan.store_path, datetime.timedelta(seconds=2 * plan.timeout_s + 10))
    if plan.trace_calls:
        _trace_collectives(plan.messages, rank)
    plan.joined.set()


def report_result(messages, rank: int, call: Callable[[], Any]) -> bool:
    """Run ``call`` and send its result (tensors moved to the CPU) or its traceback to the caller;
    return whether it succeeded."""
    try:
        result = call()
        payload = io.BytesIO()
        torch.save(_to_cpu(result), payload)
        sys.stdout.flush()
        messages.put(("result", rank, payload.getvalue()))
        return True
    except BaseException:  # noqa: BLE001 - everything a rank raises goes back to the caller
        sys.stdout.flush()
        messages.put(("error", rank, traceback.format_exc()))
        return False


def _rank_main(rank: int, plan: RankPlan, fn: Callable, args: tuple, kwargs: dict) -> None:
    def run() -> Any:
        join_process_group(rank, plan)
        return fn(*args, **kwargs)

    try:
        report_result(plan.messages, rank, run)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _to_cpu(value: Any) -> Any:
    """Tensors (also inside lists, tuples and dicts) moved to the CPU so the caller can load them."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    return value


def progress_lines(marker: str, on_step: Callable[[int], None] | None) -> Callable[[int, str], None]:
    """An ``on_print`` for ``run_on_ranks`` whose ranks report progress as lines ``f"{marker}{i}"``:
    those become ``on_step(i)`` calls (swallowed when ``on_step`` is None); other lines print
    prefixed with their rank."""
    def on_print(rank: int, line: str) -> None:
        if line.startswith(marker):
            if on_step is not None:
                on_step(int(line[len(marker):]))
        else:
            print(f"[rank {rank}] {line}", flush=True)

    return on_print


def run_on_ranks(fn: Callable, world_size: int, *args, backend: str | None = None, timeout_s: float = 60.0,
                 on_print: Callable[[int, str], None] | None = None, trace_calls: bool = True, **kwargs) -> list:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks; return each rank's result, in rank order.

    ``on_print(rank, line)`` receives what the ranks print (default: print it prefixed), native
    output (C++ warnings) included.
    ``trace_calls=False`` skips watching collectives (for timing: a timeout then cannot say where
    each rank was).
    """
    ranks = RankProcesses(world_size, fn, on_print, "run_on_ranks_", backend or default_backend(world_size),
                          timeout_s, trace_calls)
    try:
        return ranks.launch(_rank_main, lambda rank: (fn, args, kwargs))
    finally:
        ranks.stop()


class RankProcesses:
    """The processes of one launch: their message queue, native logs and store; start, collect, stop.

    ``fn`` is what the ranks will run (checked here: under ``spawn`` it must be importable)."""

    def __init__(self, world_size: int, fn: Callable, on_print: Callable[[int, str], None] | None,
                 log_prefix: str, backend: str, timeout_s: float, trace_calls: bool = True) -> None:
        if not 1 <= world_size <= 64:
            raise ValueError(f"world_size must be between 1 and 64, got {world_size}.")
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        if method == "spawn" and fn.__module__ == "__main__":
            raise ValueError(f"{fn.__name__} is defined in the notebook, but this OS starts ranks by spawn: "
                             "move it into a .py module and import it.")
        self.world_size, self.fn_name, self.log_prefix = world_size, getattr(fn, "__name__", repr(fn)), log_prefix
        self.backend, self.timeout_s, self.trace_calls = backend, timeout_s, trace_calls
        self.context = multiprocessing.get_context(method)
        self.on_print = on_print or (lambda rank, line: print(f"[rank {rank}] {line}", flush=True))
        self._open()

    def _open(self) -> None:
        """A fresh message queue, log folder, store file and joined event: one attempt's own."""
        self.messages = self.context.Queue()
        self.joined = self.context.Event()
        self.store = StoreFile(self.log_prefix + "store_", inherited=self.context.get_start_method() == "fork")
        self.log_dir = tempfile.mkdtemp(prefix=self.log_prefix)
        self.native = _NativeOutput([os.path.join(self.log_dir, f"rank{rank}.log") for rank in range(self.world_size)])
        self.processes: list = []
        self._outcomes: _Outcomes | None = None  # what an interrupted collect had heard so far

    def launch(self, target: Callable, args_of_rank: Callable[[int], tuple]) -> list:
        """Start ``target(rank, plan, *args_of_rank(rank))`` on every rank; return their first results
        (``RankFailure`` / ``CollectiveTimeout`` otherwise).

        Ranks that lose a connection while joining, before any of them was let through to the
        caller's code, are stopped and started afresh, at most ``JOIN_ATTEMPTS`` launches in all."""
        attempt = 1
        while True:
            plan = RankPlan(self.world_size, self.backend, self.store.path, self.timeout_s, self.trace_calls,
                            self.messages, tuple(self.native.paths), self.joined)
            self.processes = [self.context.Process(target=target, daemon=True, args=(rank, plan, *args_of_rank(rank)))
                              for rank in range(self.world_size)]
            for process in self.processes:
                process.start()
            try:
                return self.collect(self.timeout_s)
            except RankFailure as failure:
                if attempt == JOIN_ATTEMPTS or not _NETWORK.search(failure.cause):
                    raise
                self._end_processes(grace_s=0.0)  # first, so that no rank can pass the barrier after the check
                if self.joined.is_set():
                    raise
                _log.warning("%d ranks lost a connection while joining their process group, before running %s "
                             "(%s); starting them again, launch %d of at most %d.", self.world_size, self.fn_name,
                             failure.cause, attempt + 1, JOIN_ATTEMPTS)
                self.stop()
                self._open()
                attempt += 1

    def collect(self, timeout_s: float) -> list:
        """Every rank's next result, in rank order (``RankFailure`` / ``CollectiveTimeout`` otherwise).

        A collect left by an exception of the caller's own (Ctrl-C) keeps what it had read: the
        next collect goes on with the same call, so no reply is lost or read as a later call's."""
        if self._outcomes is None:
            self._outcomes = _Outcomes(self.world_size)
        try:
            results = _collect(self.processes, self.messages, timeout_s, self.on_print, self.native, self._outcomes)
        except (RankFailure, CollectiveTimeout):
            self._outcomes = None
            raise
        self._outcomes = None
        return results

    def _end_processes(self, grace_s: float) -> None:
        grace_until = time.monotonic() + grace_s
        for process in self.processes:
            if process.pid is not None:
                process.join(timeout=max(0.0, grace_until - time.monotonic()))
        for process in self.processes:
            if process.is_alive():
                process.kill()
                process.join()

    def stop(self, grace_s: float = 1.0) -> None:
        """Wait up to ``grace_s`` for the ranks to exit (ranks that returned are closing their process
        group), kill the rest, pass on what they wrote meanwhile, and remove their files."""
        self._end_processes(grace_s)
        self.messages.close()
        self.native.poll(self.on_print, force=True)
        self.native.close()
        shutil.rmtree(self.log_dir, ignore_errors=True)
        self.store.close()


class _NativeOutput:
    """Each rank's native stdout/stderr file, read as it grows: whole lines go to ``on_print``,
    and the last few are kept for the error message should the rank die."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths
        for path in paths:
            open(path, "wb").close()
        self.files = [open(path, "rb") for path in paths]
        self.partial = [b""] * len(paths)
        self.tails: list[list[str]] = [[] for _ in paths]
        self.frozen = [False] * len(paths)  # once a Python fault dump starts, the lines before it matter
        self.last_poll = 0.0

    def poll(self, on_print, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last_poll < 0.1:  # a chatty rank's queue must not make this a busy loop
            return
        self.last_poll = now
        for rank, file in enumerate(self.files):
            data = self.partial[rank] + file.read()
            *lines, self.partial[rank] = data.split(b"\n")
            if force and self.partial[rank]:
                lines.append(self.partial[rank])
                self.partial[rank] = b""
            for raw in lines:
                line = raw.decode("utf-8", errors="replace").rstrip("\r")
                if not self.frozen[rank]:
                    self.tails[rank] = (self.tails[rank] + [line])[-NATIVE_TAIL_LINES:]
                    self.frozen[rank] = line.startswith("Fatal Python error")
                on_print(rank, line)

    def close(self) -> None:
        for file in self.files:
            file.close()


class _Outcomes:
    """What the caller has heard from, and seen of, each rank."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.results: dict[int, Any] = {}
        self.errors: dict[int, tuple[float, str]] = {}  # rank -> (when it arrived, traceback)
        self.exits: dict[int, tuple[float, int]] = {}  # rank -> (when first seen, exit code)
        self.inside: dict[int, list[str]] = {rank: [] for rank in range(world_size)}  # calls entered, not left
        self.last_call: dict[int, str] = {}
        self.calls: dict[int, int] = {rank: 0 for rank in range(world_size)}

    def reported(self, rank: int) -> bool:
        return rank in self.results or rank in self.errors

    def handle(self, kind: str, rank: int, body, on_print) -> None:
        if kind == "print":
            on_print(rank, body)
        elif kind == "enter":
            self.inside[rank].append(body)
            self.last_call[rank] = body
            self.calls[rank] += 1
        elif kind == "exit":
            stack = self.inside[rank]
            if body in stack:  # the innermost open call of that name
                del stack[len(stack) - 1 - stack[::-1].index(body)]
        elif kind == "error":
            self.errors[rank] = (time.monotonic(), body)
        elif kind == "result":
            self.results[rank] = torch.load(io.BytesIO(body), weights_only=False)

    def failed(self, now: float) -> bool:
        """A rank raised, died, or exited cleanly without a word for a while (its last message
        would have arrived by then)."""
        return bool(self.errors) or any(not self.reported(rank) and (code != 0 or now - seen > 1.0)
                                        for rank, (seen, code) in self.exits.items())

    def settled(self) -> bool:
        return all(self.reported(rank) or rank in self.exits for rank in range(self.world_size))

    def in_step(self) -> bool:
        """Every rank answered and all made the same number of collective calls: none waits in one."""
        return all(self.reported(rank) for rank in range(self.world_size)) and len(set(self.calls.values())) == 1


def _collect(processes, messages, timeout_s: float, on_print, native: _NativeOutput, outcomes: _Outcomes) -> list:
    world_size = len(processes)
    deadline = time.monotonic() + timeout_s
    failed_at = None
    while True:
        now = time.monotonic()
        if failed_at is None and len(outcomes.results) == world_size:
            native.poll(on_print, force=True)
            return [outcomes.results[rank] for rank in range(world_size)]
        for rank, process in enumerate(processes):
            if rank not in outcomes.exits and process.exitcode is not None:
                outcomes.exits[rank] = (now, process.exitcode)
        if failed_at is None and outcomes.failed(now):
            failed_at = now  # wait a little for the others: the first failure to arrive is often a consequence
        if failed_at is not None and (outcomes.settled() or now > failed_at + FAILURE_GRACE_S):
            _drain(messages, outcomes, on_print)
            native.poll(on_print, force=True)
            raise RankFailure(_failure_message(outcomes, native.tails), _cause(outcomes, native.tails),
                              outcomes.in_step())
        # checked on every pass: a chatty rank must not keep the deadline from being noticed
        if failed_at is None and now > deadline:
            native.poll(on_print, force=True)
            raise CollectiveTimeout(_timeout_message(timeout_s, outcomes.results, outcomes.inside,
                                                     outcomes.last_call, outcomes.calls, world_size))
        native.poll(on_print)
        until = failed_at + FAILURE_GRACE_S if failed_at is not None else deadline
        try:
            kind, rank, body = messages.get(timeout=max(0.001, min(0.05, until - now)))
        except queue_module.Empty:
            continue
        outcomes.handle(kind, rank, body, on_print)


def _drain(messages, outcomes: _Outcomes, on_print) -> None:
    """Read what is still queued (a rank that exited may have sent its last words just before)."""
    while True:
        try:
            kind, rank, body = messages.get(timeout=0.05)
        except queue_module.Empty:
            return
        outcomes.handle(kind, rank, body, on_print)


def _exception_lines(trace: str) -> list[str]:
    """The unindented lines of a traceback: the exception messages, not the source lines."""
    return [line for line in trace.splitlines()
            if line.strip() and not line.startswith((" ", "\t")) and not line.startswith("Traceback (most recent")]


def _is_secondary(trace: str) -> bool:
    return any(_SECONDARY.search(line) for line in _exception_lines(trace))


def _one_line(trace: str, limit: int = 240) -> str:
    lines = _exception_lines(trace)
    line = lines[-1] if lines else trace.strip().splitlines()[-1] if trace.strip() else "(no message)"
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _exit_description(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        why = {"SIGKILL": "killed, often by the out-of-memory killer", "SIGABRT": "aborted by native code",
               "SIGSEGV": "a crash in native code"}.get(name, "killed by a signal")
        return f"exit code {code} ({name}: {why})"
    return (f"exit code {code} (it exited without raising a Python exception: os._exit, or native code "
            "that ended the process)")


def _where(outcomes: _Outcomes, rank: int) -> str:
    if outcomes.inside[rank]:
        return f"inside {outcomes.inside[rank][-1]} (its communication call #{outcomes.calls[rank]})"
    if rank in outcomes.last_call:
        return (f"outside any blocking call (its last call, #{outcomes.calls[rank]}, was "
                f"{outcomes.last_call[rank]})")
    return ""


def _died(outcomes: _Outcomes) -> dict[int, tuple[float, int]]:
    return {rank: seen_code for rank, seen_code in outcomes.exits.items() if not outcomes.reported(rank)}


def _lead(outcomes: _Outcomes) -> int:
    """The rank whose failure tells the most: a rank's own error or its death first, then errors
    that say a peer went away ("Connection reset by peer" and the like); among equals, the one seen first."""
    candidates = [(_is_secondary(trace), when, rank) for rank, (when, trace) in outcomes.errors.items()]
    candidates += [(False, seen, rank) for rank, (seen, _code) in _died(outcomes).items()]
    return min(candidates)[2]


def _cause(outcomes: _Outcomes, native_tails: list[list[str]]) -> str:
    """The lead failure in one line: its exception line, or a dead rank's last native line."""
    lead = _lead(outcomes)
    if lead in outcomes.errors:
        return _one_line(outcomes.errors[lead][1])
    tail = [line for line in native_tails[lead] if line.strip()]
    return f"rank {lead} died: {tail[-1] if tail else _exit_description(_died(outcomes)[lead][1])}"


def _failure_message(outcomes: _Outcomes, native_tails: list[list[str]]) -> str:
    """Lead with the most telling failure (``_lead``), then one line per other rank."""
    died = _died(outcomes)
    lead = _lead(outcomes)
    lead_secondary = _is_secondary(outcomes.errors[lead][1]) if lead in outcomes.errors else False

    if lead in outcomes.errors:
        lines = [f"rank {lead} raised:", outcomes.errors[lead][1].rstrip()]
    else:
        where = _where(outcomes, lead)
        lines = [f"rank {lead} died with {_exit_description(died[lead][1])} before returning"
                 + (f", while {where}" if where else "") + "."]
        tail = [line for line in native_tails[lead] if line.strip()]
        if tail:
            lines.append("Its last native output:")
            lines += [f"  {line}" for line in tail]
    others = [rank for rank in range(outcomes.world_size) if rank != lead]
    if others:
        lines.append("The other ranks:")
    for rank in others:
        if rank in outcomes.errors:
            trace = outcomes.errors[rank][1]
            note = (" (a consequence of the failure above)" if _is_secondary(trace) and not lead_secondary
                    else "")
            lines.append(f"  rank {rank}: raised {_one_line(trace)}{note}")
        elif rank in outcomes.results:
            lines.append(f"  rank {rank}: returned")
        elif rank in died:
            lines.append(f"  rank {rank}: died with {_exit_description(died[rank][1])}")
        else:
            where = _where(outcomes, rank)
            lines.append(f"  rank {rank}: still running when the run was stopped, "
                         + (where or "before any communication call"))
    return "\n".join(lines)


def _timeout_message(timeout_s, results, inside, last_call, calls, world_size) -> str:
    stuck = [rank for rank in range(world_size) if rank not in results]
    lines = [f"No result after {timeout_s:g} s from rank(s) {', '.join(map(str, stuck))}; all ranks were stopped."]
    for rank in stuck:
        if inside[rank]:
            where = f"inside {inside[rank][-1]} (its communication call #{calls[rank]})"
        elif rank in last_call:  # e.g. waiting on the handle of an isend or an async_op collective
            where = f"outside any blocking call; its last call (#{calls[rank]}) was {last_call[rank]}"
        else:
            where = "computing, before any communication call"
        lines.append(f"  rank {rank}: {where}")
    lines.append("Every rank must make the same collective calls in the same order (and matching send/recv "
                 "pairs); a rank that skips one, or calls a different one, leaves the others waiting.")
    return "\n".join(lines)

