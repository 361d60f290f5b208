"""The submission sandbox (course_lib/grading/sandbox.py), each guarantee checked against a
small hostile program run inside it.

The bubblewrap tests skip on a learner's machine without a working ``bwrap``, but fail under
CI (``CI=true``): CI must run them, and ``.ci/run`` installs bubblewrap when it is missing.
The ``isolate=False`` fallback and ``sandbox_problem``'s messages are tested everywhere.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from course_lib.grading import sandbox
from course_lib.grading.sandbox import LOG_LIMIT_BYTES, Limits, Outcome, SandboxError, run_isolated, sandbox_problem
from course_lib.paths import REPO_ROOT
from needs_sandbox import require_sandbox

QUICK = Limits(time_s=20, memory_bytes=2 * 2**30)


@pytest.fixture
def needs_bwrap():
    require_sandbox()


isolated = pytest.mark.usefixtures("needs_bwrap")


@pytest.fixture
def work():
    """A workdir under /tmp, as the grader makes them: it must survive the sandbox's fresh /tmp."""
    folder = Path(tempfile.mkdtemp(prefix="sandbox-test-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def token():
    """A word put on the hostile program's command line, to find its processes in /proc."""
    return f"sandbox-token-{uuid.uuid4().hex}"


def processes_with(token: str) -> list[int]:
    """Live processes (on the host) whose command line holds ``token``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if token.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_code(code: str, workdir: Path, *args: str, limits: Limits = QUICK, env=None, **options) -> Outcome:
    return run_isolated([sys.executable, "-c", textwrap.dedent(code), *args], workdir, limits,
                        env={} if env is None else env, **options)


def run_script(code: str, workdir: Path, *args: str, limits: Limits = QUICK, **options) -> Outcome:
    """Like run_code, from a file in the workdir (multiprocessing's spawn re-imports __main__)."""
    script = workdir / "hostile.py"
    script.write_text(textwrap.dedent(code))
    return run_isolated([sys.executable, str(script), *args], workdir, limits, env={}, **options)


def report(workdir: Path) -> dict:
    return json.loads((workdir / "report.json").read_text())


# A program that leaves a daemon behind: fork, setsid, fork again; the daemon says it started,
# sleeps argv[3] seconds, then writes "marker". The main program then runs MAIN_THEN.
DAEMON = """
import os, sys, time
from pathlib import Path
work = Path(sys.argv[2])
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        (work / "daemon-started").write_text(str(os.getpid()))
        time.sleep(float(sys.argv[3]))
        (work / "marker").write_text("the daemon outlived the run")
        os._exit(0)
    os._exit(0)
while not (work / "daemon-started").exists():
    time.sleep(0.01)
"""


@isolated
def test_bubblewrap_works_here():
    assert sandbox_problem() is None


@isolated
def test_a_double_forked_setsid_daemon_dies_when_the_run_ends(work, token):
    started = time.monotonic()
    outcome = run_code(DAEMON + "print('main done')", work, token, str(work), "2", log=work / "log")
    assert outcome == Outcome(0, False), (work / "log").read_text()
    assert time.monotonic() - started < 2  # it did not wait for the daemon
    assert (work / "daemon-started").exists()
    assert processes_with(token) == []  # gone the moment run_isolated returns
    time.sleep(max(0.0, started + 2.5 - time.monotonic()))
    assert not (work / "marker").exists()


def test_control_the_same_daemon_outlives_a_run_without_the_sandbox(work, token):
    """The fallback's documented weakness, and proof that the daemon above is a real one."""
    try:
        assert run_code(DAEMON, work, token, str(work), "60", isolate=False) == Outcome(0, False)
        assert (work / "daemon-started").exists() and processes_with(token)
    finally:
        kill_all(processes_with(token))


@isolated
def test_the_time_limit_kills_every_process_inside(work, token):
    started = time.monotonic()
    outcome = run_code(DAEMON + "time.sleep(60)", work, token, str(work), "2.5", limits=Limits(time_s=1.0))
    assert outcome == Outcome(None, True)
    assert 1.0 <= time.monotonic() - started < 2.5
    assert processes_with(token) == []
    time.sleep(max(0.0, started + 3 - time.monotonic()))
    assert not (work / "marker").exists()


@isolated
def test_the_sandbox_dies_with_the_grader(work, token):
    grader = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from course_lib.grading.sandbox import Limits, run_isolated
        run_isolated([sys.executable, "-c", {DAEMON + "time.sleep(60)"!r}, {token!r}, {str(work)!r}, "1.5"],
                     Path({str(work)!r}), Limits(time_s=60), env={{}})
        """)], cwd=REPO_ROOT)
    try:
        deadline = time.monotonic() + 20
        while not (work / "daemon-started").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert (work / "daemon-started").exists()
        grader.kill()
        grader.wait()
        deadline = time.monotonic() + 5
        while processes_with(token) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert processes_with(token) == []
        time.sleep(1.5)
        assert not (work / "marker").exists()
    finally:
        grader.kill()
        grader.wait()
        kill_all(processes_with(token))


@isolated
def test_inside_it_cannot_see_or_signal_anything_outside(work):
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        outcome = run_code("""
            import json, os, signal, sys
            victim, grader = int(sys.argv[1]), int(sys.argv[2])
            seen = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
            reachable = []
            for pid in (victim, grader):
                try:
                    os.kill(pid, 0)
                    reachable.append(pid)
                except ProcessLookupError:
                    pass
            try:
                os.kill(-1, signal.SIGKILL)  # every process it may signal (but itself and init)
            except ProcessLookupError:  # there is none
                pass
            for pid in seen:
                if pid != os.getpid():
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
            report = {"seen": seen, "me": os.getpid(), "parent": os.getppid(), "reachable": reachable}
            open("report.json", "w").write(json.dumps(report))
            """, work, str(victim.pid), str(os.getpid()))
        assert outcome == Outcome(0, False)
        seen = report(work)
        assert seen["seen"] == [1, seen["me"]]  # bwrap's init and itself, nothing else
        assert seen["parent"] == 1
        assert seen["reachable"] == []
        assert victim.poll() is None  # the test process is alive too: it is running this line
    finally:
        victim.kill()
        victim.wait()


@isolated
def test_no_network_but_loopback(work):
    outcome = run_code("""
        import json, socket, threading, time
        report = {"interfaces": [name for _, name in socket.if_nameindex()]}
        started = time.monotonic()
        try:
            socket.create_connection(("10.255.255.1", 80), timeout=5).close()
            report["outside"] = "connected"
        except OSError as error:
            report["outside"] = type(error).__name__
        report["outside_s"] = time.monotonic() - started
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen()
        def echo():
            peer, _ = server.accept()
            peer.sendall(peer.recv(100))
            peer.close()
        threading.Thread(target=echo).start()
        with socket.create_connection(server.getsockname(), timeout=5) as client:
            client.sendall(b"over loopback")
            report["echo"] = client.recv(100).decode()
        open("report.json", "w").write(json.dumps(report))
        """, work)
    assert outcome == Outcome(0, False)
    seen = report(work)
    assert seen["interfaces"] == ["lo"]
    assert seen["outside"] != "connected" and seen["outside_s"] < 1.0
    assert seen["echo"] == "over loopback"


@isolated
def test_the_filesystem_is_read_only_but_for_the_workdir_and_a_private_tmp(work):
    on_host_tmp = Path(tempfile.mkstemp(prefix="sandbox-host-", dir="/tmp")[1])
    probe = REPO_ROOT / f"sandbox-probe-{uuid.uuid4().hex}"
    inside_only = Path(f"/tmp/sandbox-inside-{uuid.uuid4().hex}")
    try:
        outcome = run_code("""
            import ctypes, json, os, resource, shutil, subprocess, sys
            work, probe, host_tmp, readme, inside_only = sys.argv[1:6]
            report = {}
            def attempt(name, action):
                try:
                    action()
                    report[name] = "ok"
                except OSError as error:
                    report[name] = error.errno
                except ValueError as error:
                    report[name] = "ValueError"
            attempt("write checkout", lambda: open(probe, "w").write("x"))
            attempt("append checkout", lambda: open(readme, "a").write("x"))
            attempt("chmod checkout", lambda: os.chmod(readme, 0o777))
            attempt("write workdir", lambda: open(os.path.join(work, "written"), "w").write("x"))
            attempt("write tmp", lambda: open(inside_only, "w").write("x"))
            report["host tmp visible"] = os.path.exists(host_tmp)
            libc = ctypes.CDLL(None, use_errno=True)
            MS_REMOUNT, MS_BIND = 32, 4096
            for target in ("/", "/work" if os.path.isdir("/work") else "/usr", os.path.dirname(readme)):
                failed = libc.mount(None, target.encode(), None, MS_REMOUNT | MS_BIND, None) != 0
                report[f"remount {target}"] = ctypes.get_errno() if failed else "ok"
            if shutil.which("mount"):
                report["mount command"] = subprocess.run(["mount", "-o", "remount,rw", "/"],
                                                         capture_output=True).returncode
            attempt("raise memory limit", lambda: resource.setrlimit(resource.RLIMIT_AS, (2**40, 2**40)))
            status = dict(line.split(":", 1) for line in open("/proc/self/status"))
            report["caps"] = [status[name].strip() for name in ("CapEff", "CapPrm", "CapBnd")]
            report["no new privileges"] = status["NoNewPrivs"].strip()
            open("report.json", "w").write(json.dumps(report))
            """, work, str(work), str(probe), str(on_host_tmp), str(REPO_ROOT / "README.md"), str(inside_only),
            reveal=[REPO_ROOT])  # the checkout, as the grader shows it (a checkout under /tmp would be hidden)
        assert outcome == Outcome(0, False)
        seen = report(work)
        EROFS = 30
        assert seen["write checkout"] == seen["append checkout"] == seen["chmod checkout"] == EROFS
        assert not probe.exists()
        assert seen["write workdir"] == "ok" and (work / "written").read_text() == "x"
        assert seen["write tmp"] == "ok" and not inside_only.exists()
        assert seen["host tmp visible"] is False
        remounts = {name: value for name, value in seen.items() if name.startswith("remount")}
        assert remounts and all(value != "ok" for value in remounts.values()), remounts
        assert seen.get("mount command", 1) != 0
        assert seen["raise memory limit"] != "ok"
        assert seen["caps"] == ["0000000000000000"] * 3 and seen["no new privileges"] == "1"
    finally:
        on_host_tmp.unlink()
        probe.unlink(missing_ok=True)
        inside_only.unlink(missing_ok=True)


@isolated
def test_only_the_allow_list_is_there_and_hidden_paths_inside_it_are_covered(work):
    # Outside /tmp (/var/tmp is on disk and shared), where the sandbox's fresh /tmp hides nothing.
    root = Path(tempfile.mkdtemp(prefix="sandbox-hide-", dir="/var/tmp"))
    try:
        submissions = root / "submissions"  # holds this learner's workdir and the other learners' work
        (submissions / "bob").mkdir(parents=True)
        (submissions / "bob" / "answer.py").write_text("bob's answer")
        gradebook = root / "gradebook"
        gradebook.mkdir()
        (gradebook / "grades.csv").write_text("alice,0")
        token_file = root / "token.txt"
        token_file.write_text("secret")
        alice = submissions / "alice"
        (alice / "private").mkdir(parents=True)
        (alice / "private" / "key").write_text("hidden inside the workdir")
        data = root / "data"  # revealed: read-only, but its secret.txt hidden
        data.mkdir()
        (data / "table.csv").write_text("needed")
        (data / "secret.txt").write_text("not needed")
        outcome = run_code("""
            import errno, json, os, sys
            submissions, gradebook, token_file, alice, data = sys.argv[1:6]
            def look(path):
                try:
                    return sorted(os.listdir(path))
                except OSError as error:
                    return errno.errorcode[error.errno]
            def read(path):
                try:
                    return open(path).read()
                except OSError as error:
                    return errno.errorcode[error.errno]
            report = {"submissions": look(submissions), "gradebook": look(gradebook),
                      "private": look(os.path.join(alice, "private")), "token": read(token_file),
                      "bob": read(os.path.join(submissions, "bob", "answer.py")), "root": look("/"),
                      "etc": look("/etc"), "data": look(data),
                      "table": read(os.path.join(data, "table.csv")), "secret": read(os.path.join(data, "secret.txt"))}
            for name, path in [("write gradebook", os.path.join(gradebook, "grades.csv")),
                               ("write submissions", os.path.join(submissions, "bob", "answer.py")),
                               ("write token", token_file), ("write private", os.path.join(alice, "private", "x")),
                               ("write root", "/x"), ("write data", os.path.join(data, "x"))]:
                try:
                    open(path, "w").write("rewritten")
                    report[name] = "ok"
                except OSError as error:
                    report[name] = errno.errorcode[error.errno]
            open("report.json", "w").write(json.dumps(report))
            """, alice, str(submissions), str(gradebook), str(token_file), str(alice), str(data),
                           hide=[submissions, gradebook, token_file, alice / "private", data / "secret.txt"],
                           reveal=[data])
        assert outcome == Outcome(0, False)
        seen = report(alice)
        assert seen["submissions"] == ["alice"]  # only the mount point of its own workdir
        assert seen["gradebook"] == seen["token"] == seen["bob"] == "ENOENT"  # not on the allow-list: not there
        assert seen["private"] == []  # hidden inside the workdir, which is shown
        assert seen["data"] == ["secret.txt", "table.csv"] and seen["table"] == "needed"
        assert seen["secret"] in ("", "EACCES")  # hidden inside a revealed folder: /dev/null, which nodev refuses
        expected_root = {"dev", "proc", "tmp", "etc", root.parts[1]}
        expected_root |= {Path(p).parts[1] for p in sandbox.python_paths()}
        expected_root |= {name.strip("/") for name in sandbox.SYSTEM_FOLDERS if os.path.lexists(name)}
        assert set(seen["root"]) <= expected_root, seen["root"]
        assert set(seen["etc"]) <= {Path(name).name for name in sandbox.SYSTEM_FILES}, seen["etc"]
        assert all(seen[name] != "ok" for name in seen if name.startswith("write")), seen
        assert seen["write root"] == seen["write data"] == "EROFS"
        assert (gradebook / "grades.csv").read_text() == "alice,0"
        assert (submissions / "bob" / "answer.py").read_text() == "bob's answer"
        assert token_file.read_text() == "secret"
        assert (alice / "private" / "key").read_text() == "hidden inside the workdir"
    finally:
        shutil.rmtree(root, ignore_errors=True)


@isolated
def test_run_is_not_there_so_no_host_socket_can_be_reached(work):
    outcome = run_code("""
        import json, os
        seen = {folder: os.path.lexists(folder) for folder in ("/run", "/var/run", "/var")}
        open("report.json", "w").write(json.dumps(seen))
        """, work)
    assert outcome == Outcome(0, False)
    assert report(work) == {"/run": False, "/var/run": False, "/var": False}


@isolated
def test_the_init_command_line_holds_no_mount(work):
    """The sandbox's options reach bubblewrap through a file descriptor: its init's command line,
    which the program can read, names no folder that is shown or hidden."""
    secret = Path(tempfile.mkdtemp(prefix="sandbox-cmdline-", dir="/var/tmp"))
    try:
        outcome = run_code("""
            import json
            cmdline = open("/proc/1/cmdline", "rb").read().split(b"\\0")
            open("report.json", "w").write(json.dumps([part.decode() for part in cmdline if part]))
            """, work, hide=[secret / "x"], reveal=[secret])
        assert outcome == Outcome(0, False)
        cmdline = report(work)
        assert cmdline[1] == "--args" and "--" in cmdline, cmdline
        options = cmdline[:cmdline.index("--")]
        assert not any(str(secret) in part for part in options), cmdline
        assert not any(part in ("--ro-bind", "--tmpfs", "--bind", "--symlink") for part in cmdline), cmdline
    finally:
        shutil.rmtree(secret, ignore_errors=True)


@isolated
def test_dev_shm_and_multiprocessing_work_inside(work):
    outcome = run_script("""
        import json, multiprocessing, os
        from multiprocessing import shared_memory

        def child(queue, lock, name):
            block = shared_memory.SharedMemory(name)  # a file in /dev/shm, made by the parent
            block.buf[:5] = b"hello"
            block.close()
            with lock:  # a POSIX semaphore, also in /dev/shm
                queue.put(os.getpid())

        if __name__ == "__main__":
            report = {"shm": os.access("/dev/shm", os.W_OK)}
            block = shared_memory.SharedMemory(create=True, size=1 << 20)
            for method in ("fork", "spawn"):
                context = multiprocessing.get_context(method)
                queue, lock = context.Queue(), context.Lock()
                process = context.Process(target=child, args=(queue, lock, block.name))
                process.start()
                report[method] = queue.get(timeout=30) == process.pid
                process.join()
            report["shared memory"] = bytes(block.buf[:5]).decode()
            block.close()
            block.unlink()
            open("report.json", "w").write(json.dumps(report))
        """, work, log=work / "log")
    assert outcome == Outcome(0, False), (work / "log").read_text()
    assert report(work) == {"shm": True, "fork": True, "spawn": True, "shared memory": "hello"}


@pytest.mark.parametrize("isolate", [True, False], ids=["bwrap", "fallback"])
def test_the_environment_is_exactly_env(work, isolate):
    if isolate:
        require_sandbox()
    code = """
        import json
        environ = open("/proc/self/environ", "rb").read().split(b"\\0")
        open("report.json", "w").write(json.dumps(dict(v.decode().split("=", 1) for v in environ if v)))
        """
    assert run_code(code, work, env={"COURSE_X": "1"}, isolate=isolate) == Outcome(0, False)
    assert report(work) == {"COURSE_X": "1", "HOME": str(work), "PWD": str(work)}
    assert run_code(code, work, env={"HOME": "/nowhere"}, isolate=isolate) == Outcome(0, False)
    assert report(work)["HOME"] == "/nowhere"


@pytest.mark.parametrize("isolate", [True, False], ids=["bwrap", "fallback"])
def test_the_memory_limit_holds_for_every_process_inside(work, isolate):
    if isolate:
        require_sandbox()
    outcome = run_code("""
        import json, os, resource, subprocess, sys
        GIB = 2**30
        def allocate():
            try:
                bytearray(GIB)
                return "allocated"
            except MemoryError:
                return "MemoryError"
        report = {"limit": resource.getrlimit(resource.RLIMIT_AS), "main": allocate()}
        read, write = os.pipe()
        if os.fork() == 0:
            os.write(write, allocate().encode())
            os._exit(0)
        os.wait()
        report["forked"] = os.read(read, 100).decode()
        report["exec"] = subprocess.run([sys.executable, "-c", "bytearray(2**30)"], capture_output=True).returncode
        open("report.json", "w").write(json.dumps(report))
        """, work, limits=Limits(time_s=20, memory_bytes=512 * 2**20), isolate=isolate)
    assert outcome == Outcome(0, False)
    seen = report(work)
    assert seen["limit"] == [512 * 2**20] * 2
    assert seen["main"] == seen["forked"] == "MemoryError"
    assert seen["exec"] != 0


@pytest.mark.parametrize("isolate", [True, False], ids=["bwrap", "fallback"])
def test_exit_codes_and_signals(work, isolate):
    if isolate:
        require_sandbox()
    assert run_code("import sys; sys.exit(3)", work, isolate=isolate) == Outcome(3, False)
    assert run_code("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", work,
                    isolate=isolate) == Outcome(128 + 9, False)


@pytest.mark.parametrize("isolate", [True, False], ids=["bwrap", "fallback"])
def test_output_goes_to_the_log_capped(work, isolate):
    if isolate:
        require_sandbox()
    log = work / "log"
    outcome = run_code("""
        import sys
        print("FIRST LINE", flush=True)
        print("noise", file=sys.stderr, flush=True)
        for _ in range(4096):
            sys.stdout.write("x" * 1023 + "\\n")
        print("LAST LINE")
        """, work, log=log, isolate=isolate)
    assert outcome == Outcome(0, False)
    text = log.read_bytes()
    assert LOG_LIMIT_BYTES <= len(text) < LOG_LIMIT_BYTES + 200
    assert text.startswith(b"FIRST LINE\n") and b"noise" in text[:100]
    assert text.rstrip().endswith(b"LAST LINE")
    assert b"bytes of output left out ...]" in text
    assert run_code("print('dropped')", work, isolate=isolate) == Outcome(0, False)  # log=None: nothing written


# Without the sandbox: a grandchild in a process group of its own, and a double-forked one (its
# parent exits); neither is in the program's process group, one is no longer its descendant;
# both are in its session. Each says it started, then writes a marker 2.5 s later.
LEFT_BEHIND = """
import os, sys, time
from pathlib import Path
work = Path(sys.argv[2])
def later(name):
    (work / f"{name}-started").write_text("")
    time.sleep(2.5)
    (work / f"{name}-marker").write_text("outlived the run")
    os._exit(0)
if os.fork() == 0:
    os.setpgid(0, 0)
    later("grouped")
if os.fork() == 0:
    if os.fork() == 0:
        later("orphan")
    os._exit(0)
while not all((work / f"{name}-started").exists() for name in ("grouped", "orphan")):
    time.sleep(0.01)
"""


def test_without_the_sandbox_the_time_limit_kills_the_session_and_every_descendant(work, token):
    try:
        started = time.monotonic()
        outcome = run_code(LEFT_BEHIND + "time.sleep(60)", work, token, str(work), limits=Limits(time_s=1.0),
                           isolate=False)
        assert outcome == Outcome(None, True)
        assert 1.0 <= time.monotonic() - started < 2.5
        assert processes_with(token) == []
        time.sleep(max(0.0, started + 3 - time.monotonic()))
        assert not list(work.glob("*-marker"))
    finally:
        kill_all(processes_with(token))


def test_without_the_sandbox_what_the_program_left_in_its_session_dies_when_it_ends(work, token):
    try:
        started = time.monotonic()
        assert run_code(LEFT_BEHIND, work, token, str(work), isolate=False) == Outcome(0, False)
        assert time.monotonic() - started < 2.5
        assert processes_with(token) == []
        time.sleep(max(0.0, started + 3 - time.monotonic()))
        assert not list(work.glob("*-marker"))
    finally:
        kill_all(processes_with(token))


@isolated
def test_a_command_that_cannot_start_is_a_sandbox_error(work):
    with pytest.raises(SandboxError, match="no-such-command"):
        run_isolated(["no-such-command"], work, QUICK, env={})
    with pytest.raises(FileNotFoundError):
        run_isolated(["no-such-command"], work, QUICK, env={}, isolate=False)


def test_sandbox_problem_when_bwrap_is_missing(monkeypatch, tmp_path, work):
    monkeypatch.setenv("PATH", str(tmp_path))
    problem = sandbox_problem()
    assert "not installed" in problem and "apt install bubblewrap" in problem and "dnf install bubblewrap" in problem
    assert "\n" not in problem
    with pytest.raises(SandboxError, match="not installed"):
        run_isolated([sys.executable, "-c", "pass"], work, QUICK, env={})


def _bwrap_that_fails_with(message: str, monkeypatch, folder: Path) -> None:
    """A ``bwrap`` first on PATH that prints ``message`` and exits 1, as a machine's real one may."""
    fake = folder / "bwrap"
    fake.write_text(f"#!/bin/sh\necho '{message}' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(folder))


def test_sandbox_problem_when_bwrap_cannot_make_namespaces(monkeypatch, tmp_path):
    _bwrap_that_fails_with("bwrap: No permissions to create new namespace", monkeypatch, tmp_path)
    problem = sandbox_problem()
    assert "No permissions to create new namespace" in problem
    assert "user namespaces" in problem and "apparmor_restrict_unprivileged_userns" in problem
    assert "\n" not in problem


def test_sandbox_problem_when_the_grading_user_cannot_run_this_python(monkeypatch, tmp_path):
    _bwrap_that_fails_with("bwrap: execvp /root/.venv/bin/python: Permission denied", monkeypatch, tmp_path)
    problem = sandbox_problem()
    assert "cannot run this Python" in problem and sys.base_prefix in problem and "user namespaces" not in problem


def test_sandbox_problem_when_bwrap_is_too_old(monkeypatch, tmp_path):
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: Unknown option --json-status-fd' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    problem = sandbox_problem()
    assert "too old" in problem and "Unknown option --json-status-fd" in problem


def test_mounts_are_made_parents_first(monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox.glob, "glob", lambda pattern: ["/dev/nvidia0", "/dev/nvidiactl"])
    outer, inner = tmp_path / "all", tmp_path / "all" / "alice" / "private"
    workdir = tmp_path / "all" / "alice"
    inner.mkdir(parents=True)
    data = tmp_path / "data"
    (data / "folder").mkdir(parents=True)
    args = sandbox._mounts(workdir, [outer, inner, tmp_path / "missing", data / "folder", tmp_path / "elsewhere"],
                           Limits(memory_bytes=2**30, scratch_bytes=2**28), reveal=[data])
    position = {(args[i], args[i + 1]): i for i in range(len(args) - 1)}
    assert "/" not in args[:-1]  # no --ro-bind / /: an empty root, made read-only at the very end
    assert args[-2:] == ["--remount-ro", "/"]
    assert position[("--ro-bind", "/usr")] < position[("--ro-bind", str(data))]
    assert position[("--dev", "/dev")] < position[("--dev-bind", "/dev/nvidia0")]
    assert position[("--dev", "/dev")] < position[("--tmpfs", "/dev/shm")]
    assert ("--ro-bind", "/sys") in position  # with GPU device nodes, for CUDA and NCCL
    assert ("--tmpfs", str(outer)) not in position  # not on the allow-list: nothing to hide, no mount point
    assert position[("--bind", str(workdir))] < position[("--tmpfs", str(inner))]  # hidden inside the workdir
    assert position[("--ro-bind", str(data))] < position[("--tmpfs", str(data / "folder"))]  # inside a revealed one
    assert position[("--tmpfs", str(inner))] < position[("--remount-ro", str(inner))]
    assert str(tmp_path / "missing") not in args  # nothing there: nothing to hide
    assert args[args.index("/tmp") - 3:args.index("/tmp")] == ["--size", str(2**28), "--tmpfs"]
    with pytest.raises(ValueError):
        sandbox._mounts(workdir, [workdir], Limits())
    with pytest.raises(ValueError):
        sandbox._mounts(workdir, [], Limits(), reveal=[Path("/")])


def test_no_gpu_no_sys(monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox.glob, "glob", lambda pattern: [])
    assert "/sys" not in sandbox._mounts(tmp_path, [], Limits())


def test_limits_must_be_positive():
    with pytest.raises(ValueError):
        Limits(time_s=0)
    with pytest.raises(ValueError):
        Limits(memory_bytes=-1)


@isolated
def test_a_read_only_workdir_and_a_capped_scratch_folder(work):
    """With ``readonly_workdir`` the program starts in a private, capped /tmp/work: it can read
    the workdir, write neither it nor more than ``scratch_bytes`` in all (the grader's disk and
    memory stay safe), and what it sends down its channel comes back, bounded."""
    (work / "program.json").write_text("{}")
    code = """
    import errno, json, os
    seen = {"cwd": os.getcwd(), "reads": open(sys_argv_1 + "/program.json").read()}
    try:
        open(sys_argv_1 + "/results.json", "w")
    except OSError as error:
        seen["workdir"] = errno.errorcode[error.errno]
    try:
        with open("big.bin", "wb") as big:
            for _ in range(64):
                big.write(b"x" * 2**20)
    except OSError as error:
        seen["fill"] = errno.errorcode[error.errno]
    channel = os.fdopen(int(os.environ["COURSE_CHANNEL_FD"]), "w")
    channel.write(json.dumps(seen) + "\\n" + "y" * 100_000)
    """.replace("sys_argv_1", repr(str(work)))
    outcome = run_code(code, work, limits=Limits(time_s=20, scratch_bytes=16 * 2**20), readonly_workdir=True,
                       channel_limit=50_000)
    assert outcome.returncode == 0 and outcome.channel_overflowed and len(outcome.channel) == 50_000
    seen = json.loads(outcome.channel.split(b"\n")[0])
    assert seen == {"cwd": str(sandbox.SCRATCH_CWD), "reads": "{}", "workdir": "EROFS", "fill": "ENOSPC"}
    assert sorted(p.name for p in work.iterdir()) == ["program.json"]


@isolated
def test_revealed_paths_show_through_a_hidden_folder(work, tmp_path_factory):
    home = tmp_path_factory.mktemp("home", numbered=True)
    (home / "secret.txt").write_text("private")
    (home / "python").mkdir()
    (home / "python" / "lib.txt").write_text("needed")
    code = f"""
    import os
    print(sorted(os.listdir({str(home)!r})), open({str(home / "python" / "lib.txt")!r}).read())
    """
    log = work / "log.txt"
    outcome = run_code(code, work, hide=[home], reveal=[home / "python"], log=log)
    assert outcome.returncode == 0
    assert log.read_text().strip() == "['python'] needed"
