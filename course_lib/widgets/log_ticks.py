"""Ticks for log axes, each labelled with its unit: '1 µs', '10 ms', '1 s'; '1 KiB', '64 MiB'.

Left to itself plotly labels a log axis in mixed forms ('100k', '10k', '1000') and, with an SI tick
format, drops the unit ('100µ'). These place ticks across the data, for seconds as
``log_number_ticks`` does for plain quantities, for bytes at 1 KiB times powers of a step, and
label each with ``units.format_duration`` / ``format_bytes``.
Pass the result to ``update_xaxes`` / ``update_yaxes`` of an axis of ``type="log"``.
"""

from __future__ import annotations

import math

from course_lib.perf.units import KiB, format_bytes, format_duration
from course_lib.widgets.log_number_ticks import log_tick_values


def powers(low: float, high: float, base: float = 10.0) -> list[float]:
    """Every power of ``base`` from the one at or below ``low`` to the one at or above ``high``
    (both positive), so the ticks bracket the data."""
    if not 0 < low <= high:
        raise ValueError(f"A log axis needs 0 < low <= high, got {low} and {high}.")
    first, last = math.floor(math.log(low, base) + 1e-9), math.ceil(math.log(high, base) - 1e-9)
    return [base ** k for k in range(first, last + 1)]


def time_ticks(low_s: float, high_s: float) -> dict:
    """``tickvals`` and ``ticktext`` for an axis in seconds: the ticks ``log_tick_values`` picks inside
    the data (decades, or 1-2-5 steps where it spans less), '100 µs', '1 ms', ..."""
    values = log_tick_values(low_s, high_s)
    return {"tickvals": values, "ticktext": [format_duration(v) for v in values]}


def bytes_ticks(low: float, high: float, step: int = 16) -> dict:
    """``tickvals`` and ``ticktext`` for an axis in bytes: 1 KiB times every power of ``step`` (a
    power of two) from the one at or below ``low`` to the one at or above ``high``: '64 B', '1 KiB',
    '16 KiB', ... for a step of 16."""
    if step < 2 or step & (step - 1):
        raise ValueError(f"Byte ticks step by a power of two, 2 or more; got {step}.")
    values = [round(v * KiB) if v * KiB >= 1 else v * KiB for v in powers(low / KiB, high / KiB, step)]
    return {"tickvals": values, "ticktext": [format_bytes(v, whole=True) for v in values]}
