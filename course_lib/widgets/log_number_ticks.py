"""Ticks for a plotly log axis of plain quantities (FLOP/byte, FLOP/s, requests per second),
chosen from the figure's own data rather than by plotly.

Left to itself, plotly labels such an axis in a mix of styles ("10¹⁵" beside "100T") and, when
it spans less than two decades, labels every minor tick, so "5" to "9" pile up under each other.
``label_log_axis`` puts a tick at every power of ten the data spans, adds 2 and 5 times each
where fewer than three powers of ten fall inside, and labels every tick with one formatter
(plain numbers, or an SI prefix). (``log_ticks`` does the same job for seconds and bytes.)
"""

from __future__ import annotations

import math
from typing import Callable

import plotly.graph_objects as go

from course_lib.perf.units import format_number, format_si


def si_tick(value: float) -> str:
    """A short SI label: 2e12 -> '2T', 5e8 -> '500M', 20 -> '20'."""
    return format_si(value, "").replace(" ", "")


def log_tick_values(low: float, high: float) -> list[float]:
    """Ticks for a log axis over [low, high] (both positive): the powers of ten inside it; where
    fewer than three fit, 2 and 5 times every power of ten as well; where still fewer, every whole
    multiple; and the two ends when not even one of those fits. Invariant: every tick lies in
    [low, high], and there is at least one."""
    if not 0 < low <= high:
        raise ValueError(f"A log axis needs 0 < low <= high, got {low!r} and {high!r}.")
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    decades = [10.0**k for k in range(first, last + 1)]
    for multiples in ((1,), (1, 2, 5), range(1, 10)):
        ticks = [d * m for d in decades for m in multiples if low <= d * m <= high]
        if len(ticks) >= 3:
            break
    return ticks or sorted({low, high})


def label_log_axis(figure: go.Figure, axis: str, label: Callable[[float], str] = format_number) -> None:
    """Set ``axis`` ('x' or 'y', of type log) to ``log_tick_values`` over every trace's data,
    each tick labelled by ``label``; plotly's own tick labels, minor ones included, are replaced."""
    values = [v for trace in figure.data for v in (getattr(trace, axis) or ()) if v is not None and v > 0]
    if not values:
        raise ValueError(f"The figure has no positive {axis} values to put ticks under; add its traces first.")
    ticks = log_tick_values(min(values), max(values))
    figure.update_layout({f"{axis}axis": dict(tickmode="array", tickvals=ticks, ticktext=[label(t) for t in ticks])})
