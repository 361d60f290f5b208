"""A plotly figure inside a widget, redrawn in place.

``PlotlyPane`` is a ``plotly.graph_objects.FigureWidget`` (anywidget underneath): its traces and
layout are widget state, so a callback that redraws it sends state, never a displayed output,
and the picture cannot land in another cell or in JupyterLab's log console (the reason
``figure_pane`` uses PNG images for matplotlib). Hover, zoom and the legend keep working.
"""

from __future__ import annotations

import plotly.graph_objects as go


class PlotlyPane(go.FigureWidget):
    """Shows one figure at a time; ``show(figure)`` swaps in another figure's traces and layout."""

    def __init__(self, figure: go.Figure | None = None) -> None:
        super().__init__(figure)

    def show(self, figure: go.Figure) -> None:
        with self.batch_update():
            self.data = ()
            self.add_traces(list(figure.data))
            self.layout = figure.layout
