"""The set-up check runs the real things and explains every failure."""

import torch

from course_lib.setup_check import (
    CheckResult,
    as_html,
    as_text,
    check_cpu_kernel,
    check_distributed,
    check_triton,
    run_checks,
)


def test_every_required_check_passes_on_a_course_machine():
    results = run_checks()
    assert [r.name for r in results] == ["Python", "PyTorch", "Triton", "CPU attention kernel", "torch.distributed",
                                         "GPU", "JupyterLab widgets"]
    assert all(r.ok for r in results if r.required), as_text(results)
    assert as_text(results).endswith("Ready for the course.")
    gpu = next(r for r in results if r.name == "GPU")
    assert gpu.ok == torch.cuda.is_available() and not gpu.required


def test_triton_and_ranks_are_really_exercised():
    assert "a test kernel matched its PyTorch reference" in check_triton().detail
    assert "gave [3.0, 3.0]" in check_distributed().detail


def test_the_cpu_kernel_check_builds_and_runs_it_or_says_how_to_get_it(monkeypatch):
    result = check_cpu_kernel()
    assert result.ok and result.detail == "built; a decode step matched the PyTorch backend" and not result.required
    from course_lib.kernels import cpu_paged_attention

    from course_lib.engine import backend

    def crash(*args):
        raise RuntimeError("paged_decode: q must be contiguous")

    monkeypatch.setattr(backend, "probe_cpu", crash)  # a kernel that builds but fails: optional all the same
    result = check_cpu_kernel()
    assert not result.ok and not result.required and "RuntimeError: paged_decode" in result.detail
    monkeypatch.setattr(cpu_paged_attention, "kernel_problem", lambda retry: "RuntimeError: Ninja is required")
    result = check_cpu_kernel()
    assert not result.ok and not result.required and "Ninja is required" in result.detail
    assert "sudo apt install g++" in result.fix


def test_failures_show_their_fix():
    results = [CheckResult("Python", True, "3.11"), CheckResult("Triton", False, "not installed", "pip install triton"),
               CheckResult("GPU", False, "none", "optional", required=False)]
    text = as_text(results)
    assert "[FAIL] Triton" in text and "fix: pip install triton" in text and "[note] GPU" in text
    assert text.endswith("Fix the FAIL lines above, then run the check again.")
    assert "fix: pip install triton" in as_html(results)


def test_an_optional_note_gives_advice_not_a_fix():
    results = [CheckResult("Triton", False, "not installed", "pip install triton"),
               CheckResult("GPU", False, "none", "To use a GPU later: install a CUDA build of torch.", required=False)]
    text, page = as_text(results), as_html(results)
    assert "fix: pip install triton" in text and "fix: pip install triton" in page
    assert "To use a GPU later" in text and "To use a GPU later" in page
    assert text.count("fix:") == page.count("fix:") == 1  # nothing needs fixing when no GPU is found


def test_the_table_reads_from_the_left():
    """JupyterLab right-aligns table cells; every cell of the check table says where its text starts."""
    page = as_html([CheckResult("Python", True, "3.11 at /usr/bin/python3"),
                    CheckResult("GPU", False, "none", "advice", required=False)])
    assert page.count("<td") == 6 == page.count("<td style='text-align:left")


def test_a_check_that_raises_becomes_a_failed_line(monkeypatch):
    import course_lib.setup_check as setup_check

    def broken():
        raise OSError("disk on fire")

    monkeypatch.setattr(setup_check, "CHECKS", [setup_check.check_python, setup_check.check_torch, broken])
    results = setup_check.run_checks()
    assert not results[-1].ok and "disk on fire" in results[-1].detail and results[0].ok
