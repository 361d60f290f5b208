"""Selection sliders never show a readout that looks editable and ignores what is typed: each is shown
through ``with_readout``, its own readout off and a plain label beside it naming the chosen option."""

from __future__ import annotations

import importlib
import pkgutil

import ipywidgets as w
import pytest

import course_lib.widgets
from course_lib.collectives.ddp_timeline import BucketRecord, BucketTimeline
from course_lib.perf.hardware import get_gpu
from course_lib.perf.models import get_model
from course_lib.perf.workloads import document_among_chats
from course_lib.widgets.selection_readout import SELECTION_SLIDERS, with_readout


def test_the_label_follows_the_slider_and_the_slider_takes_no_typing():
    slider = w.SelectionSlider(options=[("1 KiB", 1024), ("2 KiB", 2048)], value=1024)  # ipywidgets' empty-label case
    row = with_readout(slider)
    assert slider.readout is False and row.children == (slider, row.children[1])
    assert row.children[1].value == "1 KiB"
    slider.value = 2048
    assert row.children[1].value == "2 KiB"
    slider.options = [("a", 1), ("b", 2)]
    assert row.children[1].value == "a"


def test_the_label_keeps_clear_of_the_handle_at_the_end():
    """At its last option the handle overhangs the track by half its width: the label starts further off."""
    label = with_readout(w.SelectionSlider(options=["1", "4096"], value="4096")).children[1]
    left = label.layout.margin.split()[3]
    assert left.endswith("px") and int(left[:-2]) >= 12


def test_a_range_slider_shows_both_ends_and_other_controls_pass_through():
    span = w.SelectionRangeSlider(options=["1", "2", "4"], index=(0, 1))
    row = with_readout(span)
    span.index = (1, 2)
    assert row.children[1].value == "2 – 4" and span.readout is False
    dropdown = w.Dropdown(options=[1, 2])
    assert with_readout(dropdown) is dropdown


def _timeline() -> BucketTimeline:
    names = ["0.weight", "0.bias"]
    return BucketTimeline(25.0, [BucketRecord(0, names[::-1], 2000, 0.0055, 0.0085)],
                          {"0.bias": 0.004, "0.weight": 0.005}, 0.009, 0.02, [names[::-1]], names)


def _widgets():
    """One of each widget with a selection slider, built as the lessons build them."""
    from course_lib.widgets.all_reduce_crossover import AllReduceCrossover
    from course_lib.widgets.bucket_timeline import BucketTimelineExplorer
    from course_lib.widgets.budget_explorer import TokenBudgetExplorer
    from course_lib.widgets.comm_roofline_explorer import CommRooflineCalculator
    from course_lib.widgets.crossover import CrossoverExplorer
    from course_lib.widgets.hash_chain_explorer import HashChainExplorer
    from course_lib.widgets.interconnect_picture import InterconnectPicture
    from course_lib.widgets.kv_calculator import KVCalculator
    from course_lib.widgets.memory_plan import MemoryPlanExplorer
    from course_lib.widgets.quant_schemes import QuantSchemes
    from course_lib.widgets.reload_or_recompute import ReloadOrRecomputeExplorer
    from course_lib.widgets.serving_simulations import DisaggregationExplorer

    sweep = [{"bucket_cap_mb": 25.0, "num_buckets": 1, "median_step_s": 0.018, "timeline": _timeline()}]
    workload = document_among_chats(num_chat_users=2, document_tokens=2000, document_at=0.2, follow_up_rate_per_s=1,
                                    duration_s=0.5, chat_output_len=20)
    return {
        "all_reduce_crossover": AllReduceCrossover,
        "bucket_timeline": lambda: BucketTimelineExplorer(sweep, 25.0),
        "budget_explorer": lambda: TokenBudgetExplorer(get_model("Llama-3.1-8B"), get_gpu("H100-80GB"), workload),
        "comm_roofline_explorer": CommRooflineCalculator,
        "crossover": CrossoverExplorer,
        "hash_chain_explorer": lambda: HashChainExplorer({"user 1": "You are a helpful assistant."}, "You are"),
        "interconnect_picture": InterconnectPicture,
        "kv_calculator": KVCalculator,
        "memory_plan": MemoryPlanExplorer,
        "quant_schemes": QuantSchemes,
        "reload_or_recompute": ReloadOrRecomputeExplorer,
        "serving_simulations": lambda: DisaggregationExplorer(document_tokens=8000),
    }


def _modules_with_selection_sliders() -> set[str]:
    found = set()
    for info in pkgutil.iter_modules(course_lib.widgets.__path__):
        source = importlib.util.find_spec(f"course_lib.widgets.{info.name}").loader.get_source(
            f"course_lib.widgets.{info.name}")
        if info.name != "selection_readout" and any(f"w.{kind.__name__}(" in source for kind in SELECTION_SLIDERS):
            found.add(info.name)
    return found


def _rows(widget: w.Widget, parent: w.Widget | None = None):
    """(selection slider, the box it sits in) for every selection slider under ``widget``."""
    if isinstance(widget, SELECTION_SLIDERS):
        yield widget, parent
    for child in getattr(widget, "children", ()):
        yield from _rows(child, widget)


def test_every_widget_module_with_a_selection_slider_is_checked_here():
    assert _modules_with_selection_sliders() == set(_widgets())


@pytest.mark.parametrize("module", sorted(_widgets()))
def test_each_selection_slider_is_shown_with_a_plain_label(module):
    widget = _widgets()[module]()
    rows = list(_rows(widget))
    assert rows, f"{module}: no selection slider found"
    for slider, box in rows:
        assert slider.readout is False, f"{module}: {slider.description} shows ipywidgets' editable readout"
        assert isinstance(box, w.HBox) and box.children[0] is slider and isinstance(box.children[1], w.Label)
        assert box.children[1].value == slider._options_labels[slider.index]
