"""The lesson widgets (explorers, charts, timelines), driven the way a learner drives them."""

import gc
import io
import threading

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pytest
from PIL import Image

from course_lib.paging.paged import PagedAllocator
from course_lib.perf.kv import kv_bytes_per_token
from course_lib.perf.models import MODELS
from course_lib.perf.units import GiB, plural
from course_lib.widgets.allocator_explorer import AllocatorExplorer
from course_lib.widgets.cow_explorer import CopyOnWriteExplorer
from course_lib.widgets.figure_pane import DPI, FigurePane, new_figure, render_png
from course_lib.widgets.kv_calculator import CONTEXTS, KVCalculator
from course_lib.widgets.memory_map import draw_paged
from course_lib.widgets.memory_plan import MemoryPlanExplorer

matplotlib.use("Agg")



def test_kv_calculator_follows_sliders_and_presets():
    calc = KVCalculator("Llama-3-8B")
    assert "131,072 B = 128.0 KiB per token" in calc.readout.value
    calc.kv_heads.value = 1
    assert "16.0 KiB per token" in calc.readout.value
    calc.dtype.value = "fp8"
    assert "8.0 KiB per token" in calc.readout.value
    calc.preset.value = "Llama-3.1-70B"
    assert calc.layers.value == 80 and calc.kv_heads.value == 8
    fig = calc.draw()
    assert fig.axes[0].get_title() and "GiB" in fig.axes[0].get_ylabel() and "tokens" in fig.axes[0].get_xlabel()


@pytest.mark.parametrize("preset, kinds, choices", [
    ("Llama-3.1-70B", ["MHA, 64 KV heads", "GQA, 8 KV heads", "MQA, 1 KV head"], (1, 2, 4, 8, 16, 32, 64)),
    ("Qwen2.5-7B", ["MHA, 28 KV heads", "GQA, 4 KV heads", "MQA, 1 KV head"], (1, 2, 4, 7, 14, 28)),
    ("Llama-2-7B", ["MHA, 32 KV heads", "GQA, 8 KV heads", "MQA, 1 KV head"], (1, 2, 4, 8, 16, 32)),
    ("Falcon-7B", ["MHA, 71 KV heads", "MQA, 1 KV head"], (1, 71)),  # 71 is prime: no GQA in between
])
def test_kv_calculator_compares_attention_kinds_on_the_presets_own_heads(preset, kinds, choices):
    calc = KVCalculator("Llama-3-8B")
    calc.preset.value = preset
    assert calc.kv_heads.options == choices and calc.kv_heads.value == MODELS[preset].num_kv_heads
    layers, head_dim = calc.layers.value, calc.head_dim.value
    lines = calc.draw().axes[0].get_lines()
    assert [line.get_label() for line in lines[:len(kinds)]] == kinds
    assert lines[len(kinds)].get_label() == f"chosen: {plural(calc.kv_heads.value, 'KV head')}"
    mha = kv_bytes_per_token(layers, choices[-1], head_dim, 2) * 8192 * calc.batch.value / GiB
    assert lines[0].get_ydata()[CONTEXTS.index(8192)] == pytest.approx(mha)
    calc.layers.value = 8  # the curves follow the sliders, the heads stay the preset's
    assert [line.get_label() for line in calc.draw().axes[0].get_lines()[:len(kinds)]] == kinds


def test_figure_pane_holds_a_png_and_closes_pyplot_figures():
    pane = FigurePane()
    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    pane.show(fig)
    assert bytes(pane.value).startswith(b"\x89PNG") and not plt.get_fignums()
    calc = KVCalculator("Llama-3-8B")
    before = calc.figure.value
    calc.preset.value = "Falcon-7B"
    assert calc.figure.value != before and not plt.get_fignums()  # redrawn in place, never through pyplot


def test_figure_pane_redraws_safely_from_several_threads():
    calc = KVCalculator("Llama-3-8B")
    errors = []

    def drag(values):
        try:
            for batch in values:
                calc.batch.value = batch
        except Exception as error:  # noqa: BLE001 - the test reports whatever a thread raised
            errors.append(error)

    threads = [threading.Thread(target=drag, args=(range(start, 40, 3),)) for start in (1, 2, 3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    calc.batch.value = 7  # whatever order the threads finished in, the picture follows the last change
    assert calc.figure.value == render_png(calc.draw())


def _savefig_png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
    return buffer.getvalue()


def _pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)), dtype=float)


def test_render_png_draws_a_figure_once_into_the_picture_savefig_would_save():
    fig = new_figure(5, 3)
    ax = fig.subplots()
    ax.plot([512, 131072], [0.5, 300], label="a line")
    ax.set(xscale="log", yscale="log", title="A log-log figure", xlabel="tokens", ylabel="GiB")
    ax.legend()
    fig.tight_layout()
    draws = []
    fig.canvas.mpl_connect("draw_event", draws.append)
    ours = _pixels(render_png(fig))
    assert len(draws) == 1  # savefig draws twice: once to measure, once more to save the crop
    theirs = _pixels(_savefig_png(fig))
    assert ours.shape == theirs.shape  # the same crop: what is drawn plus savefig's padding
    assert np.abs(ours - theirs).mean() < 1  # the same picture, up to a shift of less than a pixel


def test_render_png_leaves_a_figure_drawn_past_its_edges_to_savefig():
    fig = new_figure(4, 3)
    ax = fig.subplots()
    ax.plot([1, 2], [3, 4], label="a line")
    ax.legend(loc="upper left", bbox_to_anchor=(1.05, 1))  # past the figure's right edge
    png = render_png(fig)
    assert png == _savefig_png(fig) and _pixels(png).shape[1] > 4 * DPI  # savefig widens the picture to show it


def test_a_redraw_runs_with_the_cycle_collector_paused_and_restores_it():
    pane, collecting = FigurePane(), []

    def draw():
        collecting.append(gc.isenabled())
        fig = new_figure(2, 2)
        fig.subplots().plot([1, 2], [3, 4])
        return fig

    pane.redraw(draw)
    assert collecting == [False] and gc.isenabled()


def test_kv_calculator_context_changes_the_readout_and_not_the_curves():
    calc = KVCalculator("Llama-3-8B")
    draws, draw = [], calc.draw
    calc.draw = lambda: draws.append(1) or draw()
    calc.context.value = 131072
    assert "131,072 tokens = <b>16.0 GiB per sequence" in calc.readout.value and not draws
    calc.batch.value = 8
    assert draws == [1]


def test_kept_figures_draw_what_a_new_figure_would():
    calc = KVCalculator("Llama-3-8B")
    for preset in ("Mixtral-8x7B", "Falcon-7B", "Llama-3.1-70B"):
        calc.preset.value = preset
        calc.batch.value, calc.dtype.value, calc.kv_heads.value = 256, "fp32", 1  # other limits, colours, legend
    calc.batch.value, calc.dtype.value = 16, "fp16"
    calc.preset.value = "Qwen2.5-7B"
    assert calc.figure.value == KVCalculator("Qwen2.5-7B").figure.value
    explorer, new = AllocatorExplorer(), AllocatorExplorer()
    for _ in range(6):
        explorer.add_requests(5)
        explorer.generate(64)
    explorer.reset()
    assert explorer.figure.value == new.figure.value
    for pool in (explorer, new):
        pool.add_requests(5)
        pool.generate(32)
    assert explorer.figure.value == new.figure.value


def test_paged_map_draws_the_pool_in_a_few_artists_whatever_its_size():
    artists = []
    for num_blocks in (64, 4096):
        pool = PagedAllocator(num_blocks=num_blocks, block_size=16, max_model_len=512)
        pool.admit("req1", 40, 100)
        fig = new_figure(6, 4)
        ax = draw_paged(fig.subplots(), pool)
        artists.append(len(ax.patches) + len(ax.collections))
        background, held, stored = ax.collections
        assert len(background.get_paths()) == num_blocks and len(held.get_paths()) == 3  # 40 tokens: 3 blocks
        assert [np.ptp(path.vertices[:, 1]) for path in stored.get_paths()] == pytest.approx([0.9, 0.9, 0.9 * 8 / 16])
    assert artists[0] == artists[1]


def test_memory_plan_explains_the_startup_bug_and_its_fixes():
    plan = MemoryPlanExplorer(gpu="A100-40GB", model="Llama-3.1-8B", gpu_memory_utilization=0.30)
    assert "No available memory for the cache blocks" in plan.verdict.value
    plan.gpu.value = "H100-80GB"
    assert "cannot hold one request of max_model_len=131072" in plan.verdict.value
    plan.utilization.value = 0.9
    assert "Server starts" in plan.verdict.value
    plan.utilization.value = 0.05 + 25 * 0.01  # what a browser slider sends back: 0.30000000000000004
    assert "gpu_memory_utilization=0.3," in plan.verdict.value
    plan.tensor_parallel.value = 2
    assert "Server starts" in plan.verdict.value
    assert "GiB" in plan.draw().axes[0].get_xlabel()


def test_allocator_explorer_feeds_both_pools_the_same_requests():
    explorer = AllocatorExplorer(capacity_tokens=8192, max_model_len=2048)
    explorer.add_requests(8)
    reserve, paged = explorer.replays["reserve-for-max"], explorer.replays["paged"]
    assert len(reserve.running) + len(reserve.waiting) == 8 == len(paged.running) + len(paged.waiting)
    assert len(paged.running) > len(reserve.running)  # paging fits more of the same requests
    explorer.generate(64)
    assert reserve.report().waste_fraction > 0.3 > paged.report().waste_fraction
    assert "reserve-for-max" in explorer.stats.value and "waste" in explorer.stats.value
    fig = explorer.draw()
    assert [ax.get_title() for ax in fig.axes][0].startswith("Reserve-for-max")
    explorer.reset_button.click()
    assert explorer.replays["paged"].report().num_requests == 0


def test_copy_on_write_explorer_reports_savings():
    cow = CopyOnWriteExplorer(prompt_len=64, num_samples=4, output_len=16, block_size=16)
    assert "Saved: <b>60%</b>" in cow.readout.value  # 4 shared prompt + 4 output blocks vs 4 x 5
    cow.num_samples.value = 1
    assert "Saved: <b>0%</b>" in cow.readout.value


def test_inside_the_kernel_views():
    from course_lib.kernels import paged_attention
    from course_lib.widgets.charts import plot_decode_bandwidth
    from course_lib.widgets.code_compare import side_by_side
    from course_lib.widgets.memory_map import draw_block_reads

    html = side_by_side(paged_attention._decode_kernel, paged_attention.paged_decode_attention_ref).data
    assert "_decode_kernel" in html and "paged_decode_attention_ref" in html
    fig, ax = matplotlib.pyplot.subplots()
    draw_block_reads(ax, [[3, 0], [1]], [6, 2], block_size=4, num_blocks=4)
    assert [t.get_text() for t in ax.texts] == ["0", "1", "0"]  # each program's reading order
    rows = [{"batch": 64, "context": c, "paged_gb_per_s": 3000.0, "sdpa_gb_per_s": 3500.0} for c in (512, 4096)]
    fig = plot_decode_bandwidth({"rows": rows, "peak_hbm_bytes_per_s": 4.8e12, "device": "NVIDIA H200"})
    line = fig.axes[0].lines[0]
    assert list(line.get_ydata()) == pytest.approx([62.5, 62.5]) and "% of peak" in fig.axes[0].get_ylabel()


def test_slot_timeline_reuses_freed_slots_and_counts_idle_ones():
    from course_lib.engine.batch_slots import slot_occupancy
    from course_lib.widgets.timeline import plot_slot_timeline

    steps = [{"a": 3, "b": 2}, {"a": 1, "b": 1}, {"b": 1, "c": 4}, {"c": 1}]
    assert slot_occupancy(steps, 2) == [["a", "b"], ["a", "b"], ["c", "b"], ["c", None]]
    fig, ax = matplotlib.pyplot.subplots()
    assert plot_slot_timeline(ax, steps, 2, "demo") == pytest.approx(1 / 8)
    assert ax.get_title() == "demo: 4 steps, 12% of slot-steps idle"
    with pytest.raises(ValueError, match="max_num_seqs"):
        slot_occupancy(steps, 1)


def test_slot_timelines_share_one_step_scale_and_print_thousands():
    from course_lib.widgets.timeline import plot_slot_timelines

    long, short = [{"a": 1}] * 1500, [{"a": 1}] * 300
    fig, axes = matplotlib.pyplot.subplots(2, 1)
    idle = plot_slot_timelines(axes, {"static": long, "continuous": short}, 2, ", demo")
    assert idle == {"static": pytest.approx(0.5), "continuous": pytest.approx(0.5)}
    assert axes[0].get_xlim() == axes[1].get_xlim() == (-0.5, 1499.5)
    assert axes[0].get_title() == "static batching, demo: 1,500 steps, 50% of slot-steps idle"
