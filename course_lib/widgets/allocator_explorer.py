"""Add requests and generate tokens on both allocators at once, and watch their memory maps."""

from __future__ import annotations

import ipywidgets as w

from course_lib.paging.paged import PagedAllocator
from course_lib.paging.reserve_for_max import ReserveForMaxAllocator
from course_lib.paging.simulate import TraceReplay
from course_lib.paging.trace import sample_chat_trace
from course_lib.widgets.figure_pane import FigurePane, new_figure, one_at_a_time, tight_layout_afresh
from course_lib.widgets.memory_map import draw_paged, draw_reserve_for_max


class AllocatorExplorer(w.VBox):
    """Two pools of the same size fed the same requests: reserve-for-max and paged.

    "Add request" queues the trace's next request on both and admits what fits;
    "Generate" runs decode steps on both (finished requests free their memory).
    One figure is kept and redrawn (under the drawing lock): its axes and ticks are made once,
    and far fewer objects are left for the garbage collector on each click.
    """

    def __init__(self, capacity_tokens: int = 8192, max_model_len: int = 2048, block_size: int = 16,
                 tokens_per_click: int = 32, seed: int = 0) -> None:
        self.capacity_tokens, self.max_model_len, self.block_size = capacity_tokens, max_model_len, block_size
        self.trace = sample_chat_trace(500, max_model_len, seed)
        self.add_button = w.Button(description="Add request", icon="plus", layout=w.Layout(width="auto"))
        self.add_many_button = w.Button(description="Add 5 requests", icon="plus", layout=w.Layout(width="auto"))
        self.step_button = w.Button(description=f"Generate {tokens_per_click} tokens", icon="play", layout=w.Layout(width="auto"))
        self.reset_button = w.Button(description="Reset", icon="undo", layout=w.Layout(width="auto"))
        self.add_button.on_click(lambda _: self.add_requests(1))
        self.add_many_button.on_click(lambda _: self.add_requests(5))
        self.step_button.on_click(lambda _: self.generate(tokens_per_click))
        self.reset_button.on_click(lambda _: self.reset())
        self.stats = w.HTML()
        self.figure = FigurePane()
        self.plot = new_figure(12, 3.8)
        self.plot.subplots(1, 2)
        buttons = w.HBox([self.add_button, self.add_many_button, self.step_button, self.reset_button])
        super().__init__([buttons, self.stats, self.figure])
        self.reset()

    @one_at_a_time
    def reset(self) -> None:
        self.replays = {
            "reserve-for-max": TraceReplay(ReserveForMaxAllocator(self.capacity_tokens, self.max_model_len)),
            "paged": TraceReplay(PagedAllocator(self.capacity_tokens // self.block_size, self.block_size,
                                                self.max_model_len)),
        }
        self.submitted = 0
        self.refresh()

    @one_at_a_time
    def add_requests(self, count: int) -> None:
        for request in self.trace[self.submitted:self.submitted + count]:
            for replay in self.replays.values():
                replay.submit(request)
                replay.admit()
        self.submitted = min(len(self.trace), self.submitted + count)
        self.refresh()

    @one_at_a_time
    def generate(self, steps: int) -> None:
        for replay in self.replays.values():
            for _ in range(steps):
                replay.decode_step()
                replay.admit()
        self.refresh()

    @one_at_a_time
    def refresh(self) -> None:
        rows = []
        for name, replay in self.replays.items():
            r = replay.report()
            rows.append(
                f"<tr><td><b>{name}</b></td><td>{r.num_requests}</td><td>{len(replay.waiting)}</td>"
                f"<td>{replay.finished}</td><td>{r.tokens_stored:,}</td><td>{r.slots_held:,}</td>"
                f"<td>{r.over_reservation:,}</td><td>{r.internal_fragmentation:,}</td>"
                f"<td>{r.external_fragmentation:,}</td><td>{r.waste_fraction:.0%}</td></tr>"
            )
        header = ("<tr><th></th><th>running</th><th>waiting</th><th>finished</th><th>tokens stored</th>"
                  "<th>slots held</th><th>over-reserved</th><th>internal frag.</th><th>external frag.</th>"
                  "<th>waste</th></tr>")
        self.stats.value = f"<table style='border-spacing:10px 2px'>{header}{''.join(rows)}</table>"
        self.figure.redraw(self.draw)

    def draw(self):
        fig = self.plot
        left, right = fig.axes
        for artist in [*left.patches, *left.collections, *right.patches, *right.collections]:
            artist.remove()  # the last picture of the pools; their axes are labelled again, over the same ticks
        draw_reserve_for_max(left, self.replays["reserve-for-max"].allocator)
        draw_paged(right, self.replays["paged"].allocator)
        fig.suptitle(f"Same {self.capacity_tokens:,}-token pool, same requests (colour = request)")
        tight_layout_afresh(fig)
        return fig
