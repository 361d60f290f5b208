"""A labelled vertical line on a plotly figure whose x axis may be logarithmic.

Plotly places a shape on a log axis by its value, but an annotation by the axis' own
coordinate, log10 of the value: ``add_vline(x=295, annotation_text=...)`` on a log axis draws
the line at 295 and its label at 10^295, which stretches the axis to span both. ``mark_x``
converts the label's position, so line and label sit together on either kind of axis.
"""

from __future__ import annotations

import math

import plotly.graph_objects as go


def axis_coordinate(figure: go.Figure, x: float) -> float:
    """``x`` in the coordinate plotly uses for annotations on the figure's x axis (log10 of it
    when the axis is logarithmic: set the axis type before calling)."""
    if figure.layout.xaxis.type == "log":
        if x <= 0:
            raise ValueError(f"A log axis cannot show x = {x}; mark a positive value.")
        return math.log10(x)
    return x


def mark_x(figure: go.Figure, x: float, text: str, left: bool = False, **line) -> None:
    """A dashed vertical line at ``x`` (in data units) with ``text`` above the plot area, on its
    right (or its ``left``); ``line`` takes plotly's line settings (``line_color``, ``line_dash``)."""
    figure.add_vline(x=x, **({"line_dash": "dash", "line_color": "grey"} | line))
    figure.add_annotation(x=axis_coordinate(figure, x), xref="x", y=1, yref="paper", yanchor="bottom",
                          xanchor="right" if left else "left", text=text, showarrow=False)
