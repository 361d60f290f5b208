"""The lesson widgets (explorers, charts, timelines), driven the way a learner drives them."""

import matplotlib
import pytest

from course_lib.widgets.allocator_explorer import AllocatorExplorer
from course_lib.widgets.cow_explorer import CopyOnWriteExplorer
from course_lib.widgets.kv_calculator import KVCalculator
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
    from course_lib.widgets.timeline import plot_slot_timeline, slot_occupancy

    steps = [{"a": 3, "b": 2}, {"a": 1, "b": 1}, {"b": 1, "c": 4}, {"c": 1}]
    assert slot_occupancy(steps, 2) == [["a", "b"], ["a", "b"], ["c", "b"], ["c", None]]
    fig, ax = matplotlib.pyplot.subplots()
    assert plot_slot_timeline(ax, steps, 2, "demo") == pytest.approx(1 / 8)
    assert ax.get_title() == "demo: 4 steps, 12% of slot-steps idle"
    with pytest.raises(ValueError, match="max_num_seqs"):
        slot_occupancy(steps, 1)
