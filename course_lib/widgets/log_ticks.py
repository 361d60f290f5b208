"""Ticks for plotly log axes, chosen from the figure's own data and labelled in one style.

Left to itself, plotly labels a log axis in a mix of styles ("10¹⁵" beside "100T"; "100k", "10k",
"1000"), drops the unit with an SI tick format ("100µ"), and, when the axis spans less than two
decades, labels every minor tick, so "5" to "9" pile up under each other. ``log_tick_values``
puts a tick at every power of ten the data spans, adds 2 and 5 times each where fewer than three
powers of ten fall inside (every whole multiple where still fewer); ``label_log_axis`` applies
them with one formatter (plain numbers, or ``si_tick``); ``time_ticks`` labels seconds
('100 µs', '1 ms') and ``bytes_ticks`` bytes at 1 KiB times powers of a step ('1 KiB', '64 MiB').
Pass the dicts of the last two to ``update_xaxes`` / ``update_yaxes`` of an axis of ``type="log"``.
"""

from __future__ import annotations

import math
from typing import Callable

import plotly.graph_objects as go

from course_lib.perf.units import KiB, format_bytes, format_duration, format_number, format_si


def si_tick(value: float) -> str:
    """A short SI label: 2e12 -> '2T', 5e8 -> '500M', 20 -> '20'."""
    return format_si(value, "").replace(" ", "")


def log_tick_values(low: float, high: float) -> list[float]:
    """Ticks for a log axis over [low, high] (both positive): the powers of ten inside it; where
    fewer than three fit, 2 and 5 times every power of ten as well; where still fewer, every whole
    multiple; and where fewer than two of those fit, the two ends rounded inwards to two
    significant digits too. Invariant: every tick lies in [low, high], and there are at least two
    unless low == high."""
    if not 0 < low <= high:
        raise ValueError(f"A log axis needs 0 < low <= high, got {low!r} and {high!r}.")
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    decades = [10.0**k for k in range(first, last + 1)]
    for multiples in ((1,), (1, 2, 5), range(1, 10)):
        ticks = [d * m for d in decades for m in multiples if low <= d * m <= high]
        if len(ticks) >= 3:
            break
    if len(ticks) < 2:
        unit = 10.0 ** (math.floor(math.log10(high)) - 1)
        ends = {math.ceil(low / unit) * unit, math.floor(high / unit) * unit}
        ticks = sorted({t for t in ends | set(ticks) if low <= t <= high}) or [low]
    return ticks


def label_log_axis(figure: go.Figure, axis: str, label: Callable[[float], str] = format_number) -> None:
    """Set ``axis`` ('x' or 'y', of type log) to ``log_tick_values`` over every trace's data,
    each tick labelled by ``label``; plotly's own tick labels, minor ones included, are replaced."""
    values = [v for trace in figure.data for v in (getattr(trace, axis) or ()) if v is not None and v > 0]
    if not values:
        raise ValueError(f"The figure has no positive {axis} values to put ticks under; add its traces first.")
    ticks = log_tick_values(min(values), max(values))
    figure.update_layout({f"{axis}axis": dict(tickmode="array", tickvals=ticks, ticktext=[label(t) for t in ticks])})


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
