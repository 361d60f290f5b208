"""Test-wide set-up: on a machine without a GPU, Triton kernels run in the interpreter.

The variable must be set before any ``@triton.jit`` decorator runs, and notebook kernels
started by nbval inherit it from this process.
"""

import os


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


if not _has_cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")
