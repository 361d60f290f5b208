"""What a graded notebook can read: only what grading needs (the sandbox's allow-list).

A snooping learner hands in exercise 01 with one added cell per target: each cell reads its
target and raises an exception whose message holds what it read, or says the target could not
be read. An exception message is the real way out: the grader puts it in the learner's feedback
(``- note: ... raised RuntimeError: ...``), which the learner gets back. Every target holds a
token; a token in the feedback is a leak.

The targets sit where they sit on a hub box: the hub's state at its old default inside the
checkout (``.hub/jupyterhub_cookie_secret`` and ``.hub/jupyterhub.sqlite``, stand-ins written only
where no real hub state is there), an earlier cohort's gradebook and submissions left in the course
folder, ``solutions/``, another learner's hub home, another learner's submission, the grader's home
(``./course grade`` and the cohort grader), ``/etc/shadow`` (readable when grading runs as root),
and what ``/proc/1/cmdline`` (the sandbox's init) shows. Under the old deny-list sandbox
(``--ro-bind / /`` with the submissions, the gradebook and the grader's home hidden) the checkout's
targets, the other learner's home, ``./course grade``'s home, ``/etc/shadow`` and the
submissions' path in ``/proc/1/cmdline`` all came back in the feedback.

These tests skip on a learner's machine without a working bubblewrap, but fail under CI.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

import nbformat
import pytest

from course_lib.exercise_files import course_exercise, exercise_file, solution_file
from course_lib.grading.__main__ import grade_file
from course_lib.grading.cohort import grade_cohort
from course_lib.grading.grade import prepare_exercise
from course_lib.grading.gradebook import write_gradebook
from course_lib.grading.quizzes import collect_quizzes, load_banks
from course_lib.grading.sandbox import Limits
from course_lib.paths import REPO_ROOT
from needs_sandbox import require_sandbox

PAGING = "01_paging"
TOKEN = f"leak{uuid.uuid4().hex[:12]}"
LIMITS = Limits(time_s=120, memory_bytes=4 * 2**30)

PROBE = '''import errno as _errno
try:
    with open(@PATH@, "rb") as _handle:
        _seen = _handle.read(4096)
except OSError as _error:
    raise RuntimeError(@NAME@ + " unreadable: " + _errno.errorcode.get(_error.errno, str(_error.errno))) from None
raise RuntimeError(@NAME@ + " LEAKED: " + _seen.decode("utf-8", "replace").replace("\\x00", " ")[:300])
'''


def probe_cell(name: str, path: str):
    return nbformat.v4.new_code_cell(PROBE.replace("@PATH@", repr(path)).replace("@NAME@", repr(name)))


def snooper(targets: dict[str, str]):
    """The exercise's starter with one added probe cell per target, right after the set-up."""
    book = nbformat.read(course_exercise(PAGING), as_version=4)
    first = next(i for i, cell in enumerate(book.cells) if "student" in cell.metadata.get("tags", []))
    for offset, (name, path) in enumerate(targets.items()):
        book.cells.insert(first + offset, probe_cell(name, path))
    return book


def _outside_tmp() -> Path:
    """A folder on disk outside /tmp (the sandbox's fresh /tmp would hide anything under /tmp)."""
    base = Path("/var/tmp")
    if base.is_dir() and os.access(base, os.W_OK) and not base.resolve().is_relative_to("/tmp"):
        return Path(tempfile.mkdtemp(prefix="allow-list-", dir=base))
    pytest.skip("needs a writable /var/tmp outside /tmp (a cohort under /tmp is out of the sandbox's sight anyway)")


class StandIns:
    """Files written for the test where a hub box would have them; removed afterwards.
    (tests/browser/test_hub_cohort.py, which watches the checkout, knows their names.)"""

    def __init__(self):
        self.made: list[Path] = []
        self.blocked: dict[str, str] = {}

    def write(self, name: str, path: Path, text: str) -> None:
        if path.exists():  # real state (a hub ran from this checkout): never overwrite it
            self.blocked[name] = f"{path} exists (real hub state?); the test leaves it alone"
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        self.made.append(path)

    def remove(self, created_dirs: list[Path]) -> None:
        for path in self.made:
            path.unlink(missing_ok=True)
        for folder in created_dirs:
            shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def snooped():
    require_sandbox()
    base = _outside_tmp()
    stand_ins = StandIns()
    created = [folder for folder in (REPO_ROOT / "gradebook-week1", REPO_ROOT / "submissions-week1")
               if not folder.exists()]
    hub_folder_made = not (REPO_ROOT / ".hub").exists()
    if hub_folder_made:
        created.append(REPO_ROOT / ".hub")
    try:
        stand_ins.write("cookie secret", REPO_ROOT / ".hub" / "jupyterhub_cookie_secret", f"{TOKEN}-cookie\n")
        stand_ins.write("hub database", REPO_ROOT / ".hub" / "jupyterhub.sqlite", f"SQLite format 3 {TOKEN}-db\n")
        stand_ins.write("old gradebook", REPO_ROOT / "gradebook-week1" / "feedback" / "alice.md",
                        f"{TOKEN}-gradebook alice,0/4\n")
        stand_ins.write("old submission", REPO_ROOT / "submissions-week1" / "alice" / exercise_file(PAGING),
                        f"{TOKEN}-submission\n")
        homes, root, out = base / "homes", base / "submissions", base / "gradebook"
        bob_home = homes / "bob" / "course" / "exercises" / exercise_file(PAGING)
        bob_home.parent.mkdir(parents=True)
        bob_home.write_text(f"{TOKEN}-bob-home\n")
        (root / "bob").mkdir(parents=True)
        (root / "bob" / "notes.txt").write_text(f"{TOKEN}-bob-submission\n")
        out.mkdir()
        targets = {
            "cookie secret": str(REPO_ROOT / ".hub" / "jupyterhub_cookie_secret"),
            "hub database": str(REPO_ROOT / ".hub" / "jupyterhub.sqlite"),
            "old gradebook": str(REPO_ROOT / "gradebook-week1" / "feedback" / "alice.md"),
            "old submission": str(REPO_ROOT / "submissions-week1" / "alice" / exercise_file(PAGING)),
            "solutions": str(REPO_ROOT / "solutions" / solution_file(PAGING)),
            "other learner's home": str(bob_home),
            "other learner's submission": str(root / "bob" / "notes.txt"),
            "shadow": "/etc/shadow",
            "init cmdline": "/proc/1/cmdline",
        }
        nbformat.write(snooper(targets), (root / "mallory").mkdir() or root / "mallory" / exercise_file(PAGING))
        exercise = prepare_exercise(course_exercise(PAGING))
        grades = grade_cohort(root, [exercise], lambda *_: None, jobs=1, out=out, limits=LIMITS, isolate=True,
                              cell_timeout_s=60)
        written = write_gradebook(grades, collect_quizzes(root, load_banks()), out)
        feedback = (out / "feedback" / "mallory.md").read_text()
        assert written
        yield {"feedback": feedback, "blocked": stand_ins.blocked, "root": root, "out": out, "base": base}
    finally:
        stand_ins.remove(created)
        shutil.rmtree(base, ignore_errors=True)


def seen(snooped, name: str) -> str:
    """The feedback line the probe of ``name`` produced."""
    if name in snooped["blocked"]:
        pytest.skip(snooped["blocked"][name])
    lines = [line for line in snooped["feedback"].splitlines() if f"RuntimeError: {name} " in line]
    assert len(lines) == 1, snooped["feedback"]  # the probe ran and its message reached the feedback
    return lines[0]


def assert_absent(snooped, name: str) -> None:
    """The probe of ``name`` found nothing there (ENOENT), and none of the planted token came back."""
    line = seen(snooped, name)
    assert TOKEN not in line and f"{name} unreadable: ENOENT" in line, line


@pytest.mark.parametrize("name", ["cookie secret", "hub database"])
def test_the_hubs_state_at_its_old_default_in_the_checkout_is_unreadable(snooped, name):
    assert_absent(snooped, name)


def test_an_earlier_cohorts_gradebook_and_submissions_in_the_course_folder_are_unreadable(snooped):
    for name in ("old gradebook", "old submission"):
        assert_absent(snooped, name)


def test_the_solutions_are_unreadable(snooped):
    line = seen(snooped, "solutions")
    assert "solutions unreadable: ENOENT" in line, line
    assert "BEGIN SOLUTION" not in snooped["feedback"]


def test_another_learners_home_and_submission_are_unreadable(snooped):
    for name in ("other learner's home", "other learner's submission"):
        assert_absent(snooped, name)


def test_etc_shadow_is_unreadable(snooped):
    line = seen(snooped, "shadow")
    assert "shadow unreadable" in line, line


def test_the_sandboxs_init_command_line_names_no_host_folder(snooped):
    line = seen(snooped, "init cmdline")
    assert "LEAKED" in line, line  # it is readable: it must show nothing that matters
    for folder in (snooped["root"], snooped["out"], snooped["base"]):
        assert str(folder) not in line, line
    assert "--tmpfs" not in line and "--ro-bind" not in line, line  # the mounts are not on the command line


def test_the_grader_s_home_is_unreadable_with_course_grade(monkeypatch):
    """``./course grade`` hides nothing by name: under the deny-list its caller's home was readable."""
    require_sandbox()
    base = _outside_tmp()
    try:
        home = base / "home"
        (home / ".ssh").mkdir(parents=True)
        (home / ".ssh" / "id_ed25519").write_text(f"{TOKEN}-key\n")
        monkeypatch.setenv("HOME", str(home))
        book = snooper({"grader home": str(home / ".ssh" / "id_ed25519")})
        notebook = base / "mine" / exercise_file(PAGING)
        notebook.parent.mkdir()
        nbformat.write(book, notebook)
        grade = grade_file(notebook)
        notes = "\n".join(grade.notes)
        assert "grader home unreadable: ENOENT" in notes and TOKEN not in notes, notes
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_the_grader_s_home_is_unreadable_in_a_cohort(monkeypatch):
    require_sandbox()
    base = _outside_tmp()
    try:
        home = base / "home"
        home.mkdir()
        (home / "secret.txt").write_text(f"{TOKEN}-home\n")
        monkeypatch.setenv("HOME", str(home))
        root, out = base / "submissions", base / "gradebook"
        (root / "mallory").mkdir(parents=True)
        nbformat.write(snooper({"grader home": str(home / "secret.txt")}), root / "mallory" / exercise_file(PAGING))
        grades = grade_cohort(root, [prepare_exercise(course_exercise(PAGING))], lambda *_: None, out=out,
                              limits=LIMITS, isolate=True, cell_timeout_s=60)
        notes = "\n".join(grades[0].notes)
        assert "grader home unreadable: ENOENT" in notes and TOKEN not in notes, notes
    finally:
        shutil.rmtree(base, ignore_errors=True)
