"""Run one learner submission's code in a sandbox of its own (Linux).

``run_isolated(argv, workdir, limits, env=...)`` starts ``argv`` with ``cwd=workdir`` and waits
for it, at most ``limits.time_s`` seconds. ``sandbox_problem()`` says whether the sandbox can
be built on this machine (None) or why not, in one line.

With ``isolate=True`` the program runs under bubblewrap (``bwrap``), with::

    bwrap --args FD --json-status-fd FD -- ARGV...

where the options come through the ``--args`` file descriptor (so the sandbox's init, PID 1
inside, shows none of them in ``/proc/1/cmdline``)::

    --unshare-all --unshare-user --disable-userns --die-with-parent --new-session --cap-drop ALL
    --ro-bind /usr /usr  --symlink usr/bin /bin ...  --ro-bind /etc/ld.so.cache /etc/ld.so.cache ...
    --dev /dev  --proc /proc  --size S --tmpfs /tmp  --size S --tmpfs /dev/shm
    [--dev-bind /dev/nvidia* ...  --ro-bind /sys /sys]
    --ro-bind PYTHON PYTHON ...  [--ro-bind REVEALED REVEALED ...]  --bind WORKDIR WORKDIR
    [--tmpfs HIDDEN ... --remount-ro HIDDEN ...]  --remount-ro /  --chdir WORKDIR

(with ``readonly_workdir``, ``--ro-bind WORKDIR WORKDIR --dir /tmp/work --chdir /tmp/work``)

(mounts are made parents first, so a workdir inside a hidden folder, or a hidden folder inside
the workdir, both work), which gives:

* Files: an **allow-list**. The root is an empty, read-only tmpfs; on it are mounted, each at
  its own path and read-only unless said otherwise:

  - the machine's programs and libraries: ``/usr`` and the top-level links into it (``/bin``,
    ``/sbin``, ``/lib``, ``/lib64``; folders of their own on a system without merged /usr);
  - of ``/etc`` only ``SYSTEM_FILES``: the dynamic linker's cache and configuration, the time
    zone, ``hosts``, ``host.conf``, ``nsswitch.conf`` and ``alternatives`` (no ``passwd``,
    ``shadow``, ``ssl``: callers set ``USER`` for ``getpass``);
  - this Python (``python_paths``): ``sys.prefix`` and ``sys.base_prefix`` (a venv and the
    interpreter it was made from) and each folder of its ``sys.path`` as ``python -I`` sees it
    (site-packages and what ``.pth`` files add; never the current folder, a script's folder or
    PYTHONPATH);
  - ``reveal``: what the caller adds (the grader: ``course_lib`` alone, ``grade.py``);
  - ``workdir``, read-write (read-only with ``readonly_workdir``);
  - a fresh private ``/tmp`` and ``/dev/shm`` (tmpfs, read-write, each capped at
    ``limits.scratch_bytes``: tmpfs pages are memory that ``RLIMIT_AS`` does not count);
  - a minimal ``/dev`` (null, zero, random, tty, pts) and the sandbox's own ``/proc``; on a
    machine with NVIDIA GPUs, their device nodes (``/dev/nvidia*``) and ``/sys`` (CUDA and
    NCCL read the PCI topology there).

  Nothing else exists inside: not the rest of a course checkout around ``course_lib`` or a
  venv, not the caller's home (beyond the folders of this Python inside it), not ``/home``,
  ``/root``, ``/var``, ``/srv``, ``/opt`` or ``/run`` (so no socket of D-Bus, systemd, Docker
  or containerd can be reached). Only the folders leading to an allowed path exist, each
  holding just the way on. Every path in ``hide`` that lies inside a shown path (the workdir, a
  revealed folder, this Python) is covered by an empty read-only tmpfs (a hidden file by
  ``/dev/null`` on a nodev mount, which cannot even be opened); one outside them is out of
  sight already and gets no mount point. Paths in ``hide`` that do not exist are left alone.
* Processes: a PID namespace of its own (``--unshare-all``). The program is PID 2 under
  bubblewrap's small init, whose host PID bwrap reports on ``--json-status-fd`` along with the
  program's exit code. When the program exits (bwrap reports it), or at the time limit, that
  init is killed, and with it the kernel kills every process left in the namespace: daemons
  that double-forked and called ``setsid()`` included. ``run_isolated`` returns only once they
  are all gone. Inside, only the sandbox's own processes exist: it cannot list,
  signal or ptrace the grader or anything else outside. ``--die-with-parent`` kills the
  sandbox if the grader dies; ``--new-session`` gives it no controlling terminal.
* Network: loopback only (a network namespace of its own; bubblewrap brings ``lo`` up), so
  gloo and torch's multiprocessing can use 127.0.0.1. Abstract Unix sockets are per network
  namespace too.
* Privileges: a user namespace of its own in which the program has no capabilities at all
  (``--cap-drop ALL``) and may create no further user namespaces (``--disable-userns``), so
  even a grader running as root gives it no way to remount anything read-write, to raise its
  limits or to write outside the places above. ``no_new_privs`` is set, so setuid programs do
  not help either. (bubblewrap before 0.8 has no ``--disable-userns``, and a root grader on a
  machine with user namespaces switched off cannot make one: ``sandbox_problem`` finds that
  out and the sandbox goes without, its capabilities still dropped. Before 0.7, ``--size`` is
  missing and /tmp and /dev/shm are not capped.)
* Environment: exactly ``env``, plus ``HOME=workdir`` when ``env`` has no ``HOME``, and
  ``PWD=workdir`` (bwrap always sets it; the fallback does too).
* Limits: ``RLIMIT_AS`` (``limits.memory_bytes``) is set on bubblewrap before it starts, so
  every process inside inherits it and none can raise it; core dumps are off. At
  ``limits.time_s`` everything inside is killed as above and ``Outcome(None, True)`` returned.
* Output: stdout and stderr go to ``log`` (opened here, on the grader's side), capped while
  they are read: the first and the last half MiB are kept, the middle is replaced by a note
  saying how much was left out. Without ``log`` they are read and dropped.

It does not protect against (the caller's part):

* Anything in ``workdir`` after the run: the program may leave symlinks there (``report.xml ->
  /home/grader/.ssh/id_ed25519``), huge files or files named to confuse. Open results with
  ``O_NOFOLLOW`` (or check ``is_symlink()``), bound what you read, and delete the folder.
* Reading what the allow-list shows: all of ``/usr``, this Python's folders and what the caller
  reveals. Keep secrets out of them (a token in a venv, a key under ``/usr/local``): text the
  program prints can reach the gradebook through error messages.
* Disk use in ``workdir``, and CPU time: a fork bomb or a busy loop runs until ``time_s``
  (there is no process-count or CPU cgroup here).
* ``--die-with-parent`` is tied to the thread that started the sandbox: call ``run_isolated``
  from a thread that lives until it returns (it blocks, so any caller does).

Both ways need Linux 5.3 or later (pidfds: the grader waits on processes without reaping them).

With ``isolate=False`` (machines without bubblewrap) the program runs as before: a session and
process group of its own, ``RLIMIT_AS`` and no core dumps, ``env`` and ``cwd=workdir``; on the
time limit, and again after a normal exit, every process of its session or process group and
every descendant found in /proc is killed. That is much weaker: the program runs as the
grader's user with the grader's view of everything. It can read and write every file the grader
can (other learners' submissions, the gradebook, the course checkout that later submissions are
graded against, the grader's home), ``hide`` and the allow-list do not apply (nothing is mounted),
it can list and kill any process of that user (the grader
included), use the network, and a daemon that double-forks and calls ``setsid()`` leaves the
session and the process tree, so it outlives the run. Use it only for trusted code.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import glob
import json
import os
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

LOG_LIMIT_BYTES = 2**20  # the most of a run's output kept in ``log``
# The machine's programs and shared libraries: /usr, and the top-level folders that are links into it
# on merged-/usr systems (made as the same links inside) or folders of their own on older ones.
SYSTEM_FOLDERS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# The few files of /etc that programs need: the dynamic linker's cache and configuration (CUDA's
# and other libraries outside /lib and /usr/lib are found through them), the time zone, name
# lookup for "localhost", and /etc/alternatives (links some /usr/bin programs go through).
SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/hosts",
                "/etc/host.conf", "/etc/nsswitch.conf", "/etc/alternatives")
GPU_FOLDERS = ("/sys",)  # with NVIDIA device nodes only: CUDA and NCCL read the PCI topology there
SCRATCH_CWD = Path("/tmp/work")  # where a program with a read-only workdir starts, in its private /tmp
_NAMESPACES = ["--unshare-all", "--unshare-user", "--disable-userns"]
_ALWAYS = ["--die-with-parent", "--new-session", "--cap-drop", "ALL"]
_PROBE_TIMEOUT_S = 30.0
_DRAIN_S = 1.0  # after the run, how long output still held open by escaped processes is read
_ERROR_TAIL_BYTES = 4096  # output kept to explain a sandbox that would not start


@dataclass(frozen=True)
class Limits:
    time_s: float = 600.0           # wall clock for the whole run
    memory_bytes: int = 8 * 2**30   # address space (RLIMIT_AS) of every process inside
    scratch_bytes: int = 512 * 2**20  # each private tmpfs (/tmp, /dev/shm): memory RLIMIT_AS does not count

    def __post_init__(self):
        if not self.time_s > 0:
            raise ValueError(f"time_s must be positive, not {self.time_s!r}")
        if not self.memory_bytes > 0:
            raise ValueError(f"memory_bytes must be positive, not {self.memory_bytes!r}")
        if not self.scratch_bytes > 0:
            raise ValueError(f"scratch_bytes must be positive, not {self.scratch_bytes!r}")


@dataclass(frozen=True)
class Outcome:
    returncode: int | None          # None when it was stopped for the time limit
    timed_out: bool
    channel: bytes = b""            # what the program wrote to its channel (see ``channel_limit``)
    channel_overflowed: bool = False  # it wrote more than ``channel_limit`` bytes; the rest was dropped


class SandboxError(RuntimeError):
    """The sandbox could not be built, or bubblewrap could not start the program (a caller's or
    a machine's problem, never the learner's)."""


def sandbox_problem() -> str | None:
    """None when bubblewrap can isolate a process here; otherwise one line saying why not and what to install/enable."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return ("bubblewrap (bwrap) is not installed: `sudo apt install bubblewrap` (Debian/Ubuntu) or "
                "`sudo dnf install bubblewrap` (Fedora/RHEL); the cohort grader needs it to isolate submissions")
    return _probe(bwrap).problem


@dataclass(frozen=True)
class _Bwrap:
    """What this machine's bubblewrap can do, found by trying it."""
    namespaces: tuple[str, ...] = ()  # how to unshare: with or without a user namespace of its own
    sized_tmpfs: bool = False  # --size (bubblewrap 0.7+): /tmp and /dev/shm capped
    problem: str | None = None


@functools.lru_cache(maxsize=None)
def _probe(bwrap: str) -> _Bwrap:
    """Run an empty Python program under the sandbox's flags, the full set first.

    Without ``--unshare-user --disable-userns`` (bubblewrap before 0.8, or a root grader on a
    machine with user namespaces switched off) the program still has no capabilities; without
    ``--size`` (bubblewrap before 0.7) its /tmp and /dev/shm are not capped."""
    errors = []
    for namespaces in (_NAMESPACES, _NAMESPACES[:1]):
        for sized in (True, False):
            size = ["--size", str(2**20)] if sized else []
            python = [arg for prefix in sorted({sys.prefix, sys.base_prefix}) for arg in ("--ro-bind", prefix, prefix)]
            command = [bwrap, *namespaces, *_ALWAYS, "--json-status-fd", "1", "--ro-bind", "/", "/", "--dev", "/dev",
                       "--proc", "/proc", *size, "--tmpfs", "/tmp", *python, "--", sys.executable, "-c", ""]
            try:
                done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True,
                                      timeout=_PROBE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                errors.append(f"did not finish in {_PROBE_TIMEOUT_S:g} s")
                continue
            except OSError as error:
                errors.append(str(error))
                continue
            if done.returncode == 0:
                return _Bwrap(tuple(namespaces), sized)
            lines = done.stderr.decode(errors="replace").strip().splitlines()
            errors.append(lines[-1] if lines else f"exit code {done.returncode}")
    useful = [error for error in errors if "Unknown option" not in error]
    if not useful:
        return _Bwrap(problem=f"bubblewrap ({bwrap}) is too old for the grader's sandbox: {errors[-1]!r}; install "
                              "a newer bubblewrap (0.8 or later is tested)")
    if "execvp" in useful[0]:
        return _Bwrap(problem=(
            f"bubblewrap ({bwrap}) works but cannot run this Python inside the sandbox: {useful[0]!r}. The grading "
            f"user must be able to read and run {sys.executable} and the interpreter it was made from "
            f"({sys.base_prefix}): an interpreter in a private home (/root/.pyenv) is out of its reach"))
    return _Bwrap(problem=(
        f"bubblewrap ({bwrap}) is installed but cannot build a sandbox here: {useful[0]!r}. It needs unprivileged "
        "user namespaces: enable them (sysctl user.max_user_namespaces=15000, and kernel.unprivileged_userns_clone=1 "
        "on older Debian; on Ubuntu 23.10+/24.04 AppArmor blocks them unless "
        "kernel.apparmor_restrict_unprivileged_userns=0 or an AppArmor profile allows bwrap), or run the grader's "
        "container with user namespaces (and mounting) allowed"))


def run_isolated(argv: list[str], workdir: Path, limits: Limits, *, env: dict[str, str], hide: Sequence[Path] = (),
                 isolate: bool = True, log: Path | None = None, reveal: Sequence[Path] = (),
                 readonly_workdir: bool = False, channel_limit: int = 0) -> Outcome:
    """Run argv with cwd=workdir. Wait at most ``limits.time_s`` seconds, then stop it and
    everything it started: ``Outcome(None, True)``. Otherwise ``Outcome(exit code, False)``,
    where a program killed by signal N reports 128 + N (as a shell does).

    ``reveal``: paths added to the allow-list, read-only (the course's code, data a program
    needs); the system's programs and libraries and this Python (``python_paths``) always are.
    ``hide``: paths covered even where they lie inside a path that is shown (the workdir, a
    revealed folder, this Python); elsewhere they are out of sight anyway.

    ``readonly_workdir``: the workdir is bound read-only and the program starts in ``/tmp/work``
    of its private, capped /tmp, so it can fill neither the grader's disk nor its memory beyond
    ``limits.scratch_bytes`` per tmpfs. ``channel_limit > 0``
    gives the program a pipe, its file descriptor number in ``COURSE_CHANNEL_FD``, whose first
    ``channel_limit`` bytes come back in ``Outcome.channel`` (results the caller must treat as
    untrusted data). Both only change the sandboxed run; the fallback runs in ``workdir``.

    ``isolate=True``: inside bubblewrap (see the module docstring for what that guarantees);
    raises ``SandboxError`` when bubblewrap cannot work here or cannot start ``argv`` (for
    example a command that does not exist). ``isolate=False``: the weaker fallback, for
    machines without bubblewrap; ``hide`` and ``reveal`` are ignored: it sees what the caller sees.
    """
    if not argv:
        raise ValueError("argv is empty")
    workdir = Path(workdir).resolve(strict=True)
    if not workdir.is_dir():
        raise NotADirectoryError(workdir)
    env = dict(env)
    env.setdefault("HOME", str(workdir))
    env["PWD"] = str(workdir)  # bwrap always sets it; the fallback does the same
    if isolate:
        problem = sandbox_problem()
        if problem:
            raise SandboxError(problem)
        bwrap = shutil.which("bwrap")
        can = _probe(bwrap)
        mounts = _mounts(workdir, hide, limits, can.sized_tmpfs, (*python_paths(), *reveal), readonly_workdir)
        start_in = SCRATCH_CWD if readonly_workdir else workdir
        if readonly_workdir:
            mounts += ["--dir", str(start_in)]
            env["PWD"] = str(start_in)
        command = [bwrap, *can.namespaces, *_ALWAYS, *mounts, "--chdir", str(start_in)]
    else:
        command = []
    return _Run(command, list(argv), workdir, limits, env, log, channel_limit).result()


@functools.lru_cache(maxsize=None)
def python_paths() -> tuple[Path, ...]:
    """What this Python needs to run a program inside the sandbox: its prefixes (a venv and the
    interpreter it was made from) and every folder on its own ``sys.path`` (site-packages, and
    folders ``.pth`` files add), as ``python -I`` sees it: without the current folder, a script's
    folder or PYTHONPATH, so a grader started from the course checkout does not show the checkout."""
    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    try:
        done = subprocess.run([sys.executable, "-I", "-c", "import json, sys; print(json.dumps(sys.path))"],
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=_PROBE_TIMEOUT_S, env={})
        paths += [entry for entry in json.loads(done.stdout) if isinstance(entry, str) and entry]
    except (OSError, ValueError, subprocess.TimeoutExpired):
        pass  # the prefixes alone hold a plain venv's packages
    found = []
    for path in map(Path, paths):
        if path.is_absolute() and path.exists() and path not in found:
            found.append(path)
    return tuple(found)


def _allowed(path: Path) -> list[tuple[Path, list[str]]]:
    """The read-only mounts that show ``path`` inside at the same place: at its real path, and
    at the path as given when that differs only by its last part being a link."""
    real = path.resolve()
    if real == Path("/"):
        raise ValueError("the whole machine cannot be on the allow-list")
    mounts = [(real, ["--ro-bind", str(real), str(real)])]
    if path != real and path.parent.resolve() == path.parent:
        mounts.append((path, ["--ro-bind", str(real), str(path)]))
    return mounts


def _mounts(workdir: Path, hide: Sequence[Path], limits: Limits, sized_tmpfs: bool = True,
            reveal: Sequence[Path] = (), readonly_workdir: bool = False) -> list[str]:
    """bwrap's mount arguments, every mount after the mounts above it: an empty root, read-only,
    on which only the allow-list is mounted."""
    size = ["--size", str(limits.scratch_bytes)] if sized_tmpfs else []
    mounts: list[tuple[Path, list[str]]] = [  # (where, arguments); sorted by depth below, stable
        (Path("/dev"), ["--dev", "/dev"]),
        (Path("/proc"), ["--proc", "/proc"]),
        (Path("/tmp"), [*size, "--tmpfs", "/tmp"]),
        (Path("/dev/shm"), [*size, "--tmpfs", "/dev/shm"]),
    ]
    for folder in SYSTEM_FOLDERS:
        if os.path.islink(folder):
            mounts.append((Path(folder), ["--symlink", os.readlink(folder), folder]))
        elif os.path.isdir(folder):
            mounts.append((Path(folder), ["--ro-bind", folder, folder]))
    for name in SYSTEM_FILES:
        if os.path.exists(name):
            mounts.append((Path(name), ["--ro-bind", name, name]))
    gpus = sorted(glob.glob("/dev/nvidia*"))
    mounts += [(Path(node), ["--dev-bind", node, node]) for node in gpus]
    if gpus:
        mounts += [(Path(folder), ["--ro-bind", folder, folder]) for folder in GPU_FOLDERS if os.path.isdir(folder)]
    shown = [Path(folder) for folder in SYSTEM_FOLDERS] + [workdir]
    for path in reveal:
        path = Path(path)
        if not path.is_absolute():
            raise ValueError(f"reveal paths must be absolute: {path}")
        if path.exists():
            for where, args in _allowed(path):
                mounts.append((where, args))
                shown.append(where)
    hidden_folders, seen = [], set()
    for path in hide:
        path = Path(path)
        if not path.is_absolute():
            raise ValueError(f"hide paths must be absolute: {path}")
        try:
            real = path.resolve(strict=True)
        except (FileNotFoundError, NotADirectoryError):
            continue  # nothing there to protect (and the program cannot create it: the view is read-only)
        if real in seen:
            continue
        seen.add(real)
        if real == Path("/") or real == workdir:
            raise ValueError(f"cannot hide {real}: it is the root or the workdir")
        if not any(real.is_relative_to(folder) for folder in shown):
            continue  # not on the allow-list: out of sight already, and no mount point names it
        if real.is_dir():
            mounts.append((real, ["--tmpfs", str(real)]))
            hidden_folders.append(real)
        else:
            mounts.append((real, ["--ro-bind", "/dev/null", str(real)]))
    mounts.append((workdir, ["--ro-bind" if readonly_workdir else "--bind", str(workdir), str(workdir)]))
    mounts.sort(key=lambda mount: len(mount[0].parts))
    arguments = [argument for _, args in mounts for argument in args]
    for folder in hidden_folders:  # read-only last: mount points for deeper mounts were made in them first
        arguments += ["--remount-ro", str(folder)]
    return arguments + ["--remount-ro", "/"]  # the root's own tmpfs: mount points only, nothing to write


def _limit_process(memory_bytes: int):
    def apply() -> None:  # runs in the child between fork and exec
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


class _Capture:
    """Output kept in ``log``: the first and the last half of ``LOG_LIMIT_BYTES``, and a note on
    what was left out in between; plus the last few KiB in memory, to explain failures."""

    def __init__(self, log: Path | None):
        self.file = open(log, "wb") if log is not None else None
        self.head_room = LOG_LIMIT_BYTES // 2
        self.tail_limit = LOG_LIMIT_BYTES - self.head_room
        self.tail: collections.deque[bytes] = collections.deque()
        self.tail_size = self.left_out = 0
        self.recent = b""

    def write(self, data: bytes) -> None:
        self.recent = (self.recent + data)[-_ERROR_TAIL_BYTES:]
        if self.file is None:
            return
        if self.head_room:
            head, data = data[:self.head_room], data[self.head_room:]
            self.file.write(head)
            self.head_room -= len(head)
        if data:
            self.tail.append(data)
            self.tail_size += len(data)
            while self.tail_size - len(self.tail[0]) >= self.tail_limit:
                dropped = self.tail.popleft()
                self.tail_size -= len(dropped)
                self.left_out += len(dropped)

    def close(self) -> None:
        if self.file is None:
            return
        tail = b"".join(self.tail)
        if len(tail) > self.tail_limit:
            self.left_out += len(tail) - self.tail_limit
            tail = tail[-self.tail_limit:]
        if self.left_out:
            self.file.write(f"\n[... {self.left_out} bytes of output left out ...]\n".encode())
        self.file.write(tail)
        self.file.close()


class _Run:
    """One run: start, pump output and bwrap's status until the end or the deadline, clean up."""

    def __init__(self, bwrap_command: list[str], argv: list[str], workdir: Path, limits: Limits,
                 env: dict[str, str], log: Path | None, channel_limit: int = 0):
        self.isolated = bool(bwrap_command)
        self.channel, self.channel_limit, self.channel_overflowed = bytearray(), channel_limit, False
        self.limits = limits
        self.capture = _Capture(log)
        self.status = b""  # bwrap's JSON documents
        self.sandbox_init: int | None = None  # pidfd of the PID namespace's init (isolated)
        self.program_exited = False  # bwrap reported the program's exit code
        self.selector = selectors.DefaultSelector()
        out_read, out_write = os.pipe()
        status_read = status_write = channel_read = channel_write = -1
        pass_fds: tuple[int, ...] = ()
        command = argv
        if channel_limit > 0:
            channel_read, channel_write = os.pipe()
            pass_fds = (channel_write,)
            env = {**env, "COURSE_CHANNEL_FD": str(channel_write)}
        arguments = -1
        if self.isolated:
            status_read, status_write = os.pipe()
            # The sandbox's options go through a file descriptor (--args), not the command line,
            # which the program can read as its init's /proc/1/cmdline.
            arguments = os.memfd_create("bwrap-arguments")
            os.write(arguments, b"".join(argument.encode() + b"\0" for argument in bwrap_command[1:]))
            os.lseek(arguments, 0, os.SEEK_SET)
            pass_fds += (status_write, arguments)
            command = [bwrap_command[0], "--args", str(arguments), "--json-status-fd", str(status_write), "--", *argv]
        try:
            self.process = subprocess.Popen(
                command, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=out_write, stderr=out_write,
                pass_fds=pass_fds, start_new_session=True, preexec_fn=_limit_process(limits.memory_bytes))
        except BaseException:
            for fd in (out_read, status_read, status_write, channel_read):
                if fd >= 0:
                    os.close(fd)
            raise
        finally:
            os.close(out_write)
            if channel_write >= 0:
                os.close(channel_write)
            if arguments >= 0:
                os.close(arguments)
        self.started = time.monotonic()
        if channel_read >= 0:
            self.selector.register(channel_read, selectors.EVENT_READ, "channel")
        if self.isolated:
            os.close(status_write)
            self.selector.register(status_read, selectors.EVENT_READ, "status")
        self.selector.register(out_read, selectors.EVENT_READ, "output")
        self.exited = os.pidfd_open(self.process.pid)  # readable once it exits; we reap it only later
        self.selector.register(self.exited, selectors.EVENT_READ, "exited")

    def result(self) -> Outcome:
        timed_out = False
        try:
            timed_out = not self._pump(self.started + self.limits.time_s)
            if timed_out or self.isolated:
                # In the sandbox, also once the program has exited: whatever it left behind dies
                # with the namespace. (bwrap 0.8's init quits by itself when the program exits,
                # but only with --die-with-parent; this does not depend on it.)
                self._stop()
            else:
                _kill_session(self.process.pid)  # still unreaped, so its pid (the session id) is not reused
            self.process.wait()
            self.selector.unregister(self.exited)
            self._pump(time.monotonic() + _DRAIN_S)  # what is left in the pipes, until they close
        finally:
            if self.process.returncode is None:  # an exception (Ctrl-C) in the middle: leave nothing behind
                self._stop()
                self.process.wait()
            self._close()
        channel = bytes(self.channel), self.channel_overflowed
        if timed_out:
            return Outcome(None, True, *channel)
        return Outcome(self._returncode(), False, *channel)

    def _pump(self, deadline: float) -> bool:
        """Read output and status until the program has exited (while its pidfd is registered:
        the process exits, or bwrap reports the exit code of the program it started) or, after
        that, until every pipe is closed; False when ``deadline`` came first."""
        while self.selector.get_map():
            watching = self.exited in self.selector.get_map()
            if watching and self.program_exited:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            for key, _ in self.selector.select(left):
                if key.data == "exited":
                    return True
                data = os.read(key.fd, 65536)
                if not data:
                    self.selector.unregister(key.fd)
                    os.close(key.fd)
                elif key.data == "output":
                    self.capture.write(data)
                elif key.data == "channel":
                    room = self.channel_limit - len(self.channel)
                    self.channel += data[:room]
                    self.channel_overflowed |= len(data) > room
                else:
                    self._status(data)
        return True

    def _status(self, data: bytes) -> None:
        self.status += data
        self.program_exited = self._status_field("exit-code") is not None
        if self.sandbox_init is None:
            pid = self._status_field("child-pid")
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    self.sandbox_init = os.pidfd_open(pid)

    def _status_field(self, name: str):
        decoder, text, at = json.JSONDecoder(), self.status.decode(errors="replace"), 0
        while True:
            while at < len(text) and text[at].isspace():
                at += 1
            try:
                document, at = decoder.raw_decode(text, at)
            except ValueError:
                return None
            if isinstance(document, dict) and name in document:
                return document[name]

    def _stop(self) -> None:
        """Kill everything the run started, and return only once it is all gone."""
        if not self.isolated:
            _kill_session(self.process.pid)
            return
        if self.sandbox_init is not None:
            # Killing the namespace's init kills every process in it; bwrap then exits.
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.sandbox_init, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)  # bwrap, and its child if it has not left the group
        if self.sandbox_init is not None:
            # The init is reported dead only after the kernel has killed and reaped everything inside.
            with selectors.DefaultSelector() as gone:
                gone.register(self.sandbox_init, selectors.EVENT_READ)
                gone.select(30)

    def _returncode(self) -> int:
        code = self.process.returncode
        if self.isolated:
            exit_code = self._status_field("exit-code")
            if exit_code is not None:
                return int(exit_code)
            if code == 1:  # bwrap's own failure: no program ran
                said = [line for line in self.capture.recent.decode(errors="replace").splitlines()
                        if line.startswith("bwrap:")]
                raise SandboxError("bubblewrap could not start the program: " + (said[-1] if said else "exit code 1"))
        return 128 - code if code < 0 else code

    def _close(self) -> None:
        for key in list(self.selector.get_map().values()):
            self.selector.unregister(key.fd)
            os.close(key.fd)
            if key.fd == self.exited:
                self.exited = None
        self.selector.close()
        for pidfd in (self.exited, self.sandbox_init):
            if pidfd is not None:
                os.close(pidfd)
        self.exited = self.sandbox_init = None
        self.capture.close()


def _process_table() -> dict[int, tuple[int, int, int, str]]:
    """pid -> (parent pid, process group, session, state) for every process in /proc."""
    table = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        table[int(stat.parent.name)] = (int(fields[1]), int(fields[2]), int(fields[3]), fields[0])
    return table


def _kill_session(leader: int) -> None:
    """SIGKILL every live process in ``leader``'s session or process group, and every
    descendant of ``leader``, until none is left (new ones may be forked while we look)."""
    for _ in range(100):
        table = _process_table()
        children: dict[int, list[int]] = {}
        for pid, (parent, _, _, _) in table.items():
            children.setdefault(parent, []).append(pid)
        victims = {pid for pid, (_, group, session, _) in table.items() if leader in (group, session)}
        frontier = [leader]
        while frontier:
            below = children.get(frontier.pop(), [])
            victims.update(below)
            frontier += below
        victims = {pid for pid in victims if pid in table and table[pid][3] not in "ZX" and pid != os.getpid()}
        if not victims:
            return
        for pid in victims:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
