"""collect (course_lib/grading/collect.py): JupyterHub homes -> a SUBMISSIONS folder the cohort grader
reads. Real files in tmp_path; every hostile entry is refused and named, never followed, and nothing
hangs (a FIFO named like an exercise is one of them)."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
from pathlib import Path

import pytest

from course_lib.exercise_files import exercise_file, exercise_modules, old_exercise_file, solution_file
from course_lib.grading import cohort
from course_lib.grading.collect import MARKER, main
from course_lib.grading.sandbox import sandbox_problem
from course_lib.paths import REPO_ROOT
from course_lib.quiz.bank import load_bank
from course_lib.quiz.questions import SingleChoice
from course_lib.quiz.scorecard import Scorecard
from course_lib.workspace import sync

PAGING = exercise_file("01_paging")
PAGING_SOLUTION = REPO_ROOT / "solutions" / solution_file("01_paging")


@pytest.fixture(autouse=True)
def deadline():
    """Fail instead of hanging (a FIFO opened for reading without O_NONBLOCK would block forever)."""
    def expired(*_):
        raise TimeoutError("collect took longer than 60 s: something blocked")
    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def card(bank: str, learner: str = "learner-1", path: Path | None = None) -> Scorecard:
    """A scorecard with the first single-choice question answered (option 0): auto-saved at ``path`` when given."""
    quiz = load_bank(bank)
    scorecard = Scorecard(quiz, learner=learner, path=path)
    scorecard.answer(next(q.id for q in quiz.questions if isinstance(q, SingleChoice)), 0)
    return scorecard


def make_learner(homes: Path, name: str, notebook: Path | None, exported: str | None = None,
                 saved: tuple[str, ...] = ()) -> Path:
    """A home with a working copy, ``notebook`` as exercises/01_paging_exercise.ipynb, an exported card of quiz
    ``exported`` in notebooks/quiz.json and auto-saved cards of the ``saved`` quizzes."""
    course = homes / name / "course"
    (course / "exercises").mkdir(parents=True)
    (course / ".course-manifest.json").write_text('{"copied": {}, "offered": {}}')
    if notebook is not None:
        shutil.copyfile(notebook, course / "exercises" / PAGING)
    if exported:
        card(exported).export(course / "notebooks" / "quiz.json")
    for bank in saved:
        card(bank, path=homes / name / ".course-quizzes" / "learner-1" / f"{bank}.json")
    return homes / name


def run(homes: Path, out: Path, capsys, *extra: str) -> list[str]:
    assert main([str(homes), "--out", str(out), *extra]) == 0
    return capsys.readouterr().out.splitlines()


def tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def homes(tmp_path: Path) -> Path:
    """alice: a real working copy (workspace.sync) with the solved exercise, an exported 01 card and
    auto-saved 01 and 02 cards; bob: the unsolved exercise and an exported 03 card; carol: a working
    copy with nothing in it; lost+found: not a learner."""
    root = tmp_path / "homes"
    alice = root / "alice" / "course"
    sync(alice)
    shutil.copyfile(PAGING_SOLUTION, alice / "exercises" / PAGING)
    card("01_paging").export(alice / "notebooks" / "quiz_01.json")
    for bank in ("01_paging", "02_batching"):
        card(bank, path=root / "alice" / ".course-quizzes" / "learner-1" / f"{bank}.json")
    make_learner(root, "bob", REPO_ROOT / "exercises" / PAGING, exported="03_scheduler")
    make_learner(root, "carol", None)
    (root / "lost+found").mkdir()
    return root


def test_collect_then_grade_lists_every_learner(homes: Path, tmp_path: Path, capsys):
    out = tmp_path / "submissions"
    lines = run(homes, out, capsys, "--learners", "dave,alice")
    exercises = len(exercise_modules())
    assert lines[:4] == [f"alice: {exercises} exercises, 2 scorecards", "bob: 1 exercise, 1 scorecard",
                         "carol: submitted nothing", "dave: no home folder: never logged in"]
    assert sorted(os.listdir(out)) == [MARKER, "alice", "bob", "carol", "dave"]
    # the exported 01 card is kept and the auto-saved one dropped; the auto-saved 02 card fills in
    cards = sorted(p.name for p in (out / "alice").glob("*.json"))
    assert len(cards) == 2 and re.fullmatch(r"01_paging-1-notebooks__quiz_01-[0-9a-f]{8}\.json", cards[0])
    assert re.fullmatch(r"02_batching-2-saved-learner-1-[0-9a-f]{8}\.json", cards[1])
    assert (out / "alice" / PAGING).read_bytes() == PAGING_SOLUTION.read_bytes()
    assert os.listdir(out / "dave") == []

    gradebook = tmp_path / "gradebook"
    sandbox = ["--no-sandbox"] if sandbox_problem() else []
    assert cohort.main([str(out), "--out", str(gradebook), "--exercise", "01_paging", "--time-limit", "120",
                        *sandbox]) == 0
    with open(gradebook / "grades.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    status = {row["learner"]: row["status"] for row in rows}
    assert status == {"alice": "graded", "bob": "graded", "carol": "missing", "dave": "missing"}
    assert all(row["passed"] == "1" for row in rows if row["learner"] == "alice")
    assert not any(row["passed"] == "1" for row in rows if row["learner"] == "bob")
    summary = (gradebook / "summary.html").read_text()
    assert "01_paging" in summary and "03_scheduler" in summary and "02_batching" in summary


def test_a_second_run_gives_the_same_files_and_lines(homes: Path, tmp_path: Path, capsys):
    out = tmp_path / "submissions"
    first = run(homes, out, capsys, "--learners", "dave")
    before = tree(out)
    assert run(homes, out, capsys, "--learners", "dave") == first
    assert tree(out) == before
    assert not [name for name in os.listdir(out) if name.startswith(".collect-")]


def test_a_learner_gone_since_an_earlier_run_is_removed(homes: Path, tmp_path: Path, capsys):
    out = tmp_path / "submissions"
    run(homes, out, capsys)
    shutil.rmtree(homes / "bob")
    lines = run(homes, out, capsys)
    assert "removed bob/ (collected by an earlier run; no longer in HUB_HOMES)" in lines
    assert sorted(os.listdir(out)) == [MARKER, "alice", "carol"]


def test_an_out_folder_with_other_files_is_refused_unless_forced(homes: Path, tmp_path: Path, capsys):
    out = tmp_path / "submissions"
    (out / "notes").mkdir(parents=True)
    with pytest.raises(SystemExit) as stopped:
        main([str(homes), "--out", str(out)])
    assert stopped.value.code == 2
    assert "holds files collect did not write (notes)" in capsys.readouterr().err
    assert os.listdir(out) == ["notes"]
    assert "left alone (not written by collect): notes" in run(homes, out, capsys, "--force")
    assert (out / "notes").is_dir() and (out / "alice" / PAGING).is_file()


def test_an_unsafe_learners_name_is_an_error(homes: Path, tmp_path: Path, capsys):
    with pytest.raises(SystemExit):
        main([str(homes), "--out", str(tmp_path / "out"), "--learners", "../etc"])
    assert "not a safe folder name" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_hostile_homes_are_refused_and_reported_never_followed(homes: Path, tmp_path: Path, capsys):
    alice = homes / "alice"
    mallory = make_learner(homes, "mallory", None, saved=("04_roofline",)) / "course"
    os.symlink(alice / "course" / "exercises" / PAGING, mallory / "exercises" / PAGING)
    os.symlink("/etc/passwd", mallory / "exercises" / exercise_file("02_batching"))
    os.mkfifo(mallory / "exercises" / exercise_file("03_scheduler"))
    with open(mallory / "exercises" / exercise_file("04_roofline"), "wb") as big:
        big.truncate(cohort.MAX_NOTEBOOK_BYTES + 1)
    (mallory / "notebooks").mkdir()
    os.symlink(alice / "course" / "notebooks" / "quiz_01.json", mallory / "notebooks" / "quiz_01.json")
    (mallory / "notebooks" / "big.json").write_bytes(b" " * (2**20 + 1))
    (mallory / "notebooks" / "settings.json").write_text(json.dumps({"theme": "dark"}))
    os.mkfifo(mallory / "notebooks" / "pipe.json")
    os.symlink(alice, mallory / "notebooks" / "alice")  # a folder link: not searched
    os.symlink(alice / ".course-quizzes" / "learner-1", mallory.parent / ".course-quizzes" / "alias")
    (homes / "trudy").mkdir()
    os.symlink(alice / "course", homes / "trudy" / "course")
    os.symlink(alice, homes / "linked")
    collectives = exercise_file("05_collectives")
    os.link(alice / "course" / "exercises" / collectives, mallory / "exercises" / collectives)
    odd = make_learner(homes, "we ird\n", PAGING_SOLUTION)

    out = tmp_path / "submissions"
    lines = run(homes, out, capsys)
    by_learner = {line.split(":", 1)[0]: line for line in lines}
    link = "a symbolic link; not followed"
    assert by_learner["linked"] == f"linked: submitted nothing; refused: linked/: the home folder is {link} " \
                                   "(the learner must replace it with the real file or folder)"
    assert by_learner["trudy"].startswith(f"trudy: submitted nothing; refused: course/: {link}")
    line = by_learner["mallory"]
    assert line.startswith("mallory: 0 exercises, 1 scorecard; refused: ")
    for refused in (f"course/exercises/{PAGING}: {link}",
                    f"course/exercises/{exercise_file('02_batching')}: {link}",
                    f"course/exercises/{exercise_file('03_scheduler')}: not a regular file (a named pipe)",
                    f"course/exercises/{exercise_file('04_roofline')}: larger than 32 MiB",
                    f"course/notebooks/quiz_01.json: {link}", "course/notebooks/big.json: larger than 1 MiB",
                    "course/notebooks/settings.json: not a scorecard (no 'quiz' name)",
                    "course/notebooks/pipe.json: not a regular file (a named pipe)",
                    f"course/notebooks/alice: {link}", f".course-quizzes/alias/: {link}",
                    f"course/exercises/{exercise_file('05_collectives')}: a hard link to a file elsewhere"):
        assert refused in line, refused
    assert "'we ird\\n': not collected: not a safe folder name" in "\n".join(lines)
    assert sorted(os.listdir(out)) == [MARKER, "alice", "bob", "carol", "linked", "mallory", "trudy"]
    assert [re.sub(r"-[0-9a-f]{8}\.json$", "", name) for name in os.listdir(out / "mallory")] == [
        "04_roofline-2-saved-learner-1"]
    assert os.listdir(out / "trudy") == [] and os.listdir(out / "linked") == []
    assert not any(p.is_symlink() for p in out.rglob("*"))
    assert odd.exists() and not (out / odd.name).exists()


def test_a_scorecard_deep_in_folders_named_in_any_script_is_collected(homes: Path, tmp_path: Path, capsys):
    """A card's name in SUBMISSIONS stays short and ASCII however long and non-Latin its path is
    (three bytes per CJK letter would pass the file system's 255-byte limit)."""
    deep = homes / "bob" / "course" / ("界" * 80) / ("界" * 80)
    deep.mkdir(parents=True)
    card = homes / "alice" / "course" / "notebooks" / "quiz_01.json"
    (deep / "x.json").write_bytes(card.read_bytes())
    line = next(line for line in run(homes, tmp_path / "out", capsys) if line.startswith("bob:"))
    assert line == "bob: 1 exercise, 2 scorecards"
    names = [p.name for p in (tmp_path / "out" / "bob").glob("*.json")]
    assert all(len(name.encode()) <= 120 and name.isascii() for name in names)


def test_too_many_files_are_not_all_looked_at(homes: Path, tmp_path: Path, capsys, monkeypatch):
    from course_lib.grading import collect
    monkeypatch.setattr(collect, "MAX_ENTRIES", 30)
    deep = homes / "bob" / "course" / "a" / "b" / "c" / "d" / "e"
    deep.mkdir(parents=True)
    for number in range(40):
        (homes / "bob" / "course" / "a" / f"{number:02}.txt").write_text("x")
    line = next(line for line in run(homes, tmp_path / "out", capsys) if line.startswith("bob:"))
    assert "more than 30 files in all; only the first" in line


def test_an_exercise_under_its_old_name_is_collected_and_graded_unless_the_new_name_is_there(tmp_path: Path, capsys):
    """Working copies made before exercises had their own names: erin's solved exercise is still under the
    old name; fay has both (the new one untouched). The old name counts only where the new one is missing."""
    homes = tmp_path / "homes"
    old = old_exercise_file("01_paging")
    erin = make_learner(homes, "erin", None) / "course" / "exercises"
    shutil.copyfile(PAGING_SOLUTION, erin / old)
    fay = make_learner(homes, "fay", REPO_ROOT / "exercises" / PAGING) / "course" / "exercises"
    shutil.copyfile(PAGING_SOLUTION, fay / old)
    out = tmp_path / "submissions"
    assert run(homes, out, capsys) == [
        f"erin: 1 exercise, 0 scorecards; {old} (the exercise's old name; graded)",
        f"fay: 1 exercise, 0 scorecards; {old} (the exercise's old name; {PAGING}, beside it, is graded)",
        f"wrote 2 learner folder(s) in {out}; grade them with ./course grade-cohort {out}"]
    assert sorted(os.listdir(out / "erin")) == [old] and sorted(os.listdir(out / "fay")) == sorted([old, PAGING])

    gradebook = tmp_path / "gradebook"
    sandbox = ["--no-sandbox"] if sandbox_problem() else []
    assert cohort.main([str(out), "--out", str(gradebook), "--exercise", "01_paging", "--time-limit", "120",
                        *sandbox]) == 0
    with open(gradebook / "grades.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert {row["exercise"] for row in rows} == {"01_paging"}  # the module id, whatever the file was called
    assert all(row["passed"] == "1" for row in rows if row["learner"] == "erin")
    assert not any(row["passed"] == "1" for row in rows if row["learner"] == "fay")
    assert f"{old}, the exercise's old name, was graded" in (gradebook / "feedback" / "erin.md").read_text()
    assert f"{PAGING} was graded; {old}, the exercise's old name, was handed in too and not graded" in \
        (gradebook / "feedback" / "fay.md").read_text()
