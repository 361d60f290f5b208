"""What a plotly figure spans: the extents its axes autorange to, computed from the figure itself.

Plotly autoranges an axis over every trace point, every shape drawn in data coordinates and
every annotation placed in them. On a log axis a shape's x is a value, but an annotation's x is
log10 of the value, so ``add_vline(x=295, annotation_text=...)`` puts its label at 10^295; these
helpers convert annotation positions the way plotly reads them, so such a figure shows up here
as spanning 10^295.
"""

from __future__ import annotations

import math


def _log(fig, axis: str) -> bool:
    return fig.layout[f"{axis}axis"].type == "log"


def figure_extents(fig) -> dict[str, tuple[float, float]]:
    """{'x': (low, high), 'y': (low, high)} over traces, data-coordinate shapes and annotations, in data units."""
    values = {"x": [], "y": []}
    for trace in fig.data:
        for axis in values:
            values[axis] += [v for v in (getattr(trace, axis, None) or ()) if v is not None]
    for shape in fig.layout.shapes:
        for axis in values:
            if (getattr(shape, f"{axis}ref") or axis) == axis:
                values[axis] += [getattr(shape, f"{axis}0"), getattr(shape, f"{axis}1")]
    for note in fig.layout.annotations:
        for axis in values:
            position = getattr(note, axis)
            if (getattr(note, f"{axis}ref") or axis) == axis and position is not None:
                values[axis].append(10 ** position if _log(fig, axis) else position)
    return {axis: (min(found), max(found)) for axis, found in values.items() if found}


def trace_extents(fig, names) -> dict[str, tuple[float, float]]:
    """The same, over the traces called one of ``names`` only: where the data is."""
    data = [trace for trace in fig.data if trace.name in names]
    assert data, f"no trace named one of {names} in {[t.name for t in fig.data]}"
    xs = [v for trace in data for v in trace.x]
    ys = [v for trace in data for v in trace.y]
    return {"x": (min(xs), max(xs)), "y": (min(ys), max(ys))}


def decades_beyond(fig, names, axis: str) -> float:
    """How many decades the figure's ``axis`` reaches beyond the named traces' data, on the worse side."""
    (low, high), (data_low, data_high) = figure_extents(fig)[axis], trace_extents(fig, names)[axis]
    return max(math.log10(data_low / low), math.log10(high / data_high))
