"""Byte units and human-readable formatting."""

from __future__ import annotations

KiB = 1024
MiB = 1024**2
GiB = 1024**3
GB = 10**9


def format_bytes(num_bytes: float) -> str:
    """Format a byte count with a binary unit, e.g. ``131072 -> '128.0 KiB'``."""
    sign = "-" if num_bytes < 0 else ""
    value = abs(float(num_bytes))
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if value >= size:
            return f"{sign}{value / size:.1f} {unit}"
    return f"{sign}{value:.0f} B"
