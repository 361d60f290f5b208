"""Triton kernels, each beside a plain-PyTorch reference with the same signature.

On a GPU they compile; on a CPU they run under ``TRITON_INTERPRET=1`` (set it before the
first import of this package; it is ~300x slower, so keep shapes small).

One kernel is C++ for the CPU instead: ``cpu_paged_attention.py`` (source in ``csrc/``), the
engine's decode attention when it serves on a CPU.
"""
