"""Test-wide set-up, inherited by the notebook kernels nbval starts from this process.

* One torch thread per process: the suite runs one pytest worker per core, and a second
  thread pool per worker makes them spin against each other (a notebook cell that takes 4 s
  alone took over 60 s that way). Set before torch is imported.
* On a machine without a GPU, Triton kernels run in the interpreter; the variable must be
  set before any ``@triton.jit`` decorator runs.
* Every test closes the matplotlib figures it drew.
"""

import os
import sys

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")


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
