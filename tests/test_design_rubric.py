"""Module 04's design checklist: every move explained, whatever the learner ticks."""

from course_lib.widgets.design_rubric import MOVES, DesignChecklist, review


def test_the_strong_design_is_all_right_and_every_move_is_explained():
    strong = {i for i, move in enumerate(MOVES) if move.belongs}
    lines, summary = review(strong)
    assert len(lines) == len(MOVES) and all(line.startswith("✔") for line in lines)
    assert summary.startswith(f"{len(MOVES)} of {len(MOVES)}") and "0 good move(s) left out, 0 pitfall(s)" in summary
    assert 0 < len(strong) < len(MOVES)  # there are pitfalls to avoid as well as moves to make


def test_pitfalls_and_omissions_are_named():
    pitfall = next(i for i, move in enumerate(MOVES) if not move.belongs)
    lines, summary = review({pitfall})
    assert lines[pitfall].startswith("✘") and "does not belong; you chose it" in lines[pitfall]
    assert "1 pitfall(s) chosen" in summary


def test_the_widget_explains_on_click():
    checklist = DesignChecklist()
    checklist.boxes[0].value = True
    checklist.button.click()
    assert "you chose it" in checklist.feedback.value and checklist.feedback.value.count("<li>") == len(MOVES)
