"""How the CPU kernel's library lands and loads: a finished, stamped build is imported without
writing; a library that does not match its stamp is built again; a failed build is remembered
until a retry; a builder that dies leaves no lock behind. The compiler is replaced by a copy of
the real built library, so no test here compiles."""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from course_lib.kernels import cpu_paged_attention as cpu

PROBLEM = cpu.kernel_problem()
pytestmark = pytest.mark.skipif(PROBLEM is not None and os.environ.get("CI") != "true",
                                reason=f"the CPU kernel does not build here: {PROBLEM}")
NAME = cpu.extension_name()


@pytest.fixture
def build_root(tmp_path, monkeypatch):
    """An empty build folder, and a 'compiler' that copies the real library in as a build would."""
    real = cpu.BUILD_ROOT / NAME / f"{NAME}{cpu.SUFFIX}"
    compiles = []

    def fake_compile(folder, name):
        compiles.append(name)
        stage(folder)
        return cpu._import_built(folder, name)

    def stage(folder):  # as _compile lands a build: a new file renamed into place, then the stamp
        folder.mkdir(exist_ok=True)
        shutil.copy(real, folder / "incoming")
        os.replace(folder / "incoming", folder / real.name)
        (folder / "built").write_text(cpu._sha256(folder / real.name) + "\n")

    monkeypatch.setattr(cpu, "BUILD_ROOT", tmp_path)
    monkeypatch.setattr(cpu, "_compile", fake_compile)
    fake_compile.stage = stage
    return tmp_path, compiles


def files(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_a_stamped_build_is_imported_and_nothing_is_written(build_root):
    root, compiles = build_root
    assert cpu._load(NAME, retry=False).paged_decode and compiles == [NAME]
    before = files(root)
    assert cpu._load(NAME, retry=False).paged_decode
    assert compiles == [NAME] and files(root) == before  # a read-only checkout works the same


@pytest.mark.parametrize("damage", ["truncate", "delete library", "delete stamp"])
def test_a_library_that_does_not_match_its_stamp_is_built_again(build_root, damage):
    root, compiles = build_root
    cpu._compile.stage(root / NAME)  # a finished build, not imported (a loaded library is never rewritten)
    library, stamp = root / NAME / f"{NAME}{cpu.SUFFIX}", root / NAME / "built"
    if damage == "truncate":  # importing this would kill the process (SIGBUS), so it must never be opened
        library.write_bytes(library.read_bytes()[:4096])
    else:
        (library if damage == "delete library" else stamp).unlink()
    assert cpu._import_built(root / NAME, NAME) is None
    assert cpu._load(NAME, retry=False).paged_decode and compiles == [NAME]


def test_a_failed_build_is_remembered_until_a_retry(build_root, monkeypatch):
    root, compiles = build_root
    working = cpu._compile

    def broken(folder, name):
        compiles.append(name)
        raise RuntimeError("c++: fatal error: Python.h: No such file or directory")

    monkeypatch.setattr(cpu, "_compile", broken)
    with pytest.raises(RuntimeError, match="Python.h"):
        cpu._load(NAME, retry=False)
    with pytest.raises(RuntimeError, match=r"an earlier build failed \(RuntimeError: c\+\+: fatal error"):
        cpu._load(NAME, retry=False)
    assert len(compiles) == 1  # the second process fell back at once
    monkeypatch.setattr(cpu, "_compile", working)
    assert cpu._load(NAME, retry=True).paged_decode
    assert not (root / NAME / "failed").exists()


def test_a_builder_that_dies_leaves_no_lock_behind(tmp_path, monkeypatch):
    lock = tmp_path / "kernel.lock"
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time\n"
                               f"f = open({str(lock)!r}, 'a'); fcntl.flock(f, fcntl.LOCK_EX)\n"
                               "print('locked', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        monkeypatch.setattr(cpu, "LOCK_WAIT_S", 1)
        with pytest.raises(TimeoutError, match="another process has been building the kernel"):
            with cpu._build_lock(lock):
                pass
        holder.send_signal(signal.SIGKILL)  # a build killed halfway (closed terminal, OOM killer)
        holder.wait(timeout=10)
        started = time.monotonic()
        with cpu._build_lock(lock):
            assert time.monotonic() - started < 2
    finally:
        holder.kill()
        holder.wait()


def test_no_compiler_is_said_before_anything_is_printed(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cpu, "BUILD_ROOT", tmp_path)
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    with pytest.raises(RuntimeError, match="no C\\+\\+ compiler: '/nonexistent/c\\+\\+' is not on PATH"):
        cpu._compile(tmp_path / NAME, NAME)
    assert capsys.readouterr().err == ""
