"""Pictures of KV memory: the two allocators' pools and copy-on-write block tables.

Each function draws onto a matplotlib Axes and returns it, so notebooks can place them
side by side; colors follow the request, shades show stored versus held-but-empty slots.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.collections import PolyCollection
from matplotlib.patches import Patch, Rectangle

from course_lib.paging.block_table import CopyOnWriteBlockTables
from course_lib.paging.paged import PagedAllocator
from course_lib.paging.reserve_for_max import ReserveForMaxAllocator
from course_lib.perf.units import plural
from course_lib.widgets.box_labels import label_style, tick_step

STORED_ALPHA, HELD_ALPHA = 0.95, 0.25
BLOCK_WIDTH, BLOCK_HEIGHT = 0.92, 0.85  # a block table's cell, in block and row units
STRANDED = "#d62728"


def _color(req_id: str):
    return plt.get_cmap("tab20")(int("".join(c for c in req_id if c.isdigit()) or 0) % 20)


def draw_reserve_for_max(ax, pool: ReserveForMaxAllocator, rows: int = 8):
    """The pool as ``rows`` strips of contiguous slots: each region's stored tokens solid,
    its reserved-but-empty tail pale, and free slots outside the largest hole red-hatched."""
    row_len = -(-pool.capacity_tokens // rows)
    regions = pool.regions()
    largest = max((r for r in regions if r.owner is None), key=lambda r: r.length, default=None)

    def strip(start: int, length: int, **style) -> None:
        while length > 0:  # a region may wrap onto the next strip
            row, col = divmod(start, row_len)
            run = min(length, row_len - col)
            ax.add_patch(Rectangle((col, rows - 1 - row), run, 0.85, **style))
            start, length = start + run, length - run

    for region in regions:
        if region.owner is None:
            stranded = region is not largest
            strip(region.start, region.length, facecolor="white", edgecolor=STRANDED if stranded else "#888888",
                  hatch="///" if stranded else None, lw=0 if stranded else 0.6)
            continue
        color = _color(region.owner)
        used = pool.lengths[region.owner]
        strip(region.start, used, facecolor=color, alpha=STORED_ALPHA, lw=0)
        strip(region.start + used, region.length - used, facecolor=color, alpha=HELD_ALPHA, lw=0)
        strip(region.start, region.length, facecolor="none", edgecolor="black", lw=0.6)
    ax.set_xlim(0, row_len)
    ax.set_ylim(0, rows)
    ax.set_yticks([rows - 1 - r + 0.42 for r in range(rows)], [f"{r * row_len}" for r in range(rows)])
    ax.set_xlabel("slot within the row (tokens)")
    ax.set_ylabel("row start (token offset)")
    ax.set_title("Reserve-for-max: one contiguous region per request")
    ax.legend(handles=[Patch(color="grey", alpha=STORED_ALPHA, label="stored tokens"),
                       Patch(color="grey", alpha=HELD_ALPHA, label="reserved, empty"),
                       Patch(facecolor="white", edgecolor="#888888", label="free"),
                       Patch(facecolor="white", edgecolor=STRANDED, hatch="///", label="stranded gap")],
              loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=4, fontsize=9, frameon=False)
    return ax


def _add_boxes(ax, boxes: list[tuple[float, float, float, float]], **style) -> None:
    """Rectangles ``(x, y, width, height)`` drawn as one collection (one artist for a whole pool,
    not one per block); ``style`` takes a collection's per-box lists, such as ``facecolors``."""
    corners = [[(x, y), (x + width, y), (x + width, y + height), (x, y + height)] for x, y, width, height in boxes]
    ax.add_collection(PolyCollection(corners, **style), autolim=False)


def _block_ticks(ax, count: int, every: int = 1) -> None:
    """Whole-number block ticks under the middle of each drawn block (blocks span [i, i + BLOCK_WIDTH])."""
    ax.set_xticks([i + BLOCK_WIDTH / 2 for i in range(0, count, every)], [str(i) for i in range(0, count, every)])


def draw_paged(ax, pool: PagedAllocator, columns: int = 32):
    """The pool as a grid of blocks; each block's filled height shows how many of its slots hold tokens."""
    rows = -(-pool.num_blocks // columns)

    def corner(block: int) -> tuple[int, int]:
        row, col = divmod(block, columns)
        return col, rows - 1 - row

    _add_boxes(ax, [(*corner(block), 0.9, 0.9) for block in range(pool.num_blocks)], facecolors="white",
               edgecolors="#bbbbbb", linewidths=0.5)
    held, stored, colors = [], [], []
    for req_id, table in pool.block_tables.items():
        length, color = pool.lengths[req_id], _color(req_id)
        for i, block in enumerate(table):
            filled = min(pool.block_size, length - i * pool.block_size) / pool.block_size
            held.append((*corner(block), 0.9, 0.9))
            stored.append((*corner(block), 0.9, 0.9 * filled))
            colors.append(color[:3])
    _add_boxes(ax, held, facecolors=[(*color, HELD_ALPHA) for color in colors], linewidths=0)
    _add_boxes(ax, stored, facecolors=[(*color, STORED_ALPHA) for color in colors], linewidths=0)
    ax.set_xlim(0, columns)
    ax.set_ylim(0, rows)
    labelled = range(0, rows, 1 if rows <= 10 else 2)  # readable labels: at most about 10
    ax.set_yticks([rows - 1 - r + 0.45 for r in labelled], [str(r * columns) for r in labelled], fontsize=9)
    _block_ticks(ax, columns, every=4)
    ax.set_xlabel(f"block index within the row ({pool.block_size} tokens per block)")
    ax.set_ylabel("first block id of the row")
    ax.set_title("Paged: fixed blocks, on demand, anywhere in the pool")
    return ax


def draw_block_tables(ax, tables: CopyOnWriteBlockTables):
    """One row per sequence, one cell per logical block, labelled with its physical block.
    Orange cells are shared (reference count > 1); blue ones are private; bold ones were copied on write."""
    copied = {new for _, new in tables.copies}
    seqs = list(tables.block_tables)
    width = max((len(t) for t in tables.block_tables.values()), default=1)
    widest = max((len(str(b)) for t in tables.block_tables.values() for b in t), default=1)
    style = label_style(ax, width, len(seqs), widest, BLOCK_WIDTH, BLOCK_HEIGHT)  # ids inside their cells
    cells, faces, edges = [], [], []
    for row, seq in enumerate(seqs):
        y = len(seqs) - 1 - row
        for col, block in enumerate(tables.block_tables[seq]):
            cells.append((col, y, BLOCK_WIDTH, BLOCK_HEIGHT))
            faces.append("#ff9f40" if tables.ref_counts[block] > 1 else "#5b9bd5")
            edges.append(1.8 if block in copied else 0.4)
            if style:
                ax.text(col + BLOCK_WIDTH / 2, y + BLOCK_HEIGHT / 2, str(block), ha="center", va="center",
                        fontweight="bold" if block in copied else "normal", **style)
    _add_boxes(ax, cells, facecolors=faces, edgecolors="black", linewidths=edges)
    ax.set_xlim(0, width)
    _block_ticks(ax, width, every=tick_step(ax, width, len(str(width - 1))))
    ax.set_ylim(0, len(seqs))
    ax.set_yticks([len(seqs) - 1 - r + 0.42 for r in range(len(seqs))], seqs)
    ids = "cell text = physical block id" if style else "cells too narrow to show their physical block ids"
    ax.set_xlabel(f"logical block ({tables.block_size} tokens each); {ids}")
    ax.set_ylabel("sequence")
    ax.set_title("Block tables after parallel sampling (orange = shared, bold edge = copied on write)")
    return ax


def draw_block_reads(ax, block_tables: list[list[int]], seq_lens: list[int], block_size: int, num_blocks: int):
    """The physical block pool as the decode kernel sees it: one program per sequence walks its
    block table, so it reads scattered blocks in logical order (the number in each block)."""
    for block in range(num_blocks):
        ax.add_patch(Rectangle((block, 0), 0.92, 0.9, facecolor="white", edgecolor="#bbbbbb", lw=0.6))
    for seq, (table, length) in enumerate(zip(block_tables, seq_lens)):
        color = plt.get_cmap("tab10")(seq)
        for step, block in enumerate(table[: -(-length // block_size)]):
            filled = min(block_size, length - step * block_size) / block_size
            ax.add_patch(Rectangle((block, 0), 0.92, 0.9 * filled, facecolor=color, alpha=0.85, lw=0))
            ax.text(block + 0.46, 0.45, str(step), ha="center", va="center", fontsize=9, color="black")
        ax.plot([], [], color=color, lw=6, label=f"sequence {seq}: {plural(length, 'token')}")
    ax.set_xlim(0, num_blocks)
    _block_ticks(ax, num_blocks)
    ax.set_ylim(-0.1, 1.3)  # the legend's row above the blocks: inside the frame, clear of them
    ax.set_yticks([])
    ax.set_xlabel(f"physical block id ({block_size} tokens each); number = order the program reads it")
    ax.set_ylabel("KV pool")
    ax.set_title("What each sequence's decode program reads through its block table")
    ax.legend(loc="upper center", ncol=len(block_tables), fontsize=9, frameon=False, borderaxespad=0.2,
              handlelength=1.2, columnspacing=1.2)
    return ax
