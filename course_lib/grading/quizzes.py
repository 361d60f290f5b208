"""Quiz statistics for the cohort gradebook, from scorecards a learner handed in.

Each learner folder in SUBMISSIONS may hold exported scorecards (``*.json``, see
course_lib/quiz/scorecard.py). Per quiz question, ``collect_quizzes`` counts the learners who
missed it on the first try. Everything in a learner folder is treated as untrusted data:

* nothing is followed: a learner folder that is a symbolic link is refused, and so is every
  scorecard that is a link, a folder, a pipe or anything but a regular file (``O_NOFOLLOW``
  on every open, relative to the already opened folder, so a name swapped for a link between
  listing and opening is refused too);
* at most ``MAX_CARD_BYTES`` + 1 bytes are read from a file, and a larger one is refused;
* JSON that is malformed or nested too deeply is refused, never raised;
* the card's own verdicts (``correct``, ``first_correct``, ``score``) are ignored: each first
  try's stored answer is judged again by the course's question bank, and an answer the
  question cannot judge (wrong type, out of range, anything that raises) counts as missed.

A file that cannot be used leaves one line in ``QuizCollection.problems`` under its learner;
the learner still counts for every quiz whose scorecard was readable.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any

from course_lib.paths import QUIZ_DIR
from course_lib.quiz.bank import QuizBank, load_bank
from course_lib.quiz.questions import Matching, MultiSelect, Numeric, Question, SingleChoice, SpotTheBug

MAX_CARD_BYTES = 2**20  # a real scorecard is a few KiB
MAX_CARDS_PER_LEARNER = 64  # ``*.json`` files read per learner folder (in name order); the course has a handful of quizzes
MAX_ANSWER_NOTES = 10  # problem lines about single answers, per file; the rest are summed up in one line
MAX_PROBLEMS_PER_LEARNER = 50  # problem lines per learner; the rest are summed up in one line

READ_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True)
class QuestionMisses:
    quiz: str
    question_id: str
    prompt: str
    missed: int  # learners who handed in this quiz and did not answer this question right on the first try
    handed_in: int


@dataclass(frozen=True)
class QuizCollection:
    misses: list[QuestionMisses] = field(default_factory=list)  # quizzes sorted, questions in bank order
    problems: dict[str, list[str]] = field(default_factory=dict)  # learner folder -> one line per refused file


class Refused(Exception):
    """A scorecard file that cannot be used; the message is its problem line, without the name."""


def load_banks(quiz_dir: Path = QUIZ_DIR) -> dict[str, QuizBank]:
    """Every question bank in ``quiz_dir`` (``NAME.yaml``), by NAME. A broken bank is the course's
    own mistake and raises (QuizFileError), so call this before grading to hear of it early."""
    return {path.stem: load_bank(path) for path in sorted(quiz_dir.glob("*.yaml"))}


def collect_quizzes(submissions: Path, banks: Mapping[str, QuizBank] | None = None) -> QuizCollection:
    """Per quiz question, how many learners missed it on the first try (unanswered counts as
    missed), judged again from the answers stored in each learner folder's scorecards; plus one
    problem line per file that was refused. ``banks`` defaults to ``load_banks()``; a scorecard
    naming a quiz not in it is refused. Nothing a learner folder holds makes this raise."""
    banks = load_banks() if banks is None else dict(banks)
    taken: dict[str, dict[str, dict[str, bool]]] = {}  # quiz -> learner -> question id -> first try right
    problems: dict[str, list[str]] = {}
    root = os.open(submissions, DIR_FLAGS)
    try:
        with os.scandir(root) as listing:
            names = sorted(entry.name for entry in listing)
        for learner in names:
            lines = _collect_learner(root, learner, banks, taken)
            if lines:
                if len(lines) > MAX_PROBLEMS_PER_LEARNER:
                    extra = len(lines) - MAX_PROBLEMS_PER_LEARNER
                    lines = lines[:MAX_PROBLEMS_PER_LEARNER] + [f"{extra} more problem lines left out"]
                problems[learner] = lines
    finally:
        os.close(root)
    misses = []
    for quiz in sorted(taken):
        cards = taken[quiz]
        for question in banks[quiz].questions:
            missed = sum(not card.get(question.id, False) for card in cards.values())
            misses.append(QuestionMisses(quiz, question.id, question.prompt, missed, len(cards)))
    return QuizCollection(misses, problems)


def _collect_learner(root: int, learner: str, banks: Mapping[str, QuizBank],
                     taken: dict[str, dict[str, dict[str, bool]]]) -> list[str]:
    """Read one learner's scorecards into ``taken``; return the learner's problem lines. Entries
    of SUBMISSIONS that are neither folders nor links (a stray file) are not learners: skipped."""
    try:
        mode = os.stat(learner, dir_fd=root, follow_symlinks=False).st_mode
    except OSError as error:
        return [f"the learner folder could not be read ({refusal_reason(error)})"]
    if stat.S_ISLNK(mode):
        return ["the learner folder is a symbolic link; it was not followed (hand in a real folder)"]
    if not stat.S_ISDIR(mode):
        return []
    try:
        folder = os.open(learner, DIR_FLAGS | getattr(os, "O_NOFOLLOW", 0), dir_fd=root)
    except OSError as error:  # replaced since it was looked at? (Linux: ENOTDIR for a link to a folder)
        if error.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(root, learner):
            return ["the learner folder is a symbolic link; it was not followed (hand in a real folder)"]
        return [f"the learner folder could not be read ({refusal_reason(error)})"]
    lines: list[str] = []
    try:
        try:
            with os.scandir(folder) as listing:
                names = sorted(entry.name for entry in listing if entry.name.endswith(".json"))
        except OSError as error:
            return [f"the learner folder could not be read ({refusal_reason(error)})"]
        if len(names) > MAX_CARDS_PER_LEARNER:
            lines.append(f"{len(names)} .json files; only the first {MAX_CARDS_PER_LEARNER} by name were read")
            names = names[:MAX_CARDS_PER_LEARNER]
        counted: dict[str, str] = {}  # quiz -> file that counts for it
        for name in names:
            shown = shown_name(name)
            try:
                quiz, answers = scorecard_answers(parse_card(_read(folder, name)), banks)
            except Refused as refusal:
                lines.append(f"{shown}: {refusal}")
                continue
            if quiz in counted:
                lines.append(f"{shown}: a second scorecard for quiz {quiz!r}; only the first by name "
                             f"({counted[quiz]}) counts")
                continue
            counted[quiz] = shown
            first_tries, notes = _first_tries(banks[quiz], answers)
            taken.setdefault(quiz, {})[learner] = first_tries
            if len(notes) > MAX_ANSWER_NOTES:
                extra = len(notes) - MAX_ANSWER_NOTES
                notes = notes[:MAX_ANSWER_NOTES] + [f"{extra} more answers with problems"]
            lines += [f"{shown}: {note}" for note in notes]
    finally:
        os.close(folder)
    return lines


def _read(folder: int, name: str) -> bytes:
    """The bytes of the regular file ``name`` in the open folder ``folder``, never following a link."""
    try:
        mode = os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode
    except OSError as error:
        raise Refused(f"could not be read ({refusal_reason(error)})") from None
    require_regular(mode)
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=folder)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise Refused("a symbolic link; hand in the file itself") from None
        raise Refused(f"could not be read ({refusal_reason(error)})") from None
    try:
        info = os.fstat(fd)
        require_regular(info.st_mode)  # what was opened, in case the name changed since the look
        if info.st_size > MAX_CARD_BYTES:
            raise Refused("larger than 1 MiB")
        chunks, left = [], MAX_CARD_BYTES + 1
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as error:
        raise Refused(f"could not be read ({refusal_reason(error)})") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > MAX_CARD_BYTES:  # it grew after fstat
        raise Refused("larger than 1 MiB")
    return data


def _is_link(folder: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=folder).st_mode)
    except OSError:
        return False


def require_regular(mode: int) -> None:
    if stat.S_ISLNK(mode):
        raise Refused("a symbolic link; hand in the file itself")
    if not stat.S_ISREG(mode):
        kind = ("a folder" if stat.S_ISDIR(mode) else "a named pipe" if stat.S_ISFIFO(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "not a file")
        raise Refused(f"not a regular file ({kind})")


def parse_card(data: bytes) -> Any:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise Refused("not UTF-8 text") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise Refused("nested too deeply") from None
    except json.JSONDecodeError as error:
        raise Refused(f"not valid JSON (line {error.lineno}, column {error.colno})") from None
    except Exception:  # noqa: BLE001 - e.g. a number with too many digits, or no memory left
        raise Refused("not valid JSON") from None


def scorecard_answers(card: Any, banks: Mapping[str, QuizBank]) -> tuple[str, list[Any]]:
    """The quiz name and the answers list of a parsed card, or Refused."""
    if not isinstance(card, dict):
        raise Refused(f"not a scorecard (it is {_kind(card)}, not a JSON object)")
    if "quiz" not in card:
        raise Refused("not a scorecard (no 'quiz' name)")
    if not isinstance(card["quiz"], str):
        raise Refused(f"not a scorecard ('quiz' is {_kind(card['quiz'])}, not a quiz name)")
    if "answers" not in card:
        raise Refused("not a scorecard (no 'answers' list)")
    if not isinstance(card["answers"], list):
        raise Refused(f"not a scorecard ('answers' is {_kind(card['answers'])}, not a list)")
    quiz = PurePath(card["quiz"]).stem
    if quiz not in banks:
        raise Refused(f"names quiz {_quoted(quiz)}, which the course does not have")
    return quiz, card["answers"]


def _first_tries(bank: QuizBank, answers: list[Any]) -> tuple[dict[str, bool], list[str]]:
    """Question id -> whether its first try was right, judged by ``bank``; and notes on answers
    that were ignored or counted as missed for being malformed. Ids the bank does not have are
    ignored; of several entries for one question the first counts."""
    questions = {q.id: q for q in bank.questions}
    right: dict[str, bool] = {}
    notes: list[str] = []
    for number, entry in enumerate(answers, start=1):
        if not isinstance(entry, dict) or not isinstance(entry.get("question_id"), str):
            notes.append(f"answer #{number} has no 'question_id' text; ignored")
            continue
        question_id = entry["question_id"]
        if question_id not in questions or question_id in right:
            continue
        right[question_id], problem = _judge_first_try(questions[question_id], entry)
        if problem:
            notes.append(f"answer #{number} ({question_id!r}): {problem}; counted as missed")
    return right, notes


def _judge_first_try(question: Question, entry: dict[str, Any]) -> tuple[bool, str | None]:
    """Whether the entry's first answer is right, by ``question``; and why it could not be judged."""
    if "tries" in entry:
        tries = entry["tries"]
        if not isinstance(tries, list):
            return False, f"'tries' is {_kind(tries)}, not a list"
        if not tries:
            return False, "'tries' is empty"
        if not isinstance(tries[0], dict) or "answer" not in tries[0]:
            return False, "the first try has no 'answer'"
        given = tries[0]["answer"]
    else:  # a scorecard from before every try was kept: the latest answer and how many tries it took
        attempts = entry.get("attempts", 1)
        if type(attempts) is not int:
            return False, f"'attempts' is {_kind(attempts)}, not a whole number"
        if attempts != 1:
            return False, None  # answered after a retry: the first try was not this answer, and was wrong
        if "answer" not in entry:
            return False, "no 'answer' to check"
        given = entry["answer"]
    answer, expected = _in_bank_terms(question, given)
    if expected:
        return False, f"the first answer is {_kind(given)}, where {expected} is expected"
    try:
        return question.check(answer).correct is True, None
    except Exception:  # noqa: BLE001 - whatever the question makes of a malformed answer, it is a miss
        return False, "the question cannot judge the first answer (out of range or incomplete)"


def _in_bank_terms(question: Question, given: Any) -> tuple[Any, str | None]:
    """``given`` as the answer type ``question.check`` takes, or (None, what was expected)."""
    if isinstance(question, (SingleChoice, SpotTheBug)):
        if _is_int(given):
            return given, None
        return None, "an option index" if isinstance(question, SingleChoice) else "a line number"
    if isinstance(question, MultiSelect):
        if isinstance(given, list) and all(_is_int(i) for i in given) and len(set(given)) == len(given):
            return set(given), None
        return None, "a list of distinct option indices"
    if isinstance(question, Numeric):
        if _is_int(given) or isinstance(given, float):
            return given, None
        return None, "a number"
    if isinstance(question, Matching):
        if isinstance(given, dict) and all(isinstance(v, str) for v in given.values()):
            return dict(given), None
        return None, "an object from each left item to its right item"
    return given, None  # a kind added later judges its own answers (and any exception is a miss)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    """A JSON value's type in words (never the value, which may be huge or hostile)."""
    if isinstance(value, dict):
        return "a JSON object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "text"
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, (int, float)):
        return "a number"
    return "null" if value is None else "something else"


def _quoted(text: str, limit: int = 60) -> str:
    """Learner-chosen text for a problem line: quoted, escaped and cut short."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def shown_name(name: str) -> str:
    """A file name for a problem line: as it is when plain, otherwise quoted and escaped."""
    return name if name.isprintable() and len(name) <= 100 else _quoted(name, 100)


def refusal_reason(error: OSError) -> str:
    return error.strerror or type(error).__name__
