"""Is this machine ready for the course? ``./course check`` or ``notebooks/00_setup.ipynb``.

Each check runs the real thing (a Triton kernel, the CPU attention kernel, two real ranks) and, when it fails, says how
to fix it. Only a failure marked ``required`` stops the course; the GPU is optional.
"""

from __future__ import annotations

import html
import importlib.metadata
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable

from course_lib.paths import REPO_ROOT

TRITON_PROBE = """
import torch
from course_lib.kernels.cache_write import write_kv_cache, write_kv_cache_ref
device = "cuda" if torch.cuda.is_available() else "cpu"
k, v = torch.randn(3, 2, 4, device=device), torch.randn(3, 2, 4, device=device)
caches = [torch.zeros(4, 2, 2, 4, device=device) for _ in range(4)]
slots = torch.tensor([5, 0, 2], device=device)
write_kv_cache(k, v, caches[0], caches[1], slots)
write_kv_cache_ref(k, v, caches[2], caches[3], slots)
assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
"""


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome. ``fix`` says how to repair a failed required check; for an optional one
    (``required=False``) it is advice, shown as such, since nothing needs fixing."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True

    @property
    def advice(self) -> str:
        """What the learner reads under a check that did not pass: 'fix: ...' where something must be
        repaired, the advice alone where the check is optional; empty when there is none."""
        if self.ok or not self.fix:
            return ""
        return f"fix: {self.fix}" if self.required else self.fix


def check_python() -> CheckResult:
    version = platform.python_version()
    ok = sys.version_info >= (3, 10)
    return CheckResult("Python", ok, f"{version} at {sys.executable}",
                       "" if ok else "Use Python 3.10 or newer: PYTHON=python3.12 ./course lab")


def check_torch() -> CheckResult:
    try:
        import torch
    except ImportError:
        return CheckResult("PyTorch", False, "not installed", "Run ./course lab (or ./course test) once: it installs torch.")
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU build"
    return CheckResult("PyTorch", True, f"{torch.__version__} ({build})")


def check_gpu() -> CheckResult:
    import torch

    if not torch.cuda.is_available():
        return CheckResult("GPU", False, "none: everything runs on the CPU; Triton kernels in the interpreter",
                           "To use a GPU later: on a GPU box, install a CUDA build of torch before ./course lab.",
                           required=False)
    properties = torch.cuda.get_device_properties(0)
    return CheckResult("GPU", True, f"{torch.cuda.device_count()} x {properties.name}, "
                                    f"{properties.total_memory / 2**30:.1f} GiB each", required=False)


def check_triton() -> CheckResult:
    """Runs a real kernel in a fresh process: compiled on a GPU, in the interpreter on a CPU."""
    try:
        version = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return CheckResult("Triton", False, "not installed", "pip install triton (Linux) or run ./course lab once.")
    import torch

    mode = "compiled for the GPU" if torch.cuda.is_available() else "interpreter (TRITON_INTERPRET=1)"
    env = dict(os.environ, **({} if torch.cuda.is_available() else {"TRITON_INTERPRET": "1"}))
    probe = subprocess.run([sys.executable, "-c", TRITON_PROBE], cwd=REPO_ROOT, env=env, capture_output=True,
                           text=True, timeout=300)
    if probe.returncode:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        return CheckResult("Triton", False, f"{version}, {mode}: a test kernel failed ({last})",
                           "Reinstall the Triton that matches your torch (torch 2.13 pairs with triton 3.7.1).")
    return CheckResult("Triton", True, f"{version}, {mode}: a test kernel matched its PyTorch reference")


def check_cpu_kernel() -> CheckResult:
    """Builds (once) the engine's C++ decode-attention kernel and runs one step against PyTorch's."""
    from course_lib.kernels.cpu_paged_attention import kernel_problem

    name = "CPU attention kernel"
    problem = kernel_problem(retry=True)  # a build that failed before is tried again here
    if problem is None:
        import torch

        from course_lib.engine.backend import probe_cpu

        try:
            probe_cpu(6, 2, 32, 16, torch.float32)
        except Exception as error:  # noqa: BLE001 - optional: whatever the probe raises is reported
            return CheckResult(name, False, f"built, but {type(error).__name__}: {error}", "Report this bug; the "
                               "engine uses PyTorch attention meanwhile.", required=False)
        return CheckResult(name, True, "built; a decode step matched the PyTorch backend", required=False)
    return CheckResult(name, False, f"not built ({problem})", "Optional: without it the engine attends with PyTorch "
                       "on the CPU (slower decodes). Install a C++ compiler (Debian/Ubuntu: sudo apt install g++), "
                       "then run ./course check again.", required=False)


def check_distributed() -> CheckResult:
    import torch.distributed as dist

    from course_lib.collectives.launch import default_backend, run_on_ranks

    backends = [name for name, available in (("gloo", dist.is_gloo_available()), ("nccl", dist.is_nccl_available()))
                if available]
    if "gloo" not in backends:
        return CheckResult("torch.distributed", False, f"backends: {backends or 'none'}",
                           "This torch build lacks gloo; install the official torch wheel.")
    try:
        sums = run_on_ranks(_two_rank_sum, 2, timeout_s=60, on_print=lambda rank, line: None)
    except Exception as error:  # noqa: BLE001 - any failure here is what the learner must see
        last = [line for line in str(error).splitlines() if line.strip()][-1:] or [type(error).__name__]
        return CheckResult("torch.distributed", False, f"2-rank run failed: {last[0]}",
                           "Check that processes may open sockets on 127.0.0.1 (a firewall or sandbox may block it).")
    ok = sums == [3.0, 3.0]
    return CheckResult("torch.distributed", ok, f"backends {', '.join(backends)}; a 2-rank all-reduce on "
                                                f"{default_backend(2)} gave {sums}", "" if ok else "Report this bug.")


def _two_rank_sum() -> float:
    import torch
    import torch.distributed as dist

    value = torch.tensor([dist.get_rank() + 1.0])
    if "nccl" in dist.get_backend():
        value = value.cuda(dist.get_rank())
    dist.all_reduce(value)
    return value.item()


def check_widgets() -> CheckResult:
    versions = {}
    for package in ("jupyterlab", "ipywidgets", "jupyterlab_widgets"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    missing = [name for name, version in versions.items() if version is None]
    detail = ", ".join(f"{name} {version}" for name, version in versions.items() if version)
    return CheckResult("JupyterLab widgets", not missing, detail + (f"; missing {missing}" if missing else ""),
                       "" if not missing else f"pip install {' '.join(missing)}, then restart JupyterLab.")


# the distributed check runs before the GPU check: forked ranks cannot use CUDA once this process has
CHECKS: list[Callable[[], CheckResult]] = [check_python, check_torch, check_triton, check_cpu_kernel,
                                           check_distributed, check_gpu, check_widgets]
NEEDS_TORCH = {check_triton, check_cpu_kernel, check_distributed, check_gpu}


def run_checks() -> list[CheckResult]:
    """Every check; one that raises becomes a failed result instead of stopping the others."""
    results = []
    for check in CHECKS:
        name = check.__name__.removeprefix("check_")
        if check in NEEDS_TORCH and not any(r.name == "PyTorch" and r.ok for r in results):
            results.append(CheckResult(name, False, "skipped: needs PyTorch", "Fix PyTorch first."))
            continue
        try:
            results.append(check())
        except Exception as error:  # noqa: BLE001 - report, and go on with the other checks
            results.append(CheckResult(name, False, f"the check itself failed: {type(error).__name__}: {error}",
                                       "Report this with the line above."))
    return results


def as_text(results: list[CheckResult]) -> str:
    lines = []
    for r in results:
        mark = "ok  " if r.ok else ("FAIL" if r.required else "note")
        lines.append(f"[{mark}] {r.name:20} {r.detail}")
        if r.advice:
            lines.append(f"       {r.advice}")
    ready = all(r.ok for r in results if r.required)
    lines.append("Ready for the course." if ready else "Fix the FAIL lines above, then run the check again.")
    return "\n".join(lines)


def as_html(results: list[CheckResult]) -> str:
    """The results as a table whose text reads from the left (JupyterLab right-aligns table cells)."""
    left = "text-align:left"
    rows = "".join(
        f"<tr><td style='{left};color:{'#1a7f37' if r.ok else '#cf222e' if r.required else '#9a6700'}'><b>"
        f"{'ok' if r.ok else 'FAIL' if r.required else 'note'}</b></td><td style='{left}'><b>{html.escape(r.name)}</b>"
        f"</td><td style='{left}'>{html.escape(r.detail)}"
        f"{'<br><i>' + html.escape(r.advice) + '</i>' if r.advice else ''}</td></tr>"
        for r in results)
    return f"<table>{rows}</table>"


def main() -> int:
    results = run_checks()
    print(as_text(results))
    return 0 if all(r.ok for r in results if r.required) else 1


if __name__ == "__main__":
    sys.exit(main())
