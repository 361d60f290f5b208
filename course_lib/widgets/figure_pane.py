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
import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.image import imsave

from course_lib.cycle_collector import cycle_collector_paused

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
    """A figure outside pyplot, on its own Agg canvas: no backend shows it, nothing needs closing,
    safe off the main thread; ``render_png`` draws it once, and one renderer measures its text."""
    fig = Figure(figsize=(width_in, height_in), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def tight_layout_afresh(fig: Figure) -> None:
    """``fig.tight_layout()`` from the default subplot positions, so a figure kept and redrawn
    with new contents is laid out exactly as a new figure with them would be (tight_layout
    started from its last layout can choose other ticks, and so other margins)."""
    fig.subplots_adjust(**{side: mpl.rcParams[f"figure.subplot.{side}"]
                           for side in ("left", "bottom", "right", "top", "wspace", "hspace")})
    fig.tight_layout()


def render_png(fig: Figure) -> bytes:
    """The figure as PNG bytes, cropped to what is drawn plus savefig's padding (as the inline
    backend's ``bbox_inches="tight"`` does). A figure on an Agg canvas is drawn once, at its own
    size, and the crop cut from that picture; the rest go through ``savefig``, which lays the
    figure out, measures it and draws it again on a second renderer."""
    buffer = io.BytesIO()
    with DRAW_LOCK:
        pixels = _drawn_and_cropped(fig)
        if pixels is None:
            fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
        else:
            imsave(buffer, pixels, format="png", dpi=DPI)
    return buffer.getvalue()


def _drawn_and_cropped(fig: Figure) -> np.ndarray | None:
    """What ``savefig(bbox_inches="tight")`` would save, as RGBA rows, from one draw on the figure's
    own canvas; None when only savefig can make it: a canvas that is not Agg, another resolution,
    savefig's colours set apart from the figure's, a see-through or edged background, or
    anything drawn past the figure's edges (savefig grows the picture to show it)."""
    canvas = fig.canvas
    plain_save = (mpl.rcParams["savefig.facecolor"] == "auto" and mpl.rcParams["savefig.edgecolor"] == "auto"
                  and not mpl.rcParams["savefig.transparent"])
    background = fig.patch.get_facecolor()
    if not (isinstance(canvas, FigureCanvasAgg) and fig.dpi == DPI and plain_save and background[3] == 1
            and fig.patch.get_linewidth() == 0):
        return None
    FigureCanvasAgg.draw(canvas)  # Agg's own draw, as savefig's print_png calls it: no subclass's extras
    drawn = fig.get_tightbbox(canvas.get_renderer())
    if drawn.x0 < 0 or drawn.y0 < 0 or drawn.x1 > fig.bbox_inches.x1 or drawn.y1 > fig.bbox_inches.y1:
        return None
    box = drawn.padded(mpl.rcParams["savefig.pad_inches"])
    picture = np.asarray(canvas.buffer_rgba())
    left, top = round(box.x0 * DPI), round(picture.shape[0] - box.y1 * DPI)  # rows run top down
    width, height = (int(size * DPI + 1e-8) for size in box.size)  # rounded down as savefig's canvas does
    cropped = np.empty((height, width, 4), np.uint8)
    cropped[:] = np.round(np.array(background) * 255)  # padding beyond the figure: its background, as in savefig
    rows = slice(max(top, 0), min(top + height, picture.shape[0]))
    cols = slice(max(left, 0), min(left + width, picture.shape[1]))
    cropped[rows.start - top:rows.stop - top, cols.start - left:cols.stop - left] = picture[rows, cols]
    return cropped


class FigurePane(w.Image):
    """``show(fig)`` replaces the picture with ``fig``; ``redraw(draw)`` draws and shows under the lock.

    Invariants: the pane only ever holds a PNG (its value is widget state, so it shows in the
    widget wherever the callback runs); a figure made by pyplot is closed once shown, so none
    pile up; with ``redraw``, the last redraw to finish read the widgets' latest values. A widget
    may keep one figure and change it in ``draw`` (its axes and ticks are then made once, and
    its text measured once): ``redraw`` calls ``draw`` under the lock, so no two callbacks
    change that figure at the same time.
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(format="png", **kwargs)

    def show(self, fig: Figure) -> None:
        with DRAW_LOCK, cycle_collector_paused():
            png = render_png(fig)
            plt.close(fig)  # a pyplot figure leaves pyplot's registry; a new_figure() one is unaffected
            self.layout.width = f"{int.from_bytes(png[16:20], 'big')}px"  # PNG header: width; shown 1:1, not stretched
            self.value = png

    def redraw(self, draw: Callable[[], Figure]) -> None:
        """Call ``draw()`` (which reads the widgets and returns a figure) and show its figure, all
        under ``DRAW_LOCK``: of two concurrent redraws the later one reads the later values.

        Drawing and showing run with Python's cycle collector paused: a redraw makes tens of
        thousands of short-lived objects, and collections in the middle of it would move many
        into the oldest generation, whose full collection (0.1-0.2 s in a kernel that has
        imported torch) would then land in some later handler. Paused, they are freed as they go
        or collected young right after; nothing is skipped."""
        with DRAW_LOCK, cycle_collector_paused():
            self.show(draw())
