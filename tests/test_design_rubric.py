"""Module 04's design checklist: every move explained, whatever the learner ticks."""

from course_lib.widgets.design_rubric import MOVES, DesignChecklist, review


def test_the_strong_design_is_all_right_and_every_move_is_explained():
    strong = {i for i, move in enumerate(MOVES) if move.belongs}
    lines, summary = review(strong)
    assert len(lines) == len(MOVES) and all(line.startswith("✔") for line in lines)
    assert summary.startswith(f"{len(MOVES)} of {len(MOVES)}") and "0 good moves left out, 0 pitfalls chosen" in summary
    assert 0 < len(strong) < len(MOVES)  # there are pitfalls to avoid as well as moves to make


def test_pitfalls_and_omissions_are_named():
    pitfall = next(i for i, move in enumerate(MOVES) if not move.belongs)
    lines, summary = review({pitfall})
    assert lines[pitfall].startswith("✘") and "does not belong; you chose it" in lines[pitfall]
    assert "1 pitfall chosen" in summary


def test_the_widget_explains_on_click():
    checklist = DesignChecklist()
    checklist.boxes[0].value = True
    checklist.button.click()
    assert "you chose it" in checklist.feedback.value and checklist.feedback.value.count("<li>") == len(MOVES)


def test_checking_an_empty_design_asks_for_a_choice_and_reveals_nothing():
    """With nothing ticked, the button once showed every move's verdict: the whole key."""
    checklist = DesignChecklist()
    checklist.button.click()
    assert "at least one" in checklist.feedback.value and "<li>" not in checklist.feedback.value
    assert not any(move.why in checklist.feedback.value for move in MOVES)
    checklist.boxes[2].value = True
    checklist.button.click()
    assert checklist.feedback.value.count("<li>") == len(MOVES)


def test_the_throughput_move_says_what_the_lesson_computes():
    """Splitting does not raise capacity, and a lightly loaded workload can finish sooner split (section 4)."""
    move = next(move for move in MOVES if "more throughput" in move.text)
    assert not move.belongs and "saturate" in move.why and "finish sooner split" in move.why
