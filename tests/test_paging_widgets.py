"""Lesson 01's widgets as a learner's browser shows them: what the front end sends back, the words
and units of the readouts, and text that stays inside its boxes."""

import matplotlib
import pytest

from course_lib.perf.models import MODELS
from course_lib.widgets.cow_explorer import CopyOnWriteExplorer
from course_lib.widgets.figure_pane import new_figure
from course_lib.widgets.kv_calculator import KVCalculator
from course_lib.widgets.memory_map import draw_block_reads
from course_lib.widgets.memory_plan import MemoryPlanExplorer

matplotlib.use("Agg")


class SliderInBrowser:
    """What a browser does with a selection slider's state messages: it applies each message as it
    comes and, like the slider it draws, moves an index left beyond the options onto the last one
    and sends that index back to the kernel as the learner's choice."""

    def __init__(self, slider) -> None:
        self.slider, self.state, self.replies = slider, slider.get_state(), []
        slider._send = self.receive

    def receive(self, msg, buffers=None) -> None:
        self.state.update(msg["state"])
        last = len(self.state["_options_labels"]) - 1
        if self.state["index"] is not None and self.state["index"] > last:
            self.state["index"] = last
            self.replies.append(last)

    def send_back(self) -> None:
        for index in self.replies:
            self.slider.set_state({"index": index})
        self.replies.clear()


@pytest.mark.parametrize("start", ["Llama-3-8B", "Llama-2-7B", "Mixtral-8x7B", "Qwen2.5-7B"])
def test_a_browser_cannot_turn_falcons_one_kv_head_into_71(start):
    calc = KVCalculator(start)
    browser = SliderInBrowser(calc.kv_heads)
    calc.preset.value = "Falcon-7B"  # options (1, 2, 4, 8, 16, 32) become (1, 71)
    browser.send_back()
    assert calc.kv_heads.value == 1 and browser.state["index"] == 0
    assert "x 1 KV head x 64 x 2 B" in calc.readout.value and "8,192 B = 8.0 KiB per token" in calc.readout.value
    calc.preset.value = "Llama-2-7B"
    browser.send_back()
    assert calc.kv_heads.value == 32


def test_kv_readout_and_figure_speak_in_whole_words():
    calc = KVCalculator("Llama-3-8B")
    calc.layers.value, calc.kv_heads.value, calc.batch.value, calc.context.value = 1, 1, 1, 512
    readout = calc.readout.value
    assert "2 x 1 layer x 1 KV head x 128" in readout and "x 1 sequence =" in readout
    assert "= <b>512 B per token" in readout  # not "512 B = 512 B"
    ax = calc.plot.axes[0]
    assert ax.get_title().startswith("KV cache of 1 sequence vs")
    labels = [line.get_label() for line in ax.get_lines()]
    assert "chosen: 1 KV head" in labels and "80 GiB: one H100's memory" in labels
    assert not ax.texts  # the H100 line is named in the legend, never by text the frame can cut


def test_memory_plan_refuses_a_max_model_len_beyond_the_models_context():
    for model in ("Falcon-7B", "Llama-2-7B"):
        plan = MemoryPlanExplorer(gpu="H100-80GB", model=model, gpu_memory_utilization=0.9, max_model_len=131072)
        context = MODELS[model].max_context
        assert "Server refuses to start" in plan.verdict.value and "Server starts" not in plan.verdict.value
        assert f"set max_model_len to {context} or less" in plan.verdict.value
        assert f"above the model's {context:,} tokens" in plan.draw().axes[0].get_title()
        plan.max_model_len.value = context
        assert "Server starts" in plan.verdict.value


def test_memory_plan_title_gives_the_kv_of_one_request_in_a_unit_that_fits():
    plan = MemoryPlanExplorer(gpu="H100-80GB", model="Llama-3.1-8B", max_model_len=2048)
    assert plan.draw().axes[0].get_title().endswith("one 2,048-token request needs 256 MiB of KV")
    plan.max_model_len.value = 131072
    assert plan.draw().axes[0].get_title().endswith("needs 16 GiB of KV")


def test_memory_plan_at_the_highest_utilization_says_what_is_missing_and_only_fixes_that_work():
    plan = MemoryPlanExplorer(gpu="H100-80GB", model="Llama-3.1-70B", gpu_memory_utilization=0.98)
    verdict = plan.verdict.value
    assert "54.1 GiB more than it may use" in verdict and "-54.1" not in verdict and "leaving -" not in verdict
    assert "raise gpu_memory_utilization" not in verdict and "Not even gpu_memory_utilization=1.0" in verdict
    size = int(verdict.split("use tensor_parallel_size=")[1][0])
    plan.tensor_parallel.value = size
    assert "Server starts" in plan.verdict.value


def cell_texts_inside_their_cells(fig):
    """Each block id's drawn text lies inside its cell, and no two tick labels overlap."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    cells = ax.collections[0]
    boxes = [path.get_extents(cells.get_transform()) for path in cells.get_paths()]
    for text, box in zip(ax.texts, boxes):
        inside = text.get_window_extent(renderer)
        assert box.x0 <= inside.x0 and inside.x1 <= box.x1 and box.y0 <= inside.y0 and inside.y1 <= box.y1
        assert text.get_fontsize() >= 5
    ticks = [label.get_window_extent(renderer) for label in ax.get_xticklabels() if label.get_text()]
    assert all(left.x1 < right.x0 for left, right in zip(ticks, ticks[1:]))
    return len(ax.texts), len(boxes)


@pytest.mark.parametrize("shape", [(125, 8, 64, 4), (128, 1, 64, 4), (40, 4, 12, 16), (128, 8, 64, 8)])
def test_copy_on_write_block_ids_and_ticks_never_overlap(shape):
    prompt, samples, new_tokens, block_size = shape
    cow = CopyOnWriteExplorer(prompt, samples, new_tokens, block_size)
    drawn = []
    cow.figure.redraw = lambda draw: drawn.append(draw())
    cow.refresh()
    texts, cells = cell_texts_inside_their_cells(drawn[0])
    assert texts == cells  # at every size the lesson allows, each cell shows its physical block id


def test_block_reads_legend_sits_inside_the_figure_above_the_blocks():
    fig = new_figure(9, 2.8)
    ax = fig.subplots()
    draw_block_reads(ax, [[7, 2, 9], [4, 0], [11, 5, 1, 8]], [10, 5, 13], block_size=4, num_blocks=12)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legend, frame = ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer)
    blocks_top = ax.transData.transform((0, 0.9))[1]
    assert frame.x0 <= legend.x0 and legend.x1 <= frame.x1 and blocks_top < legend.y0 and legend.y1 <= frame.y1
    assert [t.get_text() for t in ax.get_legend().get_texts()][1] == "sequence 1: 5 tokens"
