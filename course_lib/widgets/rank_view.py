"""Every rank's tensor before and after a collective, values coloured by the rank they came from."""

from __future__ import annotations

import html

import ipywidgets as w

from course_lib.collectives.launch import run_on_ranks
from course_lib.collectives.primitives import PRIMITIVES, run_primitive

RANK_COLOURS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f"]


SUMMING = {"reduce", "all_reduce", "reduce_scatter"}


def _cells(values: list[float] | None, by_rank: bool) -> str:
    """Boxes for one tensor; ``by_rank`` colours each value by its rank (values are 10r + i)."""
    if values is None:
        return "<i style='color:#888'>not defined on this rank</i>"
    return "".join(
        f"<span style='display:inline-block;min-width:30px;margin:1px;padding:2px 4px;border-radius:3px;color:white;"
        f"background:{RANK_COLOURS[int(v) // 10 % len(RANK_COLOURS)] if by_rank else '#666'};text-align:center'>"
        f"{v:g}</span>" for v in values)


def rank_table(title: str, rows: list[tuple[list[float], list[float] | None]], after_is_sum: bool) -> str:
    """HTML: one line per rank with its tensor before and after. Values are coloured by the rank
    they came from; sums of several ranks (``after_is_sum``) are grey."""
    body = "".join(f"<tr><td><b>rank {rank}</b></td><td>{_cells(before, True)}</td><td>&rarr;</td>"
                   f"<td>{_cells(after, not after_is_sum)}</td></tr>" for rank, (before, after) in enumerate(rows))
    return (f"<div style='font-family:sans-serif;font-size:13px'><b>{title}</b><table>"
            f"<tr><th></th><th>before</th><th></th><th>after</th></tr>{body}</table></div>")


def primitive_table(name: str, world_size: int) -> str:
    """Run primitive ``name`` on real ranks and draw what each rank held before and after."""
    results = run_on_ranks(run_primitive, world_size, name)
    rows = [(before.tolist(), None if after is None else after.tolist()) for before, after in results]
    return rank_table(f"{name} on {world_size} ranks (rank r starts with [10r+1, ..., 10r+{world_size}])", rows,
                      name in SUMMING)


class PrimitiveExplorer(w.VBox):
    """Pick a primitive and a world size; it runs on real ranks and shows every rank's tensor."""

    def __init__(self, primitive: str = "all_reduce", world_size: int = 4) -> None:
        self.primitive = w.ToggleButtons(options=PRIMITIVES, value=primitive, description="primitive")
        self.world_size = w.IntSlider(world_size, 2, 8, description="ranks", continuous_update=False)
        self.view = w.HTML()
        for control in (self.primitive, self.world_size):
            control.observe(lambda _: self.refresh(), "value")
        super().__init__([self.primitive, self.world_size, self.view])
        self.refresh()

    def refresh(self) -> None:
        try:
            self.view.value = primitive_table(self.primitive.value, self.world_size.value)
        except Exception as error:  # noqa: BLE001 - show it where the learner is looking
            self.view.value = f"<pre style='color:#cf222e'>{html.escape(f'{type(error).__name__}: {error}')}</pre>"
