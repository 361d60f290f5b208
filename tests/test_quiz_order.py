"""Quizzes cannot be passed blind: options are shown in each learner's own order, answers stay in
the bank's terms, and every learner has an id of their own. (That the banks do not give the right
options away by their place, their length or their number is the lint's: test_quiz_bank_lint.py.)"""

import json
from collections import Counter


from course_lib.grading.quizzes import collect_quizzes
from course_lib.paths import QUIZ_DIR
from course_lib.quiz.bank import load_bank, parse_bank
from course_lib.quiz.learner import LEARNER_FILE, LEARNER_VARIABLE, learner_id
from course_lib.quiz.order import display_order
from course_lib.quiz.questions import MultiSelect, SingleChoice
from course_lib.widgets.quiz import UNCHOSEN, QuizWidget, as_html

BANKS = [load_bank(path) for path in sorted(QUIZ_DIR.glob("*.yaml"))]
SINGLES = [q for bank in BANKS for q in bank.questions if isinstance(q, SingleChoice)]
LEARNERS = ["ada", "grace", "alan", "barbara", "edsger"]
MAX_SHARE = 0.40  # of the places learners see, pooled: how often the right option may come first


def _right(q) -> int:
    return next(i for i, o in enumerate(q.options) if o.correct)


def test_display_order_is_a_stable_permutation_that_depends_on_the_learner():
    texts = [f"option {i}" for i in range(6)]
    order = display_order(texts, "q1", "ada")
    assert sorted(order) == list(range(6))
    assert display_order(texts, "q1", "ada") == order  # same learner, same order, every time
    assert len({tuple(display_order(texts, "q1", name)) for name in LEARNERS}) > 1
    assert len({tuple(display_order(texts, qid, "ada")) for qid in ("q1", "q2", "q3", "q4")}) > 1


def test_learner_is_the_course_variable_else_an_id_kept_in_the_home_folder(monkeypatch, tmp_path):
    """In a Docker or JupyterHub image every learner is ``jovyan``: the user name tells no one apart."""
    monkeypatch.setattr("getpass.getuser", lambda: "jovyan")
    monkeypatch.setenv(LEARNER_VARIABLE, "  student-42 ")
    assert learner_id() == "student-42"
    monkeypatch.setenv(LEARNER_VARIABLE, "")
    ids = {}
    for name in ("one", "two"):  # two learners' homes
        (tmp_path / name).mkdir()
        monkeypatch.setenv("HOME", str(tmp_path / name))
        ids[name] = learner_id()
        assert learner_id() == ids[name] == (tmp_path / name / LEARNER_FILE).read_text().strip()  # made once, kept
    assert ids["one"] != ids["two"] and "jovyan" not in ids.values()
    (tmp_path / "two" / LEARNER_FILE).write_text("\n")  # a blank file gets a new id
    assert learner_id() not in ("", ids["two"])


def test_learner_falls_back_to_the_user_name_when_the_home_folder_cannot_be_written(monkeypatch, tmp_path):
    monkeypatch.delenv(LEARNER_VARIABLE, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "no such folder"))
    monkeypatch.setattr("getpass.getuser", lambda: "jo")
    assert learner_id() == "jo"

    def no_user():
        raise OSError("no user name")

    monkeypatch.setattr("getpass.getuser", no_user)
    assert learner_id() == "learner"


def test_the_right_answer_is_shown_in_every_place_and_first_in_a_minority():
    """Pooled over a few learners (one learner's 30 questions vary too much by chance)."""
    places = Counter(q.option_order(name).index(_right(q)) for q in SINGLES for name in LEARNERS)
    total = sum(places.values())
    assert places[0] <= MAX_SHARE * total, places
    assert places[1] >= 0.15 * total and places[2] >= 0.15 * total, places


def test_the_right_answers_place_changes_from_learner_to_learner():
    """Shown in bank order, every learner would see the right option in the same place."""
    moves = [q.id for q in SINGLES if len({q.option_order(name).index(_right(q)) for name in LEARNERS}) > 1]
    assert len(moves) >= 0.8 * len(SINGLES)


def test_every_choice_control_shows_the_learners_order_and_answers_in_bank_terms():
    quiz = QuizWidget(BANKS[0], learner="ada")
    for q in BANKS[0].questions:
        card = quiz.cards[q.id]
        if isinstance(q, SingleChoice):
            assert [value for _, value in card.control.options] == q.option_order("ada") == card.order
            card.control.value = card.order[0]  # what a click on the first radio button sets
            assert card.submit().correct == (card.order[0] == _right(q))
            assert quiz.scorecard.records[q.id].answer == card.order[0]
        elif isinstance(q, MultiSelect):
            card.control.children[0].value = True
            card.submit()
            assert quiz.scorecard.records[q.id].answer == [card.order[0]]
    assert quiz.scorecard.to_dict()["learner"] == "ada"


def test_matching_choices_are_shuffled_and_kept_whole():
    bank = load_bank("02_batching")
    q = bank.question("concept-effect")
    orders = {tuple(q.choice_order(name)) for name in LEARNERS}
    assert len(orders) > 1 and all(sorted(order) == q.choices for order in orders)
    row = QuizWidget(bank, learner="ada").cards[q.id].control.children[0]
    dropdown = row.children[1]
    assert [value for _, value in dropdown.options] == [UNCHOSEN, *q.choice_order("ada")]
    assert dropdown.layout.width == "max-content" and row.layout.flex_flow == "row wrap"


def test_inline_code_renders_as_code_and_everything_else_stays_escaped():
    assert as_html("call `f(a<b)` & <i>x</i>") == "call <code>f(a&lt;b)</code> &amp; &lt;i&gt;x&lt;/i&gt;"
    bank = parse_bank({"title": "T", "questions": [
        {"id": "q", "kind": "single", "prompt": "When may you read `grad`?", "options": [
            {"text": "After `work.wait()`", "correct": True, "why": "`wait` orders it."},
            {"text": "At once", "why": "No."}]}]}, "t.yaml")
    card = QuizWidget(bank, learner="ada").cards["q"]
    assert "<code>grad</code>" in card.children[0].value
    assert "After work.wait()" in [label for label, _ in card.control.options]  # radio labels are plain text
    card.control.value = 0
    card.submit()
    assert "<code>wait</code> orders it." in card.feedback.value


def test_a_shuffled_quiz_exports_a_scorecard_the_gradebook_reads(tmp_path):
    """Every learner clicks the first option shown, then retries with the right one; the gradebook
    counts first-try misses from the bank's answers, so the retries change nothing."""
    bank = load_bank("03_scheduler")
    for name in LEARNERS:
        quiz = QuizWidget(bank, learner=name)
        for card in quiz.cards.values():
            if isinstance(card.question, SingleChoice):
                for choice in (card.order[0], _right(card.question)):
                    card.control.value = choice
                    card.submit()
        (tmp_path / name).mkdir()
        quiz.scorecard.export(tmp_path / name / "quiz_03.json")
        assert json.loads((tmp_path / name / "quiz_03.json").read_text())["learner"] == name
    missed = {row.question_id: row.missed for row in collect_quizzes(tmp_path).misses}
    for q in bank.questions:
        expected = len(LEARNERS) if not isinstance(q, SingleChoice) else sum(
            q.option_order(name)[0] != _right(q) for name in LEARNERS)
        assert missed[q.id] == expected
