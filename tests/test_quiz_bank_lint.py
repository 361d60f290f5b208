"""The quiz bank lint: every bank in quizzes/ is checked for what loading cannot catch.

(a) No length cue: in at most 40 % of a bank's single-choice questions is the right option the
    strictly longest, and in at most 40 % the strictly shortest (as shown: `code` without its
    backticks); in multi-select questions, the right options are not all longer, or all shorter,
    than every wrong one in more than 40 % of them.
(b) No position cue in the bank's own order (what an author and a printout see; learners see a
    shuffled one): no option index holds the right answer in more than half the single-choice
    questions (rounded up), and the right option comes first in at most 40 % of them, pooled.
(c) Every numeric tolerance states its kind, absolute (in the answer's unit) or percent.
(d) Every numeric question accepts its answer and the answer rounded to 3 significant figures,
    and rejects its listed wrong values (each with its own feedback), every other number its
    texts name, and the answer off by a unit factor (with feedback that says so).
Each failure names the bank, the questions and what to change.
"""

import math
import re
from collections import Counter
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal

import pytest
import yaml

from course_lib.paths import QUIZ_DIR
from course_lib.quiz.bank import load_bank, parse_bank
from course_lib.quiz.questions import MultiSelect, Numeric, SingleChoice
from course_lib.quiz.tolerance import KINDS
from course_lib.quiz.unit_slips import UNIT_FACTORS, slip_factors
from course_lib.widgets.quiz import as_plain

PATHS = sorted(QUIZ_DIR.glob("*.yaml"))
BANKS = [load_bank(path) for path in PATHS]
MAX_CUE_SHARE = 0.40  # of a bank's questions whose right option stands out by its length
MAX_FIRST_SHARE = 0.40  # of all single-choice questions whose right option comes first in the bank
MAX_MULTI_LENGTH_RATIO = 1.6  # mean right vs mean wrong option length, in a multi-select question
NUMBER = re.compile(r"(?<![\w.,])\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w])")


def _singles(bank):
    return [q for q in bank.questions if isinstance(q, SingleChoice)]


def _multis(bank):
    return [q for q in bank.questions if isinstance(q, MultiSelect)]


def _numerics(bank):
    return [q for q in bank.questions if isinstance(q, Numeric)]


def _length(option) -> int:
    return len(as_plain(option.text))


def _right(q) -> int:
    return next(i for i, o in enumerate(q.options) if o.correct)


def _stands_out(q, longer: bool) -> bool:
    """Whether every right option is strictly longer (or shorter) than every wrong one."""
    sign = 1 if longer else -1
    right = [sign * _length(o) for o in q.options if o.correct]
    wrong = [sign * _length(o) for o in q.options if not o.correct]
    return min(right) > max(wrong)


def length_cue_problems(bank, kind: str, questions) -> list[str]:
    asked = questions(bank)
    problems = []
    for longer, word, fix in ((True, "longest", "shorten a right option or lengthen a wrong one"),
                              (False, "shortest", "lengthen a right option or shorten a wrong one")):
        cued = [q.id for q in asked if _stands_out(q, longer)]
        allowed = math.floor(MAX_CUE_SHARE * len(asked))
        if len(cued) > allowed:
            problems.append(f"{bank.source}: the right option{'s are' if kind == 'multi-select' else ' is'} the "
                            f"strictly {word} in {len(cued)} of {len(asked)} {kind} questions ({cued}); at most "
                            f"{allowed} may be: in {len(cued) - allowed} of them, {fix}, keeping the meaning.")
    return problems


@pytest.mark.parametrize("bank", BANKS, ids=lambda b: b.source)
@pytest.mark.parametrize("kind, questions", [pytest.param("single-choice", _singles, id="single"),
                                              pytest.param("multi-select", _multis, id="multi")])
def test_no_length_cue(bank, kind, questions):
    problems = length_cue_problems(bank, kind, questions)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("bank", BANKS, ids=lambda b: b.source)
def test_no_multi_select_question_tells_its_right_options_by_their_mean_length(bank):
    tells = {}
    for q in _multis(bank):
        right = sum(_length(o) for o in q.options if o.correct) / sum(o.correct for o in q.options)
        wrong = sum(_length(o) for o in q.options if not o.correct) / sum(not o.correct for o in q.options)
        if max(right / wrong, wrong / right) > MAX_MULTI_LENGTH_RATIO:
            tells[q.id] = f"right options {right:.0f} characters on average, wrong ones {wrong:.0f}"
    assert not tells, f"{bank.source}: bring the option lengths within {MAX_MULTI_LENGTH_RATIO}x: {tells}"


def position_cue_problems(bank) -> list[str]:
    singles = _singles(bank)
    if not singles:
        return []
    index, count = Counter(_right(q) for q in singles).most_common(1)[0]
    allowed = math.ceil(len(singles) / 2)
    if count <= allowed:
        return []
    ids = [q.id for q in singles if _right(q) == index]
    return [f"{bank.source}: the right option is option {index + 1} in {count} of {len(singles)} single-choice "
            f"questions ({ids}); at most {allowed} may share a place. Move the right option elsewhere in "
            f"{count - allowed} of them, as a new question with a new id (scorecards store option indices)."]


@pytest.mark.parametrize("bank", BANKS, ids=lambda b: b.source)
def test_no_position_cue_in_the_banks_order(bank):
    problems = position_cue_problems(bank)
    assert not problems, "\n".join(problems)


def test_the_right_option_is_first_in_a_minority_of_questions():
    """Authors tend to write the right option first; pooled over the banks."""
    singles = [q for bank in BANKS for q in _singles(bank)]
    first = [q.id for q in singles if _right(q) == 0]
    assert len(first) <= MAX_FIRST_SHARE * len(singles), f"right option first in too many questions: {first}"


def test_multi_select_questions_vary_how_many_options_are_right():
    """If nearly every "pick all that apply" had all options but one right, ticking all but the
    odd one out would pass them."""
    multis = [q for bank in BANKS for q in _multis(bank)]
    counts = Counter((sum(o.correct for o in q.options), len(q.options)) for q in multis)
    all_but_one = [q.id for q in multis if sum(o.correct for o in q.options) == len(q.options) - 1]
    assert len(all_but_one) <= MAX_CUE_SHARE * len(multis), all_but_one
    assert len({right for right, _ in counts}) >= 3, counts
    assert any(right <= 2 for right, _ in counts), counts


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
def test_every_numeric_tolerance_states_its_kind(path):
    """Checked on the file itself, so that no default or bare number can slip through a loader change."""
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    problems = [f"{path.name}, question {q.get('id')!r}: tolerance is {q.get('tolerance')!r}; write "
                f"`tolerance: {{absolute: X}}` (X in {q.get('unit')}) or `tolerance: {{percent: X}}`"
                for q in raw["questions"] if q.get("kind") == "numeric"
                if not (isinstance(q.get("tolerance"), dict) and len(q["tolerance"]) == 1
                        and next(iter(q["tolerance"])) in KINDS and q.get("unit"))]
    assert not problems, "\n".join(problems)


def _roundings(answer: float) -> set[float]:
    """The answer rounded to 3 significant figures, half up and half to even; none for a whole
    number, which is a count to give exactly."""
    if answer == int(answer):
        return set()
    quantum = Decimal(1).scaleb(math.floor(math.log10(abs(answer))) - 2)
    return {float(Decimal(repr(answer)).quantize(quantum, rounding=mode)) for mode in (ROUND_HALF_UP, ROUND_HALF_EVEN)}


def _is_a_rounding(number: float, answer: float) -> bool:
    """Whether ``number`` is ``answer`` rounded (or ``answer`` is ``number`` rounded) to some precision."""
    def rounded(x, digits):
        return float(f"{x:.{digits}g}")
    return any(rounded(answer, d) == number or rounded(number, d) == answer for d in range(1, 8))


def _named_numbers(q) -> set[float]:
    """Every number in the question's prompt, explanation and wrong-value feedback."""
    texts = [q.prompt, q.explanation, *(w.why for w in q.wrong)]
    return {float(m.group().replace(",", "")) for text in texts for m in NUMBER.finditer(text)}


def numeric_problems(bank) -> list[str]:
    problems = []
    for q in _numerics(bank):
        where = f"{bank.source}, question {q.id!r} (answer {q.answer:g} {q.unit}, {q.tolerance.describe(q.unit)})"
        for value in {q.answer, *_roundings(q.answer)}:
            if not q.check(value).correct:
                problems.append(f"{where}: rejects {value:g}, an honest rounding of the answer; widen the tolerance.")
        for wrong in q.wrong:
            feedback = q.check(wrong.value)
            if feedback.correct or wrong.why not in feedback.message:
                problems.append(f"{where}: the wrong value {wrong.value:g} does not get its own feedback "
                                f"({feedback.message!r}); narrow the tolerance or move the values apart.")
        for number in sorted(_named_numbers(q)):
            if q.check(number).correct and not _is_a_rounding(number, q.answer):
                problems.append(f"{where}: accepts {number:g}, a number its text names; narrow the tolerance, "
                                f"or list {number:g} under 'wrong' with what it is.")
        hinted = slip_factors(q.unit)  # 8 is a slip only between bits and bytes
        for factor, said in UNIT_FACTORS.items():
            for value, direction in ((q.answer / factor, "small"), (q.answer * factor, "large")):
                feedback = q.check(value)
                listed = any(q.tolerance.accepts(value, w.value) for w in q.wrong)
                hint = factor not in hinted or listed or f"{said} times too {direction}" in feedback.message
                if feedback.correct or not hint:
                    problems.append(f"{where}: {value:g} (the answer off by {said}) gets {feedback.message!r}, "
                                    f"not a unit-slip hint; narrow the tolerance.")
    return problems


@pytest.mark.parametrize("bank", BANKS, ids=lambda b: b.source)
def test_every_numeric_question_accepts_its_answer_and_rejects_the_classic_wrong_ones(bank):
    problems = numeric_problems(bank)
    assert not problems, "\n".join(problems)


def _numeric_bank(tolerance, wrong=()):
    """Quiz 07's first question as it was, with ``tolerance`` and the given wrong values."""
    return parse_bank({"title": "T", "questions": [{
        "id": "busbw", "kind": "numeric", "unit": "GB/s", "answer": 175, "tolerance": tolerance,
        "wrong": [{"value": v, "why": "Listed."} for v in wrong],
        "prompt": "A 1 GB all-reduce over 8 GPUs runs at an algbw of 100 GB/s. What busbw does nccl-tests report?",
        "explanation": "busbw = algbw x 2(N-1)/N = 100 x 2 x 7/8 = 175 GB/s."}]}, "old_07.yaml")


def test_the_lint_catches_each_defect_the_learner_walk_found():
    """Banks like the ones found: the algbw accepted for the busbw (a ±50 % tolerance), a tolerance
    too tight for an honest rounding, and the right option the longest, and in one place, everywhere."""
    assert "accepts 100, a number its text names" in "\n".join(numeric_problems(_numeric_bank({"percent": 50})))
    assert not numeric_problems(_numeric_bank({"percent": 1}, wrong=[100]))
    exact = parse_bank({"title": "T", "questions": [{
        "id": "tokens", "kind": "numeric", "unit": "tokens", "answer": 3.3616, "tolerance": {"absolute": 0},
        "prompt": "Expected tokens per step?"}]}, "t.yaml")
    assert "rejects 3.36, an honest rounding of the answer" in "\n".join(numeric_problems(exact))

    def single(number, right, lengths):
        return {"id": f"q{number}", "kind": "single", "prompt": "Which?", "options": [
            {"text": "x" * n, "correct": i == right, "why": "Because."} for i, n in enumerate(lengths)]}

    cued = parse_bank({"title": "T", "questions": [single(n, 1, (40, 90, 50, 60)) for n in range(7)]}, "cued.yaml")
    assert "strictly longest in 7 of 7 single-choice questions" in length_cue_problems(cued, "single-choice", _singles)[0]
    assert "option 2 in 7 of 7 single-choice questions" in position_cue_problems(cued)[0]
    fair = parse_bank({"title": "T", "questions": [single(n, n % 4, (60, 40, 80, 50)) for n in range(7)]}, "fair.yaml")
    assert not length_cue_problems(fair, "single-choice", _singles) and not position_cue_problems(fair)


def test_the_lint_reads_every_number_a_text_names():
    assert {float(m.group().replace(",", "")) for m in NUMBER.finditer(
        "10,000 x 327,680 bytes = 3.28 GB; / 50e9 bytes/s = 65.5 ms, on an H100 (2(N-1)/N), 7/8.")} == {
        10_000, 327_680, 3.28, 50e9, 65.5, 2, 1, 7, 8}
    assert _roundings(4.125) == {4.12, 4.13} and _roundings(3.3616) == {3.36} and _roundings(13650) == set()
    assert _is_a_rounding(1.3, 1.31) and _is_a_rounding(3.36, 3.3616) and not _is_a_rounding(100, 175)
