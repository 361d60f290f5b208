"""Batch-slot timelines: the grids of ``engine/batch_slots.py`` (which request holds each of the
``max_num_seqs`` slots at every step) drawn as Gantt charts, idle slots white."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.colors import ListedColormap
from matplotlib.ticker import FuncFormatter

from course_lib.engine.batch_slots import idle_share, slot_occupancy


def plot_slot_timeline(ax, scheduled_per_step: list[dict[str, int]], num_slots: int, title: str):
    """A Gantt chart of batch slots over steps; white cells are idle slots. Returns the idle share."""
    grid = slot_occupancy(scheduled_per_step, num_slots)
    ids = sorted({r for row in grid for r in row if r is not None}, key=lambda r: (len(r), r))
    index = {r: i + 1 for i, r in enumerate(ids)}
    cells = [[index.get(r, 0) if r is not None else 0 for r in row] for row in grid]
    colors = ["white"] + [plt.get_cmap("tab20")(i % 20) for i in range(len(ids))]
    ax.imshow(list(map(list, zip(*cells))), aspect="auto", interpolation="nearest", cmap=ListedColormap(colors),
              vmin=0, vmax=len(colors) - 1, origin="lower")
    idle = idle_share(grid)
    ax.set(xlabel="engine step", ylabel="batch slot", title=f"{title}: {len(grid):,} steps, {idle:.0%} of slot-steps idle")
    ax.set_yticks(range(0, num_slots, max(1, num_slots // 8)))  # at most about 8 labels
    ax.xaxis.set_major_formatter(FuncFormatter(lambda step, _: f"{step:,.0f}"))
    return idle


def plot_slot_timelines(axes, schedules: dict[str, list[dict[str, int]]], num_slots: int,
                        title_suffix: str = "") -> dict[str, float]:
    """One timeline per policy (``schedules``: policy -> scheduled tokens per step), titled "<policy>
    batching<title_suffix>", all on one step scale that the longest run sets, so bars compare by eye.
    Returns each policy's idle share."""
    idle = {policy: plot_slot_timeline(ax, steps, num_slots, f"{policy} batching{title_suffix}")
            for ax, (policy, steps) in zip(axes, schedules.items())}
    longest = max(map(len, schedules.values()))
    for ax, steps in zip(axes, schedules.values()):
        ax.set_xlim(-0.5, longest - 0.5)
        if len(steps) < longest:  # past its last step: grey, so it does not read as idle slots
            ax.axvspan(len(steps) - 0.5, longest - 0.5, color="0.88", lw=0)
            ax.text((len(steps) + longest) / 2, (num_slots - 1) / 2, f"done after {len(steps):,} steps",
                    ha="center", va="center", color="0.35", clip_on=True)
    return idle
