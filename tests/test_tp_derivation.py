"""The tensor-parallel MLP derivation: shapes read off real tensors, exact for column-then-row,
an all-reduce needed before GeLU for the wrong order, and a widget that redraws in place."""

import pytest

from course_lib.widgets.tp_derivation import RIGHT, WRONG, TPDerivation, derive, render_step, summary

T, D, F = 4, 8, 32


@pytest.mark.parametrize("n", [2, 4])
def test_column_then_row_shapes_per_rank(n):
    d = derive(RIGHT, n, T, D, F)
    assert len(d.steps) == 7 and len(d.shapes) == n
    for shapes in d.shapes:
        assert shapes == {"X": (T, D), "A_r": (D, F // n), "X A_r": (T, F // n), "GeLU(X A_r)": (T, F // n),
                          "B_r": (F // n, D), "Z_r": (T, D), "Y": (T, D)}
    assert [s.collective for s in d.steps] == [None] * 6 + ["all-reduce"]
    assert d.collectives == (("all-reduce", T * D * 4),)  # float32 activations
    assert d.nonlinearity_error <= 1e-6 and d.output_error <= 1e-6  # exact up to float32 rounding


@pytest.mark.parametrize("n", [2, 4])
def test_wrong_order_needs_a_collective_before_gelu_and_another_after_b(n):
    d = derive(WRONG, n, T, D, F)
    assert len(d.steps) == 7
    for shapes in d.shapes:
        assert shapes == {"X_r": (T, D // n), "A_r": (D // n, F), "P_r = X_r A_r": (T, F), "H = GeLU(sum P_r)": (T, F),
                          "B_r": (F, D // n), "Y_r": (T, D // n), "Y": (T, D)}
    assert [s.collective for s in d.steps] == [None] * 3 + ["all-reduce"] + [None] * 2 + ["all-gather"]
    assert d.collectives == (("all-reduce", T * F * 4), ("all-gather", T * D * 4))  # the middle one is f/d times bigger
    assert len(d.collectives) == 2 and len(derive(RIGHT, n, T, D, F).collectives) == 1
    assert d.nonlinearity_error > 0.1  # GeLU(sum) != sum of GeLUs
    assert d.skipped_error > 0.1 and d.output_error <= 1e-6  # wrong without the middle sum, right with it
    assert f"{d.nonlinearity_error:.2f}" in d.steps[3].note


def test_render_marks_communication_and_hides_later_tensors():
    d = derive(RIGHT, 2, T, D, F)
    first, last = render_step(d, 0), render_step(d, 6)
    assert "Step 1 of 7" in first and "no communication" in first and "&#8644; all-reduce" not in first
    assert first.count(f"{T} x {D}") == 2  # X on each of the 2 ranks, nothing else yet
    assert "Step 7 of 7" in last and last.count("&#8644; all-reduce") == 2  # Y on each rank
    assert f"{d.output_error:.1e}" in last
    text = summary(d, derive(WRONG, 2, T, D, F))
    assert "1 collective</b>" in text and "2 collectives</b>" in text


def test_shape_errors_say_what_to_change():
    with pytest.raises(ValueError, match="ffn = 30 does not divide"):
        derive(RIGHT, 4, T, D, 30)
    with pytest.raises(ValueError, match="order"):
        derive("rows", 2)
    with pytest.raises(ValueError, match="hidden = 6 does not divide by the tensor-parallel size 4"):
        TPDerivation(hidden=6)  # fine for N = 2, so the error must not wait for the N = 4 click


def test_widget_steps_and_redraws_in_place():
    widget = TPDerivation()
    view, totals = widget.view, widget.totals
    assert widget.slider.value == 1 and widget.slider.max == 7 and "Step 1 of 7" in view.value
    widget.forward.click()
    assert widget.slider.value == 2 and "Step 2 of 7" in view.value  # the slider counts as the heading does
    widget.slider.value = 7
    widget.forward.click()  # clamped at the last step
    assert widget.slider.value == 7 and "Step 7 of 7" in view.value and "all-reduce" in view.value
    widget.back.click()
    assert "Step 6 of 7" in view.value
    widget.forward.click()
    widget.num_ranks.value = 4
    assert "rank 3" in view.value and "N = 4" in view.value
    widget.order.value = WRONG
    assert "all-gather" in view.value and "X_r" in view.value
    widget.back.click()
    assert "Step 6 of 7" in view.value
    assert widget.view is view and widget.totals is totals and widget.children[3] is view
    assert widget.derivation() is widget.derivation()  # computed once per (order, N)
