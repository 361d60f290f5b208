"""The "N / M answered" counter under every quiz: questions tried at least once, right or wrong."""

import pytest

from course_lib.paths import QUIZ_DIR
from course_lib.quiz.bank import load_bank, parse_bank
from course_lib.quiz.learner import LEARNER_VARIABLE
from course_lib.quiz.scorecard import Scorecard
from course_lib.widgets.quiz import QuizWidget, show_quiz

BANK = parse_bank({"title": "Two", "questions": [
    {"id": "a", "kind": "single", "prompt": "Pick B.", "options": [
        {"text": "A", "why": "No."}, {"text": "B", "correct": True, "why": "Yes."}]},
    {"id": "n", "kind": "numeric", "prompt": "How many?", "answer": 2, "tolerance": {"absolute": 0}, "unit": "GPUs",
     "explanation": "Two."},
]}, "two.yaml")


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv(LEARNER_VARIABLE, raising=False)
    return tmp_path


def test_a_question_counts_as_answered_once_tried_whatever_the_result():
    card = Scorecard(BANK)
    assert (card.answered, card.progress()) == (0, "0 / 2 answered")
    card.answer("a", 0)  # wrong still counts as answered
    assert card.progress() == "1 / 2 answered"
    card.answer("a", 1)  # a retry is not a new question
    assert card.progress() == "1 / 2 answered"
    card.answer("n", 2)
    assert (card.answered, card.progress()) == (2, "2 / 2 answered")


def test_the_widget_shows_the_counter_under_the_last_card_and_updates_it():
    quiz = QuizWidget(BANK, learner="ada")
    children = list(quiz.children)
    assert children.index(quiz.answered_label) == children.index(quiz.cards["n"]) + 1
    assert "0 / 2 answered" in quiz.answered_label.value
    quiz.cards["a"].check_button.click()  # nothing picked: no answer, no count
    assert "0 / 2 answered" in quiz.answered_label.value
    quiz.cards["a"].control.value = 0
    quiz.cards["a"].check_button.click()
    assert "1 / 2 answered" in quiz.answered_label.value
    quiz.cards["n"].control.children[0].value = "2"
    quiz.cards["n"].check_button.click()
    assert "2 / 2 answered" in quiz.answered_label.value


@pytest.mark.parametrize("path", sorted(QUIZ_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_course_quiz_starts_at_zero_of_its_questions(path):
    quiz = show_quiz(path.stem, keep_answers=False)
    assert f"0 / {len(load_bank(path).questions)} answered" in quiz.answered_label.value


def test_the_review_counts_six_and_resumes_its_count():
    quiz = show_quiz("10_review")
    assert "0 / 6 answered" in quiz.answered_label.value
    quiz.cards["paged-attention-win"].control.value = 1
    quiz.cards["paged-attention-win"].check_button.click()
    assert "1 / 6 answered" in show_quiz("10_review").answered_label.value  # the cell run again
