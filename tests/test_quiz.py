import json

import pytest
import yaml

from course_lib.paths import QUIZ_DIR
from course_lib.quiz.bank import QuizFileError, load_bank, parse_bank
from course_lib.quiz.scorecard import Scorecard
from course_lib.quiz.text import render_text
from course_lib.widgets.quiz import UNCHOSEN, QuizWidget, show_quiz

SAMPLE = {
    "title": "Sample",
    "questions": [
        {"id": "one", "kind": "single", "prompt": "Pick B.", "options": [
            {"text": "A", "why": "A is wrong."}, {"text": "B", "correct": True, "why": "B is right."}]},
        {"id": "many", "kind": "multi", "prompt": "Pick A and C.", "options": [
            {"text": "A", "correct": True, "why": "A yes."}, {"text": "B", "why": "B no."},
            {"text": "C", "correct": True, "why": "C yes."}]},
        {"id": "num", "kind": "numeric", "prompt": "KV bytes?", "answer": 131072, "tolerance": 0.01,
         "unit": "bytes", "explanation": "2 x 32 x 8 x 128 x 2."},
        {"id": "match", "kind": "matching", "prompt": "Match.", "pairs": [
            {"left": "Page", "right": "Block"}, {"left": "Page table", "right": "Block table"}]},
        {"id": "bug", "kind": "spot_the_bug", "prompt": "Find it.", "code": "a = 1\nb = 0.3\nc = 2\n",
         "bug_line": 2, "line_hints": {1: "a is fine."}, "explanation": "b is too low."},
    ],
}


@pytest.fixture
def bank():
    return parse_bank(SAMPLE, "sample.yaml")


def test_every_kind_is_checked_with_explanations(bank):
    card = Scorecard(bank)
    assert not card.answer("one", 0).correct
    feedback = card.answer("one", 1)
    assert feedback.correct and "B is right." in feedback.message
    assert card.answer("many", {0, 2}).correct
    wrong = card.answer("many", {0, 1})
    assert not wrong.correct and "B no." in wrong.message and "C yes." in wrong.message
    assert card.answer("num", 131072 * 1.005).correct
    assert not card.answer("num", 65536).correct
    assert card.answer("match", {"Page": "Block", "Page table": "Block table"}).correct
    assert not card.answer("match", {"Page": "Block table", "Page table": "Block"}).correct
    hint = card.answer("bug", 1)
    assert not hint.correct and "a is fine." in hint.message
    assert card.answer("bug", 2).correct


def test_scorecard_keeps_latest_answer_and_attempts_and_exports(bank, tmp_path):
    card = Scorecard(bank)
    card.answer("one", 0)
    card.answer("one", 1)
    card.answer("num", 1)
    assert card.score == 1 and card.total == 5
    assert card.records["one"].attempts == 2
    assert card.summary() == "Sample: 1/5 correct, 3 unanswered."
    data = json.loads(card.export(tmp_path / "answers.json").read_text())
    assert data["score"] == 1 and data["total"] == 5 and data["learner"] is None
    assert {a["question_id"]: a["correct"] for a in data["answers"]} == {"one": True, "num": False}


def test_out_of_range_answers_are_refused(bank):
    card = Scorecard(bank)
    with pytest.raises(ValueError, match="index"):
        card.answer("one", 5)
    with pytest.raises(ValueError, match="between 1 and 3"):
        card.answer("bug", 9)
    with pytest.raises(ValueError, match="Match every item"):
        card.answer("match", {"Page": "Block"})
    with pytest.raises(KeyError, match="No question"):
        card.answer("missing", 1)


def test_widget_is_driven_like_a_learner(bank):
    quiz = QuizWidget(bank, learner="ada")
    one = quiz.cards["one"]
    one.check_button.click()
    assert "Pick an answer first" in one.feedback.value and quiz.scorecard.records == {}
    one.control.value = 1
    one.check_button.click()
    assert "✓" in one.feedback.value and "B is right." in one.feedback.value

    many = quiz.cards["many"]  # boxes are in this learner's order; tick bank options 0 and 2
    many.control.children[many.order.index(0)].value = True
    many.control.children[many.order.index(2)].value = True
    many.check_button.click()
    assert "✓" in many.feedback.value

    num = quiz.cards["num"]
    num.control.children[0].value = 1000
    num.check_button.click()
    assert "✗" in num.feedback.value and "131072 bytes" in num.feedback.value

    match = quiz.cards["match"]
    assert match.control.children[0].children[1].value == UNCHOSEN
    match.control.children[0].children[1].value = "Block"
    match.control.children[1].children[1].value = "Block table"
    match.check_button.click()
    assert "✓" in match.feedback.value

    bug = quiz.cards["bug"]
    assert len(bug.line_buttons) == 3
    bug.line_buttons[0].click()
    assert "✗" in bug.feedback.value
    bug.line_buttons[1].click()
    assert "✓" in bug.feedback.value and "b is too low." in bug.feedback.value

    assert quiz.scorecard.score == 4
    assert "4/5 correct" in quiz.score_label.value


def test_plain_text_rendering_lists_every_question(bank):
    text = render_text(bank)
    for fragment in ("1. [single] Pick B.", "b) B", "Answer in bytes.", "- Page table", " 2 | b = 0.3"):
        assert fragment in text
    assert "Answer:" not in text
    assert "Answer: line 2: b = 0.3" in render_text(bank, show_answers=True)
    assert QuizWidget(bank, learner="ada")._repr_mimebundle_()["text/plain"] == render_text(bank, learner="ada")


@pytest.mark.parametrize("path", sorted(QUIZ_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_course_quiz_banks_load(path):
    bank = load_bank(path)
    assert len(bank.questions) >= 5
    card = Scorecard(bank)
    for q in bank.questions:  # each bank's stated answer is accepted by its own checker
        answer = {"single": lambda: next(i for i, o in enumerate(q.options) if o.correct),
                  "multi": lambda: {i for i, o in enumerate(q.options) if o.correct},
                  "numeric": lambda: q.answer,
                  "matching": lambda: dict(q.pairs),
                  "spot_the_bug": lambda: q.bug_line}[q.kind]()
        assert card.answer(q.id, answer).correct
    assert card.score == card.total


def test_show_quiz_finds_a_bank_by_name():
    assert show_quiz("01_paging").bank.source == "01_paging.yaml"
    with pytest.raises(FileNotFoundError, match="No quiz file"):
        show_quiz("99_nothing")


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.pop("title"), "sample.yaml: missing field 'title'"),
        (lambda d: d["questions"][0].update(kind="essay"), "question 'one': unknown kind 'essay'"),
        (lambda d: d["questions"][0]["options"][0].update(correct=True), "exactly one option"),
        (lambda d: d["questions"][1]["options"][0].pop("why"), "question 'many', option 1: missing field 'why'"),
        (lambda d: d["questions"][2].update(answer="lots"), "question 'num': field 'answer' must be a number"),
        (lambda d: d["questions"][2].update(tolerance=3), "tolerance is relative"),
        (lambda d: d["questions"][3].update(pairs=[{"left": "x", "right": "y"}]), "at least two pairs"),
        (lambda d: d["questions"][3]["pairs"][0].update({"more text": None}),
         "question 'match', pair 1: unexpected field 'more text'.*quote a text that holds a comma"),
        (lambda d: d["questions"][4].update(bug_line=7), "question 'bug': bug_line must be between 1 and 3"),
        (lambda d: d["questions"][4].update(id="one"), "question 'one': this id is used twice"),
        (lambda d: d["questions"][0].pop("prompt"), "question 'one': missing field 'prompt'"),
    ],
)
def test_malformed_banks_name_file_and_question(mutate, message):
    data = yaml.safe_load(yaml.safe_dump(SAMPLE))
    mutate(data)
    with pytest.raises(QuizFileError, match=message.replace("(", r"\(")):
        parse_bank(data, "sample.yaml")


def test_invalid_yaml_file_is_reported_with_its_name(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("title: [unclosed\n")
    with pytest.raises(QuizFileError, match="broken.yaml: not valid YAML"):
        load_bank(broken)
