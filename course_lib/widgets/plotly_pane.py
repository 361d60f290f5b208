"""A plotly figure inside a widget, replaced whole on every redraw.

``PlotlyPane`` is an ``ipywidgets.Output`` whose one output is the figure as plotly's own MIME
bundle, the same bundle a cell gets when it returns a ``go.Figure``; JupyterLab's plotly
extension draws it, with hover, zoom and the legend. ``show`` assigns the pane's ``outputs``
trait directly, so the figure travels as widget state: it cannot land in another cell or in the
log console wherever the callback runs (the reason ``figure_pane`` uses PNG images for
matplotlib), and a page reloaded with a live kernel gets the figure back with the rest of the
widget's state.

Why not plotly's ``FigureWidget``: in the browser its figures came back as empty axes after a
page reload with a live kernel, and under load some never initialised on a first Run All.
"""

from __future__ import annotations

import ipywidgets as w
import plotly.graph_objects as go
import plotly.io as pio


def mime_bundle(figure: go.Figure) -> dict:
    """The figure as the display data a cell returning it would send (plain JSON types only)."""
    return pio.renderers["plotly_mimetype"].to_mimebundle(figure.to_dict())


class PlotlyPane(w.Output):
    """Shows one figure at a time; ``show(figure)`` replaces it.

    Invariant: ``outputs`` holds exactly the bundle of ``figure``, the last figure shown (or
    nothing before the first ``show``)."""

    def __init__(self, figure: go.Figure | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.figure: go.Figure | None = None
        if figure is not None:
            self.show(figure)

    def show(self, figure: go.Figure) -> None:
        self.figure = figure
        self.outputs = ({"output_type": "display_data", "data": mime_bundle(figure), "metadata": {}},)

    @property
    def data(self) -> tuple:
        """The traces of the figure shown (empty before the first ``show``)."""
        return self.figure.data if self.figure is not None else ()
