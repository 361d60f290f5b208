"""Test-wide set-up, inherited by the notebook kernels nbval starts from this process.

* One torch thread per process: the suite runs one pytest worker per core, and a second
  thread pool per worker makes them spin against each other (a notebook cell that takes 4 s
  alone took over 60 s that way). Set before torch is imported.
* On a machine without a GPU, Triton kernels run in the interpreter; the variable must be
  set before any ``@triton.jit`` decorator runs.
* Every test closes the matplotlib figures it drew.
* Each lesson nbval runs whole gets two more checks, its Run All time and its widgets' answer
  times, and the run ends with a table of both (``tests/lesson_time_checks.py``).
* The website's checks (``tests/website``) run only when asked (see ``collect_ignore``).
"""

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

# tests/ holds helpers shared by test files and plugins; pytest puts it on sys.path for the
# test files in it anyway (rootdir-relative imports), the plugin below needs it earlier.
sys.path.insert(0, str(Path(__file__).resolve().parent / "tests"))
pytest_plugins = ["lesson_time_checks"]

# tests/website checks the website, which is built from the lessons' runs once the suite is over:
# ./course test runs it second, with COURSE_SITE_CHECKS=1; a plain pytest run leaves it out.
collect_ignore = [] if os.environ.get("COURSE_SITE_CHECKS") else ["tests/website"]


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


if not _has_cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _close_figures():
    """Tests draw many figures; close them so none pile up between tests."""
    yield
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")
