"""An output area that shows one matplotlib figure at a time, replaced on every redraw."""

from __future__ import annotations

import ipywidgets as w
import matplotlib.pyplot as plt
from IPython.display import clear_output, display


class FigurePane(w.Output):
    """Call ``show(fig)`` to replace the picture; the figure is closed so none pile up."""

    def show(self, fig) -> None:
        with self:
            clear_output(wait=True)
            display(fig)
        plt.close(fig)
