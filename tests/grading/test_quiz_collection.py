"""collect_quizzes (course_lib/grading/quizzes.py): first-try misses judged again from the stored
answers, and nothing a learner hands in (a hostile file, a link, a hand-edited card) crashes the
collection or changes another learner's counts."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import pytest

from course_lib.grading import quizzes as quiz_collection
from course_lib.grading.quizzes import QuestionMisses, QuizCollection, collect_quizzes, load_banks
from course_lib.quiz.bank import load_bank
from course_lib.quiz.questions import Matching, MultiSelect, Numeric, Question, SingleChoice, SpotTheBug
from course_lib.quiz.scorecard import Scorecard

PAGING = load_bank("01_paging")
IDS = [q.id for q in PAGING.questions]


def right(question: Question) -> Any:
    if isinstance(question, SingleChoice):
        return next(i for i, o in enumerate(question.options) if o.correct)
    if isinstance(question, MultiSelect):
        return {i for i, o in enumerate(question.options) if o.correct}
    if isinstance(question, Numeric):
        return question.answer
    if isinstance(question, Matching):
        return dict(question.pairs)
    if isinstance(question, SpotTheBug):
        return question.bug_line
    raise AssertionError(question.kind)


def wrong(question: Question) -> Any:
    if isinstance(question, SingleChoice):
        return next(i for i, o in enumerate(question.options) if not o.correct)
    if isinstance(question, MultiSelect):
        return {next(i for i, o in enumerate(question.options) if o.correct)}  # right ones missing
    if isinstance(question, Numeric):
        return question.answer * 2
    if isinstance(question, Matching):
        lefts, rights = zip(*question.pairs)
        return dict(zip(lefts, rights[1:] + rights[:1]))
    if isinstance(question, SpotTheBug):
        return 1 if question.bug_line != 1 else 2
    raise AssertionError(question.kind)


def hand_in(folder: Path, tries: dict[str, list[bool]], name: str = "quiz_01.json", bank=PAGING) -> Path:
    """Export a real scorecard: for each question id, one try per flag (True: a right answer)."""
    card = Scorecard(bank, learner=folder.name)
    for question_id, flags in tries.items():
        question = bank.question(question_id)
        for flag in flags:
            card.answer(question_id, right(question) if flag else wrong(question))
    return card.export(folder / name)


def all_right(bank=PAGING) -> dict[str, list[bool]]:
    return {q.id: [True] for q in bank.questions}


def counts(collection: QuizCollection, quiz: str = "01_paging") -> dict[str, tuple[int, int]]:
    return {q.question_id: (q.missed, q.handed_in) for q in collection.misses if q.quiz == quiz}


def expected(handed_in: int, **missed: int) -> dict[str, tuple[int, int]]:
    return {qid: (missed.get(qid.replace("-", "_"), 0), handed_in) for qid in IDS}


@pytest.fixture
def cohort(tmp_path: Path) -> Path:
    """alice answers everything right on the first try; bob misses paged-win."""
    root = tmp_path / "submissions"
    hand_in(root / "alice", all_right())
    hand_in(root / "bob", {**all_right(), "paged-win": [False]})
    return root


def test_honest_counts(tmp_path: Path):
    root = tmp_path / "submissions"
    hand_in(root / "alice", all_right())
    # bob: two wrong first answers, one question left unanswered
    bob = {**all_right(), "paged-win": [False], "os-analogy": [False]}
    del bob["gqa-follow-up"]
    hand_in(root / "bob", bob)
    # carol: right only on the second try, which never undoes the first miss
    hand_in(root / "carol", {**all_right(), "reserve-waste-kinds": [False, True], "kv-mha": [False, False, True]})
    scheduler = load_bank("03_scheduler")
    hand_in(root / "carol", {"v1-step": [True]}, name="quiz_03.json", bank=scheduler)
    (root / "README.txt").write_text("not a learner")  # a stray file in SUBMISSIONS is not a learner

    collection = collect_quizzes(root)

    assert collection.problems == {}
    assert counts(collection) == expected(3, paged_win=1, os_analogy=1, gqa_follow_up=1,
                                          reserve_waste_kinds=1, kv_mha=1)
    assert [(q.quiz, q.question_id) for q in collection.misses] == (
        [("01_paging", qid) for qid in IDS] + [("03_scheduler", q.id) for q in scheduler.questions])
    assert counts(collection, "03_scheduler")["v1-step"] == (0, 1)
    assert all(m == (1, 1) for qid, m in counts(collection, "03_scheduler").items() if qid != "v1-step")
    assert collection.misses[0] == QuestionMisses("01_paging", "paged-win", PAGING.questions[0].prompt, 1, 3)
    assert collect_quizzes(root) == collection  # deterministic


def test_a_hand_edited_card_is_judged_from_its_answers(cohort: Path):
    path = hand_in(cohort / "eve", {**all_right(), "paged-win": [False], "reserve-waste-kinds": [False],
                                    "startup-oom": [False, True]})
    card = json.loads(path.read_text())
    for entry in card["answers"]:  # every flag says right on the first try
        entry["first_correct"] = entry["solved"] = True
        entry["attempts"] = 1
        for attempt in entry["tries"]:
            attempt["correct"] = True
    card["score"] = card["solved"] = card["total"]
    path.write_text(json.dumps(card))

    collection = collect_quizzes(cohort)

    assert collection.problems == {}
    assert counts(collection) == expected(3, paged_win=2, reserve_waste_kinds=1, startup_oom=1)


def test_old_style_cards_count_a_single_right_try_only(cohort: Path):
    wrong_index = wrong(PAGING.question("paged-win"))
    answers = [
        {"question_id": "paged-win", "answer": wrong_index, "correct": True, "attempts": 1},  # edited: missed
        {"question_id": "memory-bound", "answer": right(PAGING.question("memory-bound")), "correct": True,
         "attempts": 2},  # right on a retry: missed
        {"question_id": "kv-mha", "answer": 512, "correct": False, "attempts": 1},  # right, whatever the flag says
        {"question_id": "reserve-waste-kinds", "answer": [0, 2, 4], "correct": True, "attempts": 1},
    ]
    (cohort / "old").mkdir()
    (cohort / "old" / "quiz_01.json").write_text(json.dumps({"quiz": "01_paging.yaml", "answers": answers}))

    got = counts(collect_quizzes(cohort))

    assert got["paged-win"] == (2, 3) and got["memory-bound"] == (1, 3)
    assert got["kv-mha"] == (0, 3) and got["reserve-waste-kinds"] == (0, 3)
    assert got["os-analogy"] == (1, 3)  # not answered


def test_unknown_ids_are_ignored_and_the_first_entry_counts(cohort: Path):
    path = hand_in(cohort / "dup", all_right())
    card = json.loads(path.read_text())
    wrong_try = {"answer": wrong(PAGING.question("memory-bound")), "correct": False}
    card["answers"] = (
        [{"question_id": "no-such-question", "tries": [wrong_try]},
         {"question_id": "paged-win", "tries": [{"answer": wrong(PAGING.question("paged-win")), "correct": True}]}]
        + card["answers"]  # paged-win again, right, but the wrong entry came first
        + [{"question_id": "memory-bound", "tries": [wrong_try]}])  # a later wrong entry does not count
    card["quiz"] = "quizzes/01_paging.yaml"
    path.write_text(json.dumps(card))

    collection = collect_quizzes(cohort)

    assert collection.problems == {}
    assert counts(collection) == expected(3, paged_win=2)


def _entry(path: Path, question_id: str, change: Callable[[dict], None]) -> None:
    card = json.loads(path.read_text())
    change(next(e for e in card["answers"] if e["question_id"] == question_id))
    path.write_text(json.dumps(card))


def _set(key: str, value: Any) -> Callable[[dict], None]:
    return lambda entry: entry.__setitem__(key, value)


def _first_answer(value: Any) -> Callable[[dict], None]:
    return lambda entry: entry["tries"][0].__setitem__("answer", value)


def _edit_card(change: Callable[[dict], None]) -> Callable[[Path, Path], None]:
    def make(folder: Path, outside: Path) -> None:
        path = hand_in(folder, all_right())
        card = json.loads(path.read_text())
        change(card)
        path.write_text(json.dumps(card))
    return make


def _edit_entry(question_id: str, change: Callable[[dict], None]) -> Callable[[Path, Path], None]:
    def make(folder: Path, outside: Path) -> None:
        _entry(hand_in(folder, all_right()), question_id, change)
    return make


def _write(data: bytes | str) -> Callable[[Path, Path], None]:
    def make(folder: Path, outside: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "quiz_01.json"
        path.write_bytes(data) if isinstance(data, bytes) else path.write_text(data)
    return make


def _folder(folder: Path, outside: Path) -> None:
    (folder / "quiz_01.json").mkdir(parents=True)
    hand_in(folder / "quiz_01.json", all_right(), name="inside.json")


def _dangling(folder: Path, outside: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "quiz_01.json").symlink_to(outside / "gone.json")


def _link_out(folder: Path, outside: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "quiz_01.json").symlink_to(hand_in(outside, all_right(), name="someone_elses.json"))


def _fifo(folder: Path, outside: Path) -> None:
    folder.mkdir(parents=True)
    os.mkfifo(folder / "quiz_01.json")  # opening it for reading without O_NONBLOCK would hang


def _huge(folder: Path, outside: Path) -> None:
    path = hand_in(folder, all_right())
    path.write_text(path.read_text() + " " * (2 * 2**20))  # valid JSON, but 2 MiB


HOSTILE_CARDS = {  # how to make the file, the problem line, whether the card still counts (one question missed)
    "deep nesting": (_write("[" * 100000), "quiz_01.json: nested too deeply", None),
    "deep objects": (_write('{"a":' * 100000), "quiz_01.json: nested too deeply", None),
    "a folder": (_folder, "quiz_01.json: not a regular file (a folder)", None),
    "a dangling link": (_dangling, "quiz_01.json: a symbolic link; hand in the file itself", None),
    "a link out": (_link_out, "quiz_01.json: a symbolic link; hand in the file itself", None),
    "a named pipe": (_fifo, "quiz_01.json: not a regular file (a named pipe)", None),
    "2 MiB": (_huge, "quiz_01.json: larger than 1 MiB", None),
    "not JSON": (_write("{'quiz': 1"), "quiz_01.json: not valid JSON (line 1, column 2)", None),
    "not UTF-8": (_write(b'{"quiz": "\xff"}'), "quiz_01.json: not UTF-8 text", None),
    "a list": (_write("[1, 2]"), "quiz_01.json: not a scorecard (it is a list, not a JSON object)", None),
    "a 5000-digit number": (_write("[" + "9" * 5000 + "]"), "quiz_01.json: not valid JSON", None),
    "answers a string": (_edit_card(lambda c: c.__setitem__("answers", "all right")),
                         "quiz_01.json: not a scorecard ('answers' is text, not a list)", None),
    "no answers": (_edit_card(lambda c: c.pop("answers")), "quiz_01.json: not a scorecard (no 'answers' list)", None),
    "quiz a number": (_edit_card(lambda c: c.__setitem__("quiz", 1)),
                      "quiz_01.json: not a scorecard ('quiz' is a number, not a quiz name)", None),
    "an unknown quiz": (_edit_card(lambda c: c.__setitem__("quiz", "quizzes/nope.yaml")),
                        "quiz_01.json: names quiz 'nope', which the course does not have", None),
    "a quiz outside the course": (_edit_card(lambda c: c.__setitem__("quiz", "../../etc/passwd")),
                                  "quiz_01.json: names quiz 'passwd', which the course does not have", None),
    "tries empty": (_edit_entry("paged-win", _set("tries", [])),
                    "quiz_01.json: answer #1 ('paged-win'): 'tries' is empty; counted as missed", "paged-win"),
    "tries a number": (_edit_entry("kv-mha", _set("tries", 3)),
                       "quiz_01.json: answer #6 ('kv-mha'): 'tries' is a number, not a list; counted as missed",
                       "kv-mha"),
    "an object for an index": (
        _edit_entry("paged-win", _first_answer({"index": 0})),
        "quiz_01.json: answer #1 ('paged-win'): the first answer is a JSON object, where an option index "
        "is expected; counted as missed", "paged-win"),
    "true for an index": (
        _edit_entry("memory-bound", _first_answer(True)),
        "quiz_01.json: answer #2 ('memory-bound'): the first answer is true or false, where an option index "
        "is expected; counted as missed", "memory-bound"),
    "text for a number": (
        _edit_entry("kv-mha", _first_answer("512")),
        "quiz_01.json: answer #6 ('kv-mha'): the first answer is text, where a number is expected; "
        "counted as missed", "kv-mha"),
    "an index out of range": (
        _edit_entry("reserve-waste-kinds", _first_answer([0, 2, 4, 99])),
        "quiz_01.json: answer #7 ('reserve-waste-kinds'): the question cannot judge the first answer "
        "(out of range or incomplete); counted as missed", "reserve-waste-kinds"),
    "a repeated index": (
        _edit_entry("gqa-follow-up", _first_answer([0, 0, 2, 4])),
        "quiz_01.json: answer #11 ('gqa-follow-up'): the first answer is a list, where a list of distinct "
        "option indices is expected; counted as missed", "gqa-follow-up"),
    "pairs missing": (
        _edit_entry("os-analogy", _first_answer({"Page": "Block table"})),
        "quiz_01.json: answer #8 ('os-analogy'): the question cannot judge the first answer "
        "(out of range or incomplete); counted as missed", "os-analogy"),
    "a pair's choice a list": (
        _edit_entry("os-analogy", _first_answer({left: [r] for left, r in PAGING.question("os-analogy").pairs})),
        "quiz_01.json: answer #8 ('os-analogy'): the first answer is a JSON object, where an object from each "
        "left item to its right item is expected; counted as missed", "os-analogy"),
    "a first try with no answer": (
        _edit_entry("startup-oom", _set("tries", [{"correct": True}])),
        "quiz_01.json: answer #9 ('startup-oom'): the first try has no 'answer'; counted as missed", "startup-oom"),
}


@pytest.mark.parametrize("case", HOSTILE_CARDS)
def test_a_hostile_card_marks_only_its_own_file(cohort: Path, tmp_path: Path, case: str):
    make, line, still_counts = HOSTILE_CARDS[case]
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    make(cohort / "mallory", outside)
    hand_in(cohort / "mallory", {"v1-step": [True]}, name="quiz_03.json", bank=load_bank("03_scheduler"))

    collection = collect_quizzes(cohort)

    assert collection.problems == {"mallory": [line]}
    if still_counts:
        missed = {"paged_win": 1}
        missed[still_counts.replace("-", "_")] = missed.get(still_counts.replace("-", "_"), 0) + 1
        assert counts(collection) == expected(3, **missed)
    else:
        assert counts(collection) == expected(2, paged_win=1)
    assert counts(collection, "03_scheduler")["v1-step"] == (0, 1)  # mallory's readable card still counts


def test_every_hostile_file_at_once(cohort: Path, tmp_path: Path):
    mallory = cohort / "mallory"
    mallory.mkdir()
    (mallory / "a.json").write_text("[" * 100000)
    (mallory / "b.json").mkdir()
    (mallory / "c.json").symlink_to(tmp_path / "nowhere.json")
    (mallory / "d.json").symlink_to(cohort / "alice" / "quiz_01.json")
    (mallory / "e.json").write_bytes(b"0" * (2 * 2**20))
    (mallory / "f\nlog.json").write_text("{}")
    hand_in(mallory, all_right(), name="z.json")  # the one good card

    collection = collect_quizzes(cohort)

    assert collection.problems == {"mallory": [
        "a.json: nested too deeply",
        "b.json: not a regular file (a folder)",
        "c.json: a symbolic link; hand in the file itself",
        "d.json: a symbolic link; hand in the file itself",
        "e.json: larger than 1 MiB",
        "'f\\nlog.json': not a scorecard (no 'quiz' name)",
    ]}
    assert counts(collection) == expected(3, paged_win=1)


def test_a_second_card_for_a_quiz_does_not_count(cohort: Path):
    hand_in(cohort / "bob", all_right(), name="quiz_01_again.json")

    collection = collect_quizzes(cohort)

    assert collection.problems == {"bob": [
        "quiz_01_again.json: a second scorecard for quiz '01_paging'; only the first by name (quiz_01.json) counts"]}
    assert counts(collection) == expected(2, paged_win=1)


def test_a_learner_folder_that_is_a_link_is_refused(cohort: Path, tmp_path: Path):
    hand_in(tmp_path / "real", {**all_right(), "kv-mha": [False]})
    (cohort / "linked").symlink_to(tmp_path / "real")
    (cohort / "to_alice").symlink_to(cohort / "alice")

    collection = collect_quizzes(cohort)

    refused = ["the learner folder is a symbolic link; it was not followed (hand in a real folder)"]
    assert collection.problems == {"linked": refused, "to_alice": refused}
    assert counts(collection) == expected(2, paged_win=1)


def test_a_link_that_appears_after_the_look_is_not_followed(cohort: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch):
    """Between looking at a name and opening it, a learner could swap the file for a link: the
    open itself refuses to follow it (O_NOFOLLOW), for a scorecard and for a learner folder."""
    hand_in(tmp_path / "real", all_right())
    (cohort / "swapped").symlink_to(tmp_path / "real")
    (cohort / "mallory").mkdir()
    (cohort / "mallory" / "quiz_01.json").symlink_to(tmp_path / "real" / "quiz_01.json")
    real_stat = os.stat

    def look_through_links(path, *, dir_fd=None, follow_symlinks=True):  # as if the link came later
        return real_stat(path, dir_fd=dir_fd)

    monkeypatch.setattr(quiz_collection.os, "stat", look_through_links)
    collection = collect_quizzes(cohort)
    monkeypatch.undo()

    assert collection.problems == {
        "mallory": ["quiz_01.json: a symbolic link; hand in the file itself"],
        "swapped": ["the learner folder is a symbolic link; it was not followed (hand in a real folder)"]}
    assert counts(collection) == expected(2, paged_win=1)


def test_many_malformed_answers_are_summed_up(cohort: Path):
    path = hand_in(cohort / "noisy", all_right())
    card = json.loads(path.read_text())
    card["answers"] = [7] * 30 + card["answers"]
    path.write_text(json.dumps(card))

    collection = collect_quizzes(cohort)

    lines = collection.problems["noisy"]
    assert lines[:10] == [f"quiz_01.json: answer #{n} has no 'question_id' text; ignored" for n in range(1, 11)]
    assert lines[10:] == ["quiz_01.json: 20 more answers with problems"]
    assert counts(collection) == expected(3, paged_win=1)


def test_banks_are_loaded_once_and_never_by_a_learners_name(cohort: Path, monkeypatch: pytest.MonkeyPatch):
    calls = []
    real = quiz_collection.load_bank
    monkeypatch.setattr(quiz_collection, "load_bank", lambda name: calls.append(name) or real(name))
    for learner in ("carol", "dave", "erin"):
        hand_in(cohort / learner, all_right())
    bad = hand_in(cohort / "mallory", all_right())
    bad.write_text(bad.read_text().replace("01_paging.yaml", "../../../etc/02_batching.yaml/../x"))

    collection = collect_quizzes(cohort)

    assert sorted(Path(c).name for c in calls) == sorted(f"{name}.yaml" for name in load_banks())
    assert collection.problems == {"mallory": ["quiz_01.json: names quiz 'x', which the course does not have"]}
    assert counts(collection) == expected(5, paged_win=1)

    banks = load_banks()
    calls.clear()
    assert collect_quizzes(cohort, banks) == collection and calls == []  # given banks: none loaded
