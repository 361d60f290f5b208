"""Paged decode attention for the CPU: a C++ kernel (``csrc/paged_decode_attention.cpp``) that reads
each sequence's keys and values where they lie in the paged cache, as vLLM's CPU backend does
for decodes. The PyTorch backend instead gathers every context into a contiguous copy, in every
layer, before SDPA reads it again.

The kernel is compiled on first use (about 30 s, with the C++ compiler PyTorch's extensions use)
into ``course_lib/kernels/build/NAME/``, one NAME per source version, flags, torch, Python and
machine. How a build lands, so that no process ever loads half a library or waits forever:

* it is compiled in a private temporary folder, then its library is renamed into place and a
  stamp holding the library's sha256 is written last; a process imports a library only when
  the stamp exists and the hash matches (else it builds again);
* builders take an OS file lock (released if the builder dies), so two processes never compile
  at once, and the second imports the first one's library;
* a failed build leaves its reason in ``failed``, so later processes fall back at once instead of
  trying again (``kernel_problem(retry=True)``, which ``./course check`` uses, tries again).

A read-only checkout (the grader's sandbox) imports a finished build and never writes.
``python -m course_lib.kernels.cpu_paged_attention`` builds it ahead of time (``./course`` does so
when it sets up). float32 and float64 only: other dtypes, and machines where the build fails,
use the PyTorch backend.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import platform
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from types import ModuleType

import torch

SOURCE = Path(__file__).with_name("csrc") / "paged_decode_attention.cpp"
BUILD_ROOT = Path(__file__).with_name("build")
SUFFIX = ".pyd" if sys.platform == "win32" else ".so"
LOCK_WAIT_S = 600  # another process's build takes ~30 s; a lock held longer than this is reported

_kernel: ModuleType | None = None
_failure: Exception | None = None


def _compile_flags() -> list[str]:
    """-ffast-math lets the compiler vectorise the dot products, sums and exp; it is given to the
    compiler only, never the linker, so the process's floating-point modes stay untouched, and
    -fno-finite-math-only keeps infinities and NaN meaning what IEEE says."""
    flags = ["-O3", "-ffast-math", "-fno-finite-math-only"]
    if sys.platform.startswith("linux"):
        flags.append("-fopenmp")  # at::parallel_for shares the sequences out over torch's threads
    if platform.machine() in ("x86_64", "AMD64") and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        flags += ["-mavx2", "-mfma"]
    return flags


@functools.cache
def extension_name() -> str:
    """One name per source, flags, torch, Python and machine: any change builds a fresh library.
    Computed once per process, so editing the source never rebuilds under a running engine."""
    key = "\n".join([SOURCE.read_text(), " ".join(_compile_flags()), torch.__version__, sys.version,
                     platform.machine(), sys.platform])
    return "course_cpu_paged_decode_" + hashlib.sha256(key.encode()).hexdigest()[:12]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _import_built(folder: Path, name: str) -> ModuleType | None:
    """The finished build in ``folder``, or None when there is none (no stamp, or a library that
    is not the one the stamp names)."""
    library, stamp = folder / f"{name}{SUFFIX}", folder / "built"
    try:
        if stamp.read_text().strip() != _sha256(library):
            return None
    except OSError:
        return None
    spec = importlib.util.spec_from_file_location(name, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def _build_lock(path: Path):
    """An exclusive OS lock on ``path`` (none where fcntl is missing); the OS drops it if we die."""
    try:
        import fcntl
    except ImportError:  # Windows: no lock; a clash costs a second compile, never a broken library
        yield
        return
    with open(path, "a") as handle:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"another process has been building the kernel for over {LOCK_WAIT_S} s "
                                       f"(lock {path}); try again once it finishes") from None
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _compile(folder: Path, name: str) -> ModuleType:
    """Compile into a private temporary folder, move the library into ``folder``, stamp it, and
    return the module (already imported by the build; the rename does not disturb it)."""
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        raise RuntimeError(f"no C++ compiler: {compiler!r} is not on PATH (Debian/Ubuntu: sudo apt install g++)")
    from torch.utils.cpp_extension import load

    print("Compiling the CPU paged-attention kernel (once per machine, about 30 s)...", file=sys.stderr, flush=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=BUILD_ROOT))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's compiler-version notes; a real failure raises below
            module = load(name, [str(SOURCE)], extra_cflags=_compile_flags(),
                 extra_ldflags=["-fopenmp"] if sys.platform.startswith("linux") else [],
                 build_directory=str(scratch), verbose=False)
        folder.mkdir(exist_ok=True)
        library = folder / f"{name}{SUFFIX}"
        os.replace(scratch / library.name, library)
        (folder / "built").write_text(_sha256(library) + "\n")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return module


def _load(name: str, retry: bool) -> ModuleType:
    folder = BUILD_ROOT / name
    module = _import_built(folder, name)
    if module is not None:
        return module
    failed = folder / "failed"
    if failed.exists() and not retry:
        raise RuntimeError(f"an earlier build failed ({failed.read_text().strip()}); "
                           "./course check tries again")
    BUILD_ROOT.mkdir(exist_ok=True)
    with _build_lock(BUILD_ROOT / f"{name}.lock"):
        module = _import_built(folder, name)  # built by another process while we waited
        if module is not None:
            return module
        try:
            module = _compile(folder, name)
        except Exception as error:
            folder.mkdir(exist_ok=True)
            failed.write_text(" ".join(f"{type(error).__name__}: {error}".split())[:2000] + "\n")
            raise
        failed.unlink(missing_ok=True)
    return module


def load_kernel(retry: bool = False) -> ModuleType:
    """The compiled extension, built first if need be. Raises what building or importing raises;
    a failure is remembered (in this process, and on disk for a failed build), so a process
    tries only once unless ``retry``."""
    global _kernel, _failure
    if _kernel is None and (_failure is None or retry):
        try:
            _kernel, _failure = _load(extension_name(), retry), None
        except Exception as error:  # noqa: BLE001 - kept and re-raised to every caller
            _failure = error
    if _kernel is None:
        raise _failure
    return _kernel


def kernel_problem(retry: bool = False) -> str | None:
    """Why the kernel cannot run here (a one-line reason), or None when it loads."""
    try:
        load_kernel(retry)
    except Exception as error:  # noqa: BLE001
        text = " ".join(str(error).split())
        return f"{type(error).__name__}: {text[:300]}"
    return None


def paged_decode_attention_cpu(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                               out: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of one query per sequence, ``q [B, heads, head_dim]``, over its cached context
    (``seq_lens[b]`` tokens through ``block_tables[b]``), in ``q``'s dtype (float32 or float64).
    Writes ``out`` (contiguous, ``q``'s shape; a new tensor if not given) and returns it."""
    out = torch.empty(q.shape, dtype=q.dtype) if out is None else out
    kernel = _kernel or load_kernel()
    kernel.paged_decode(out, q.contiguous(), k_cache, v_cache, block_tables.long().contiguous(),
                        seq_lens.long().contiguous(), float(scale))
    return out


if __name__ == "__main__":
    problem = kernel_problem(retry="--retry" in sys.argv)
    print(problem or f"CPU paged-attention kernel ready: {BUILD_ROOT / extension_name()}")
    sys.exit(1 if problem else 0)
