"""Text that must fit a grid of boxes (the blocks of a hash chain, of a block table): a label's font
size and angle inside its box, and how far apart tick labels under the columns must be.

Sizes are read from the axes before the figure's tight layout, which may shrink them a little, so
each fit keeps a margin. Widths use DejaVu Sans (matplotlib's default): a digit, decimal or hex, is
at most 0.68 of the font size wide, a line 1.3 of it high.
"""

from __future__ import annotations

import itertools

CHARACTER_WIDTH, LINE_HEIGHT = 0.68, 1.3  # per point of font size
SMALLEST_LABEL_PT, LARGEST_LABEL_PT = 5.0, 9.0


def _points_per_cell(ax, num_columns: float, num_rows: float) -> tuple[float, float]:
    extent = ax.get_window_extent()
    to_points = 72 / ax.figure.dpi
    return 0.85 * extent.width * to_points / num_columns, 0.85 * extent.height * to_points / num_rows


def label_style(ax, num_columns: float, num_rows: int, characters: int, box_width: float = 1.0,
                box_height: float = 1.0) -> dict | None:
    """Font size and angle (``ax.text`` keywords) at which a ``characters``-long label fits inside a
    box of ``box_width`` x ``box_height`` cells of a ``num_columns`` x ``num_rows`` grid filling the
    axes: across while that gives at least 8 pt (or as much as upright), else turned upright; None
    when no size of ``SMALLEST_LABEL_PT`` or more fits."""
    cell_width, cell_height = _points_per_cell(ax, num_columns, num_rows)
    width, height = cell_width * box_width, cell_height * box_height
    text_length = CHARACTER_WIDTH * characters
    across = min(LARGEST_LABEL_PT, 0.9 * width / text_length, 0.9 * height / LINE_HEIGHT)
    upright = min(LARGEST_LABEL_PT, 0.9 * height / text_length, 0.9 * width / LINE_HEIGHT)
    if max(across, upright) < SMALLEST_LABEL_PT:
        return None
    return {"fontsize": across, "rotation": 0} if across >= min(upright, 8.0) else {"fontsize": upright, "rotation": 90}


def tick_step(ax, num_columns: int, characters: int, fontsize: float = 10.0) -> int:
    """The smallest step of 1, 2, 5, 10, 20, 50, ... at which tick labels of ``characters``
    characters, one under every step-th of ``num_columns`` columns, leave a gap between them."""
    cell_width, _ = _points_per_cell(ax, num_columns, 1)
    needed = CHARACTER_WIDTH * fontsize * characters + 0.5 * fontsize
    for step in (m * 10**e for e in itertools.count() for m in (1, 2, 5)):
        if step * cell_width >= needed or step >= num_columns:
            return step
