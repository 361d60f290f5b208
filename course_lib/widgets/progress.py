"""A progress bar for long runs, fed by the ``on_step`` callbacks of the systems code."""

from __future__ import annotations

from typing import Callable

import ipywidgets as w
from IPython.display import display


def progress_bar(total: int, description: str) -> Callable[[int], None]:
    """Show a bar for ``total`` steps and return the callback that advances it (step is 0-based)."""
    bar = w.IntProgress(min=0, max=total, description=description, style={"description_width": "10em"})
    display(bar)
    every = max(1, total // 100)  # redraw about 100 times, however long the run

    def advance(step: int) -> None:
        if (step + 1) % every == 0 or step + 1 == total:
            bar.value = step + 1
            bar.bar_style = "success" if step + 1 == total else ""

    return advance
