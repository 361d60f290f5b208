"""Grading tests that need bubblewrap skip on a learner's machine without a working one, and fail
under CI (``CI=true``), which must run them (``.ci/run`` installs bubblewrap when it is missing)."""

import os

import pytest

from course_lib.grading.sandbox import sandbox_problem

IN_CI = os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def require_sandbox() -> None:
    """Skip (or, under CI, fail) unless bubblewrap can isolate a process here."""
    problem = sandbox_problem()
    if problem and IN_CI:
        pytest.fail(f"CI=true but the sandbox tests cannot run: {problem}", pytrace=False)
    if problem:
        pytest.skip(problem)
