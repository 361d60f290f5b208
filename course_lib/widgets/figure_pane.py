"""A picture of one matplotlib figure at a time, replaced on every redraw.

Why a PNG in an ``ipywidgets.Image`` rather than ``display(fig)`` in an ``Output`` widget:
JupyterLab may deliver widget events to the kernel on several threads at once (kernel
subshells), and while another cell runs (Run All). An ``Output`` widget routes what is
displayed by the message that is current when the callback runs, so a redraw could land in
another cell or in JupyterLab's log console; pyplot's figure registry could hand a widget's
figure to the inline backend of a running cell. A PNG set as an image's value travels as
widget state, never as a displayed output, and ``new_figure`` makes figures pyplot never sees.

Matplotlib is not thread-safe (its mathtext parser, for one, is shared): every redraw through
``FigurePane`` holds ``DRAW_LOCK``, so redraws from concurrent callbacks run one at a time.
"""

from __future__ import annotations

import functools
import io
import threading
from typing import Callable

import ipywidgets as w
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

DRAW_LOCK = threading.RLock()
"""Held while a figure is drawn and rendered; reentrant, so a redraw may trigger another."""

DPI = 100  # the inline backend's resolution, so panes look like the lesson's other figures


def one_at_a_time(method: Callable) -> Callable:
    """Run a widget method under ``DRAW_LOCK``, so callbacks arriving on several kernel threads
    read and change the widget's state, readouts and picture one after another."""

    @functools.wraps(method)
    def locked(*args, **kwargs):
        with DRAW_LOCK:
            return method(*args, **kwargs)

    return locked


def new_figure(width_in: float, height_in: float) -> Figure:
    """A figure outside pyplot: no backend shows it, nothing needs closing, safe off the main thread."""
    return Figure(figsize=(width_in, height_in), dpi=DPI)


def render_png(fig: Figure) -> bytes:
    """The figure as PNG bytes, cropped to what is drawn (as the inline backend does)."""
    buffer = io.BytesIO()
    with DRAW_LOCK:
        fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
    return buffer.getvalue()


class FigurePane(w.Image):
    """``show(fig)`` replaces the picture with ``fig``; ``redraw(draw)`` draws and shows under the lock.

    Invariants: the pane only ever holds a PNG (its value is widget state, so it shows in the
    widget wherever the callback runs); a figure made by pyplot is closed once shown, so none
    pile up; with ``redraw``, the last redraw to finish read the widgets' latest values.
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(format="png", **kwargs)

    def show(self, fig: Figure) -> None:
        with DRAW_LOCK:
            png = render_png(fig)
            plt.close(fig)  # a pyplot figure leaves pyplot's registry; a new_figure() one is unaffected
            self.layout.width = f"{int.from_bytes(png[16:20], 'big')}px"  # PNG header: width; shown 1:1, not stretched
            self.value = png

    def redraw(self, draw: Callable[[], Figure]) -> None:
        """Call ``draw()`` (which reads the widgets and returns a figure) and show its figure, all
        under ``DRAW_LOCK``: of two concurrent redraws the later one reads the later values."""
        with DRAW_LOCK:
            self.show(draw())
