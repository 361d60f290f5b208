import itertools
import json
import re

import pytest
import yaml

from course_lib.paths import QUIZ_DIR
from course_lib.quiz.bank import QuizFileError, load_bank, parse_bank
from course_lib.quiz.learner import LEARNER_VARIABLE, answers_path
from course_lib.quiz.questions import Matching, MultiSelect, Numeric, SingleChoice
from course_lib.quiz.scorecard import REVEAL_AFTER, Scorecard, first_try_correct
from course_lib.quiz.text import render_text
from course_lib.widgets.quiz import UNCHOSEN, QuizWidget, show_quiz, typed_number

BANKS = [load_bank(path) for path in sorted(QUIZ_DIR.glob("*.yaml"))]

SAMPLE = {
    "title": "Sample",
    "questions": [
        {"id": "one", "kind": "single", "prompt": "Pick B.", "options": [
            {"text": "A", "why": "A is wrong."}, {"text": "B", "correct": True, "why": "B is right."}]},
        {"id": "many", "kind": "multi", "prompt": "Pick A and C.", "options": [
            {"text": "A", "correct": True, "why": "A yes."}, {"text": "B", "why": "B no."},
            {"text": "C", "correct": True, "why": "C yes."}]},
        {"id": "num", "kind": "numeric", "prompt": "KV bytes?", "answer": 131072, "tolerance": {"percent": 1},
         "unit": "bytes", "explanation": "2 x 32 x 8 x 128 x 2."},
        {"id": "match", "kind": "matching", "prompt": "Match.", "pairs": [
            {"left": "Page", "right": "Block"}, {"left": "Page table", "right": "Block table"}]},
        {"id": "bug", "kind": "spot_the_bug", "prompt": "Find it.", "code": "a = 1\nb = 0.3\nc = 2\n",
         "bug_line": 2, "line_hints": {1: "a is fine."}, "explanation": "b is too low."},
    ],
}


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """Every test gets its own empty home folder and no COURSE_LEARNER, so nothing reads or writes
    the real home (learner id, saved answers)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv(LEARNER_VARIABLE, raising=False)
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


@pytest.fixture
def bank():
    return parse_bank(SAMPLE, "sample.yaml")


def test_every_kind_is_checked_with_explanations(bank):
    q = bank.question
    assert not q("one").check(0).correct
    feedback = q("one").check(1)
    assert feedback.correct and "B is right." in feedback.message
    right = q("many").check({0, 2})
    assert right.correct and "A yes." in right.message and "C yes." in right.message
    assert q("num").check(131072 * 1.005).correct and "2 x 32 x 8 x 128 x 2." in q("num").check(131072).message
    assert not q("num").check(65536).correct
    assert q("match").check({"Page": "Block", "Page table": "Block table"}).correct
    assert not q("match").check({"Page": "Block table", "Page table": "Block"}).correct
    hint = q("bug").check(1)
    assert not hint.correct and "a is fine." in hint.message and "b is too low." not in hint.message
    assert q("bug").check(2).correct


def test_a_wrong_try_hears_about_its_own_answer_only(bank):
    q = bank.question
    wrong_pick = q("many").check({0, 1}).message  # A right, B wrong, C missing
    assert "B no." in wrong_pick and "Some right options are missing." in wrong_pick
    assert "A yes." not in wrong_pick and "C yes." not in wrong_pick  # nor which right option is missing
    assert "Every option you picked is right, but some right options are missing." in q("many").check({0}).message
    assert "B no." in q("many").check({0, 1, 2}).message  # all right ones, plus a wrong one
    numeric = q("num").check(65536).message
    assert "too low" in numeric and "131,072" not in numeric and "2 x 32" not in numeric
    assert "too high" in q("num").check(10**6).message
    matching = q("match").check({"Page": "Block table", "Page table": "Block"}).message
    assert "Pairs right: 0 of 2." in matching
    assert "Page -> Block" not in matching and "Block table" not in matching


def test_reveal_adds_the_answer_its_reasons_and_the_explanation(bank):
    q = bank.question
    revealed = q("many").check({0, 1}, reveal=True).message
    assert not q("many").check({0, 1}, reveal=True).correct
    assert "B no." in revealed and "The right answer: A; C." in revealed and "C yes." in revealed
    assert "The right answer: 131,072 bytes." in q("num").check(1, reveal=True).message
    assert "Page -> Block" in q("match").check({"Page": "Block table", "Page table": "Block"}, reveal=True).message
    bug = q("bug").check(1, reveal=True).message
    assert "line 2: b = 0.3" in bug and "b is too low." in bug


def _right_answer(q):
    return {"single": lambda: next(i for i, o in enumerate(q.options) if o.correct),
            "multi": lambda: {i for i, o in enumerate(q.options) if o.correct},
            "numeric": lambda: q.answer,
            "matching": lambda: dict(q.pairs),
            "spot_the_bug": lambda: q.bug_line}[q.kind]()


def _wrong_answers(q):
    """Every wrong answer to a choice or spot-the-bug question; a few for a numeric one; one for a
    matching one."""
    if isinstance(q, SingleChoice):
        return [i for i, o in enumerate(q.options) if not o.correct]
    if isinstance(q, MultiSelect):
        picks = (set(c) for n in range(1, len(q.options) + 1) for c in itertools.combinations(range(len(q.options)), n))
        return [pick for pick in picks if pick != _right_answer(q)]
    if isinstance(q, Numeric):  # far off, each classic wrong value, and the answer in a unit a thousand times off
        return [q.answer * 3 + 1, *(w.value for w in q.wrong), q.answer / 1000, q.answer * 1000]
    if isinstance(q, Matching):
        rights = [right for _, right in q.pairs]
        return [dict(zip((left for left, _ in q.pairs), rights[1:] + rights[:1]))]
    return [line for line in range(1, len(q.lines) + 1) if line != q.bug_line]


@pytest.mark.parametrize("bank", BANKS, ids=lambda b: b.source)
def test_no_wrong_answer_in_the_banks_gives_the_right_one_away(bank):
    """No wrong try's message holds the solution, the explanation or a right option's why (a number
    counts as said only whole: "0.256 MiB" does not say "256 MiB")."""
    for q in bank.questions:
        secrets = [q.solution_text(), q.explanation, *(o.why for o in getattr(q, "options", ()) if o.correct)]
        for answer in _wrong_answers(q):
            feedback = q.check(answer)
            assert not feedback.correct, (q.id, answer)
            said = [s for s in secrets if s and re.search(rf"(?<![\d.]){re.escape(s)}", feedback.message)]
            assert not said, (q.id, answer)


def test_the_score_counts_first_tries_and_every_try_is_kept(bank, tmp_path):
    card = Scorecard(bank)
    card.answer("one", 0)
    card.answer("one", 1)  # solved on the second try: not scored
    card.answer("many", {0, 2})
    card.answer("many", {0})  # a later wrong try does not undo a right first one
    card.answer("num", 1)
    assert (card.score, card.solved, card.total) == (1, 2, 5)
    one = card.records["one"]
    assert (one.attempts, one.first_correct, one.correct, one.solved, one.answer) == (2, False, True, True, 1)
    assert card.summary() == ("Sample: first-try score 1/5 (only each question's first answer counts); "
                              "2/5 solved counting retries, 2 unanswered.")
    data = json.loads(card.export(tmp_path / "answers.json").read_text())
    assert [data[key] for key in ("score", "solved", "total", "learner", "scoring")] == [1, 2, 5, None, "first try"]
    assert {a["question_id"]: a["first_correct"] for a in data["answers"]} == {"one": False, "many": True, "num": False}
    assert data["answers"][0]["tries"] == [{"answer": 0, "correct": False}, {"answer": 1, "correct": True}]
    assert data["answers"][1]["tries"][0] == {"answer": [0, 2], "correct": True}
    assert [first_try_correct(a) for a in data["answers"]] == [False, True, False]


def test_old_scorecards_count_a_right_answer_only_when_it_was_the_only_try():
    assert first_try_correct({"question_id": "q", "correct": True})
    assert first_try_correct({"question_id": "q", "correct": True, "attempts": 1})
    assert not first_try_correct({"question_id": "q", "correct": True, "attempts": 3})
    assert not first_try_correct({"question_id": "q", "correct": False, "attempts": 1})


def test_the_answer_is_revealed_after_a_few_wrong_tries_or_once_solved(bank):
    card = Scorecard(bank)
    for n in range(1, REVEAL_AFTER):
        assert "The right answer" not in card.answer("num", 1).message, n
    assert "The right answer: 131,072 bytes." in card.answer("num", 1).message
    card.answer("many", {0, 2})
    assert "The right answer: A; C." in card.answer("many", {1}).message  # solved before: nothing left to hide
    assert card.score == 1


def test_saved_tries_survive_a_new_scorecard_and_belong_to_one_learner(bank, tmp_path):
    path = tmp_path / "saved" / "sample.json"
    first = Scorecard(bank, "ada", path)
    first.answer("one", 0)
    first.answer("one", 1)
    again = Scorecard(bank, "ada", path)  # the quiz cell run again: no fresh first try
    assert again.records["one"].tries == first.records["one"].tries and again.score == 0
    again.answer("one", 1)
    assert Scorecard(bank, "ada", path).records["one"].attempts == 3
    with pytest.warns(UserWarning, match="for 'ada'"):
        assert Scorecard(bank, "grace", path).records == {}
    path.write_text("{not json")
    with pytest.warns(UserWarning, match="starting afresh"):
        assert Scorecard(bank, "ada", path).records == {}


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
    num.control.children[0].value = "1000"
    num.check_button.click()
    assert "✗" in num.feedback.value and "too low" in num.feedback.value and "131,072" not in num.feedback.value
    num.control.children[0].value = "131,072"
    num.check_button.click()  # right on the second try: shown, not scored
    assert "✓" in num.feedback.value and "Try 2, for practice" in num.feedback.value

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

    assert (quiz.scorecard.score, quiz.scorecard.solved) == (3, 5)  # num and bug were solved on a retry
    assert "first-try score 3/5" in quiz.score_label.value and "Only your first answer" in quiz.children[0].value


def test_an_untouched_number_box_is_neither_judged_nor_recorded(bank):
    quiz = QuizWidget(bank, learner="ada")
    num = quiz.cards["num"]
    assert num.control.children[0].value == ""  # empty, not 0: there is no answer to judge yet
    num.check_button.click()
    assert "Type a number first" in num.feedback.value and quiz.scorecard.records == {}
    for not_a_number in ("128 KiB", "lots", "nan"):
        num.control.children[0].value = not_a_number
        num.check_button.click()
        assert "Type a number alone" in num.feedback.value and quiz.scorecard.records == {}
    assert "0 / 5 answered" in quiz.answered_label.value
    num.control.children[0].value = " 131072 "
    num.check_button.click()  # the first number typed is the scored first try
    assert "✓" in num.feedback.value and quiz.scorecard.records["num"].first_correct


@pytest.mark.parametrize("text, number", [("131072", 131072), ("131,072", 131072), ("1,048,576.5", 1048576.5),
                                          ("-0.5", -0.5), ("6.5e-2", 0.065), ("0", 0), ("", None), ("  ", None)])
def test_typed_numbers(text, number):
    assert typed_number(text) == number


@pytest.mark.parametrize("text", ["1,0", "12,34", "65.5 ms", "inf", "0x10"])
def test_typed_text_that_is_no_number_says_what_to_type(text):
    with pytest.raises(ValueError, match="Type a number alone"):
        typed_number(text)


def test_long_options_wrap_within_the_card(bank):
    """Options are sized to their text but never wider than the card, and the quiz carries the
    style that lets their labels wrap (ipywidgets keeps them on one line at a fixed height);
    code lines fill the card less their margins, without overflowing it."""
    quiz = QuizWidget(bank, learner="ada")
    options = [quiz.cards["one"].control, *quiz.cards["many"].control.children]
    for control in options:
        assert "course-quiz-option" in control._dom_classes
        assert (control.layout.width, control.layout.max_width[:10]) == ("max-content", "calc(100% ")
    style = next(child for child in quiz.children if "<style>" in getattr(child, "value", ""))
    assert style.layout.display == "none"
    for rule in (".course-quiz-option .widget-radio-box label{", "height:auto", "white-space:normal",
                 ".course-quiz-option .widget-label-basic", "white-space:pre-wrap"):
        assert rule in style.value
    assert all(b.layout.width == "auto" and b.layout.align_self == "stretch" for b in quiz.cards["bug"].line_buttons)

def test_plain_text_rendering_lists_every_question(bank):
    text = render_text(bank)
    for fragment in ("1. [single] Pick B.", "b) B", "Answer in bytes.", "- Page table", " 2 | b = 0.3"):
        assert fragment in text
    assert "Answer:" not in text
    assert "Answer: line 2: b = 0.3" in render_text(bank, show_answers=True)
    assert QuizWidget(bank, learner="ada")._repr_mimebundle_()["text/plain"] == render_text(bank, learner="ada")


@pytest.mark.parametrize("bank", BANKS, ids=lambda b: b.source)
def test_course_quiz_banks_load(bank):
    assert len(bank.questions) >= 5
    card = Scorecard(bank)
    for q in bank.questions:  # each bank's stated answer is accepted by its own checker
        assert card.answer(q.id, _right_answer(q)).correct
    assert card.score == card.total


def test_answers_are_kept_per_learner_inside_the_home_folder(home):
    assert answers_path("quizzes/01_paging.yaml", "ada") == home / ".course-quizzes" / "ada" / "01_paging.json"
    assert answers_path("01_paging.yaml", "../../etc").parent.parent == home / ".course-quizzes"


def test_show_quiz_finds_a_bank_by_name_and_picks_up_earlier_tries(home):
    quiz = show_quiz("01_paging")
    assert quiz.bank.source == "01_paging.yaml" and quiz.learner.startswith("learner-")
    card = quiz.cards["kv-bytes-llama3"]
    card.control.children[0].value = "1"
    card.check_button.click()
    again = show_quiz("01_paging")  # the cell run again, or a new session
    assert again.learner == quiz.learner and again.scorecard.records["kv-bytes-llama3"].attempts == 1
    assert "Answered before: 1 try, the first one wrong." in again.cards["kv-bytes-llama3"].feedback.value
    assert list(home.glob(".course-quizzes/learner-*/01_paging.json"))
    assert show_quiz("01_paging", keep_answers=False).scorecard.records == {}
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
        (lambda d: d["questions"][2].update(tolerance=0.5),
         "question 'num': `tolerance: 0.5` does not say whether it is absolute or relative (read as a fraction, "
         "it meant ±50 % = ±65536 bytes); write `tolerance: {absolute: X}` (within X bytes"),
        (lambda d: d["questions"][2].pop("tolerance"), "question 'num': missing field 'tolerance'; write"),
        (lambda d: d["questions"][2].update(tolerance={"relative": 0.01}),
         "question 'num': tolerance must be a mapping with one key, 'absolute' or 'percent'"),
        (lambda d: d["questions"][2].update(tolerance={"percent": 150}), "tolerance percent must be below 100"),
        (lambda d: d["questions"][2].update(tolerance={"absolute": -1}), "tolerance absolute must be a number of at least 0"),
        (lambda d: d["questions"][2].update(wrong=[{"value": 131000, "why": "Rounded."}]),
         "question 'num', wrong value 1: 131000 bytes is accepted as the answer 131072 bytes (within 1 % of the "
         "answer): narrow the tolerance or drop this value"),
        (lambda d: d["questions"][2].update(wrong=[{"value": 65536}]), "question 'num', wrong value 1: missing field 'why'"),
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
    with pytest.raises(QuizFileError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_bank(data, "sample.yaml")


def test_invalid_yaml_file_is_reported_with_its_name(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("title: [unclosed\n")
    with pytest.raises(QuizFileError, match="broken.yaml: not valid YAML"):
        load_bank(broken)
