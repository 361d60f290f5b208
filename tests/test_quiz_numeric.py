"""Numeric questions: a tolerance that says what it means, classic wrong values with their own
feedback, unit slips named, and saved answers judged again by the bank as it is now."""

import json

import pytest

from course_lib.grading.quizzes import collect_quizzes
from course_lib.quiz.bank import load_bank, parse_bank
from course_lib.quiz.scorecard import Scorecard
from course_lib.quiz.tolerance import Tolerance


def numeric(answer, unit, tolerance, wrong=()):
    bank = parse_bank({"title": "T", "questions": [
        {"id": "q", "kind": "numeric", "prompt": "How much?", "answer": answer, "unit": unit,
         "tolerance": tolerance, "wrong": [{"value": v, "why": why} for v, why in wrong]}]}, "t.yaml")
    return bank.question("q")


def test_a_tolerance_is_absolute_in_the_unit_or_a_percentage_of_the_answer():
    assert Tolerance("absolute", 0.5).accepts(175.5, 175) and not Tolerance("absolute", 0.5).accepts(175.6, 175)
    assert Tolerance("percent", 1).accepts(176.75, 175) and not Tolerance("percent", 1).accepts(177, 175)
    assert Tolerance("absolute", 0).accepts(9, 9) and not Tolerance("absolute", 0).accepts(9.001, 9)
    assert Tolerance("percent", 1).accepts(0.0999, 0.1)  # a percentage of a small answer is small
    assert Tolerance("absolute", 0.5).describe("GB/s") == "within 0.5 GB/s"
    assert Tolerance("percent", 1.5).describe("KB") == "within 1.5 % of the answer"


def test_the_busbw_question_rejects_the_algbw_and_says_why():
    """The defect: `tolerance: 0.5` was read as ±50 %, so the algbw (100) passed for the busbw (175)."""
    question = load_bank("07_nccl_topology").question("busbw-example")
    feedback = question.check(100)
    assert not feedback.correct and "That is the algbw itself." in feedback.message
    assert "175" not in feedback.message  # a wrong try still does not hear the answer
    assert question.check(175).correct and question.check(174.5).correct
    assert not question.check(150).correct and "too low" in question.check(150).message


def test_a_value_near_a_classic_wrong_one_hears_its_feedback():
    question = numeric(175, "GB/s", {"percent": 1}, [(100, "That is the algbw."), (87.5, "Wrong factor.")])
    assert question.check(100.4).message == "Not quite. You gave 100.4 GB/s. That is the algbw."
    assert "Wrong factor." in question.check(87.5).message
    assert "too low" in question.check(120).message


@pytest.mark.parametrize("answer, unit, given, said", [
    (65.5, "ms", 0.0655, "1,000 times too small: that looks like a value in s, where the question asks for ms."),
    (65.5, "ms", 65_500, "1,000 times too large: that looks like a value in µs"),
    (512, "KiB", 524_288, "1,024 times too large: that looks like a value in bytes"),
    (512, "KiB", 0.5, "1,024 times too small: that looks like a value in MiB"),
    (256, "MiB", 268.4, "1.049 times too large: that looks like a value in MB"),
    (131_072, "bytes", 1_048_576, "8 times too large: that looks like a value in bits"),
    (175, "GB/s", 175_000, "1,000 times too large: that looks like a value in MB/s"),
    (1.75, "GiB", 1.879, "1.074 times too large: that looks like a value in GB"),
    (13_650, "slot-steps", 13.65, "1,000 times too small: check the unit, the question asks for slot-steps."),
    (3.5, "tokens", 3.5 * 2**20, "2^20 (1,048,576) times too large: check the unit"),
])
def test_an_answer_off_by_a_unit_factor_is_told_so(answer, unit, given, said):
    feedback = numeric(answer, unit, {"percent": 1}).check(given)
    assert not feedback.correct and said in feedback.message, feedback.message


def test_numbers_are_written_out_as_given_never_in_e_notation():
    question = numeric(131_072, "bytes", {"absolute": 0})
    assert "You gave 1,048,576 bytes, 8 times too large" in question.check(1_048_576).message
    assert "You gave 0.0001234 bytes" in question.check(0.0001234).message
    assert question.solution_text() == "131,072 bytes"


def test_bits_and_decimal_binary_slips_are_only_named_for_data_units():
    assert "too high" in numeric(3, "tokens", {"percent": 1}).check(24).message
    assert "too high" in numeric(100, "ms", {"percent": 1}).check(102.4).message


@pytest.fixture
def old_card(tmp_path, monkeypatch):
    """A scorecard saved under the old bank: the algbw (100) was scored right on the first try."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    card = {"quiz": "07_nccl_topology.yaml", "title": "Module 07 quiz", "learner": "ada", "scoring": "first try",
            "score": 2, "solved": 2, "total": 11, "answers": [
                {"question_id": "busbw-example", "first_correct": True, "attempts": 1, "solved": True,
                 "tries": [{"answer": 100, "correct": True}]},
                {"question_id": "busbw-reduce-scatter", "first_correct": True, "attempts": 1, "solved": True,
                 "tries": [{"answer": 70.0, "correct": True}]}]}
    path = tmp_path / "submissions" / "ada" / "07_nccl_topology.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(card))
    return path


def test_a_saved_scorecard_is_judged_again_by_the_fixed_bank(old_card):
    card = Scorecard(load_bank("07_nccl_topology"), "ada", old_card)
    assert not card.records["busbw-example"].first_correct
    assert card.records["busbw-reduce-scatter"].first_correct
    assert card.score == 1
    missed = {row.question_id: row.missed for row in collect_quizzes(old_card.parent.parent).misses}
    assert (missed["busbw-example"], missed["busbw-reduce-scatter"]) == (1, 0)
