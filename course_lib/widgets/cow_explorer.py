"""Parallel sampling on copy-on-write block tables: sliders for the shape, a picture of the tables."""

from __future__ import annotations

import ipywidgets as w

from course_lib.paging.block_table import (
    parallel_sampling_report,
    run_parallel_sampling,
)
from course_lib.widgets.figure_pane import FigurePane, new_figure, one_at_a_time
from course_lib.widgets.memory_map import draw_block_tables


class CopyOnWriteExplorer(w.VBox):
    """n samples of one prompt share its blocks; each sample's new tokens go to private blocks."""

    def __init__(self, prompt_len: int = 40, num_samples: int = 4, output_len: int = 12, block_size: int = 16) -> None:
        self.prompt_len = w.IntSlider(description="prompt", min=1, max=128, value=prompt_len)
        self.num_samples = w.IntSlider(description="samples", min=1, max=8, value=num_samples)
        self.output_len = w.IntSlider(description="new tokens", min=1, max=64, value=output_len)
        self.block_size = w.Dropdown(description="block size", options=[4, 8, 16], value=block_size)
        self.readout = w.HTML()
        self.figure = FigurePane()
        controls = [self.prompt_len, self.num_samples, self.output_len, self.block_size]
        for control in controls:
            control.observe(lambda _: self.refresh(), "value")
        super().__init__([w.HBox([w.VBox(controls), self.readout]), self.figure])
        self.refresh()

    @one_at_a_time
    def refresh(self) -> None:
        shape = (self.prompt_len.value, self.num_samples.value, self.output_len.value, self.block_size.value)
        report = parallel_sampling_report(*shape)
        self.readout.value = (
            f"<div style='padding-left:2em'>Blocks held with sharing: <b>{report.shared_blocks}</b><br>"
            f"Blocks if every sample copied the prompt: <b>{report.unshared_blocks}</b><br>"
            f"Saved: <b>{report.saved_fraction:.0%}</b> &nbsp; copy-on-write copies: {report.copy_on_writes}</div>"
        )

        def draw():
            fig = new_figure(9, 0.9 + 0.42 * self.num_samples.value)  # one sample's row still has room for its ids
            draw_block_tables(fig.subplots(), run_parallel_sampling(*shape))
            fig.tight_layout()
            return fig

        self.figure.redraw(draw)
