"""Grading as a user of its own: ``python -m course_lib.grading.cohort SUBMISSIONS --out GRADEBOOK``
run as an unprivileged account (``nobody``, uid 65534), as the README recommends for a box where
the instructor's own account runs the hub.

The account owns nothing but the gradebook folder it is given; it reads the course checkout, its
Python and the handed-over submissions, and its sandbox needs unprivileged user namespaces. The
test switches to it with ``setpriv`` (util-linux), so it needs root: elsewhere it skips, saying
why. Under CI (``CI=true``) a machine that has root, ``setpriv`` and the account must run it.

The course's ``.venv`` is used as it is when the account can run it. When it cannot (a venv made
from an interpreter in a private home, ``/root/.pyenv``, as on some build machines), the test
makes a small venv the account can run from the system's Python of the same version, with the
course venv's site-packages added (``site.addsitedir`` in a ``.pth``), and grades with that.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest

from course_lib.exercise_files import course_exercise, exercise_file, solution_file
from course_lib.paths import REPO_ROOT
from needs_sandbox import IN_CI, require_sandbox

UID = GID = 65534  # nobody / nogroup
PAGING = "01_paging"


def as_grader(command: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    switch = [shutil.which("setpriv"), f"--reuid={UID}", f"--regid={GID}", "--clear-groups"]
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8"}
    return subprocess.run([*switch, *command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def cannot() -> str | None:
    """Why this machine cannot run a grader as another user; None when it can."""
    if os.geteuid() != 0:
        return "switching to an unprivileged account needs root (setpriv)"
    if shutil.which("setpriv") is None:
        return "setpriv (util-linux) is not installed"
    try:
        import pwd
        pwd.getpwuid(UID)
    except KeyError:
        return f"no account with uid {UID} (nobody)"
    return None


def python_for_grader(base: Path) -> str:
    """A Python the grader's account can run with the course's packages: the course's own, or a
    venv made from the system's Python of the same version around the course's site-packages."""
    probe = ("import os, sys, nbformat, IPython, course_lib; os.stat(os.path.realpath(sys.executable)); "
             "print(sys.base_prefix)")
    done = as_grader([sys.executable, "-c", probe], cwd=base)
    if done.returncode == 0 and done.stdout.strip() == sys.base_prefix:  # the same interpreter, reachable by its path
        return sys.executable
    system = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    if not system.exists():
        pytest.skip(f"the grader's account cannot run {sys.executable} ({done.stderr.strip()[-200:]}) and there is "
                    f"no {system} to make a venv it can run")
    shim = base / "grader-venv"
    subprocess.run([str(system), "-m", "venv", "--without-pip", str(shim)], check=True, capture_output=True)
    site_packages = next(Path(path) for path in sys.path
                         if path.startswith(sys.prefix) and path.endswith("site-packages"))
    purelib = next(shim.glob("lib/python*/site-packages"))
    (purelib / "course-venv.pth").write_text(f"import site; site.addsitedir({str(site_packages)!r})\n")
    subprocess.run(["chmod", "-R", "a+rX", str(shim)], check=True)
    return str(shim / "bin" / "python")


def hand_in(book, folder: Path) -> None:
    folder.mkdir(parents=True)
    nbformat.write(book, folder / exercise_file(PAGING))


def test_an_unprivileged_account_grades_a_cohort():
    reason = cannot()
    if reason:
        pytest.skip(reason)
    require_sandbox()
    base = Path(tempfile.mkdtemp(prefix="grader-user-", dir="/var/tmp" if os.access("/var/tmp", os.W_OK) else None))
    try:
        os.chmod(base, 0o755)
        submissions, gradebook, private = base / "submissions", base / "gradebook", base / "hub-state"
        starter = nbformat.read(course_exercise(PAGING), as_version=4)
        solved = nbformat.read(course_exercise(PAGING), as_version=4)
        answers = [cell for cell in nbformat.read(REPO_ROOT / "solutions" / solution_file(PAGING), as_version=4).cells
                   if "student" in cell.metadata.get("tags", [])]
        for cell, answer in zip([c for c in solved.cells if "student" in c.metadata.get("tags", [])], answers):
            cell.source = answer.source
        hand_in(solved, submissions / "alice")
        hand_in(starter, submissions / "bob")
        private.mkdir(mode=0o700)  # the hub owner's state: root's, mode 700
        (private / "jupyterhub_cookie_secret").write_text("root's secret")
        snoop = nbformat.read(course_exercise(PAGING), as_version=4)
        snoop.cells.insert(2, nbformat.v4.new_code_cell(
            f"open({str(private / 'jupyterhub_cookie_secret')!r}).read()"))
        hand_in(snoop, submissions / "mallory")
        subprocess.run(["chmod", "-R", "a+rX", str(submissions)], check=True)  # handed over, readable
        gradebook.mkdir()
        os.chown(gradebook, UID, GID)  # the one folder the grader's account may write
        python = python_for_grader(base)
        probe = as_grader(["bwrap", "--unshare-all", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev",
                           "true"], cwd=base)
        if probe.returncode != 0:
            message = f"bwrap cannot make user namespaces as uid {UID}: {probe.stderr.strip()}"
            if IN_CI:
                pytest.fail(message, pytrace=False)
            pytest.skip(message)
        done = as_grader([python, "-m", "course_lib.grading.cohort", str(submissions), "--out", str(gradebook),
                          "--exercise", PAGING, "--jobs", "1"], cwd=base)
        assert done.returncode == 0, done.stdout + done.stderr
        with open(gradebook / "grades.csv", newline="") as handle:
            rows = list(csv.DictReader(handle))
        scores = {}
        for row in rows:
            passed = str(row.get("passed", row.get("score", ""))).strip().lower() in ("1", "true", "yes", "pass")
            scores.setdefault(row["learner"], []).append(passed)
        assert all(scores["alice"]) and len(scores["alice"]) == 4, rows
        assert not any(scores["bob"]) and not any(scores["mallory"]), rows
        mallory = (gradebook / "feedback" / "mallory.md").read_text()
        assert "root's secret" not in mallory and "FileNotFoundError" in mallory, mallory
        assert all(path.stat().st_uid == UID for path in gradebook.rglob("*")), "written by the grader's account"
        assert (private / "jupyterhub_cookie_secret").read_text() == "root's secret"
    finally:
        shutil.rmtree(base, ignore_errors=True)
