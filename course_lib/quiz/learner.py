"""Who the learner is, and where their quiz answers are kept between sessions.

The learner id fixes the order a learner sees options in (order.py) and names their scorecards.
It is ``$COURSE_LEARNER`` when set (an instructor can set it to a student id). Otherwise it is a
random id made on first use and kept in ``~/.course-learner``: in Docker and JupyterHub images
the user name is ``jovyan`` or ``root`` for everyone, so it cannot tell learners apart. Only
when the home folder cannot be written does the id fall back to the user name.

Invariant: once ``~/.course-learner`` exists, ``learner_id()`` returns what it holds, so the id
(and the option order) is the same in every kernel and session in that home.
"""

from __future__ import annotations

import getpass
import os
import re
import secrets
from pathlib import Path

LEARNER_VARIABLE = "COURSE_LEARNER"
LEARNER_FILE = ".course-learner"
ANSWERS_FOLDER = ".course-quizzes"


def learner_id() -> str:
    """``$COURSE_LEARNER`` if set and not blank, else the id in ``~/.course-learner`` (created
    with a random id when missing), else the OS user name, else ``"learner"``."""
    name = os.environ.get(LEARNER_VARIABLE, "").strip()
    if name:
        return name
    try:
        return _stored_id(Path.home() / LEARNER_FILE)
    except (OSError, RuntimeError):  # no home, or not writable: RuntimeError when none is known
        pass
    try:
        return getpass.getuser()
    except (KeyError, OSError, ImportError):  # no user name in this environment (some containers)
        return "learner"


def _stored_id(path: Path) -> str:
    """The id in ``path``, after writing a new random one there if the file is missing or blank.
    Created exclusively, so two kernels starting at once agree on the id."""
    new = f"learner-{secrets.token_hex(6)}"
    try:
        with path.open("x", encoding="utf-8") as file:
            file.write(new + "\n")
        return new
    except FileExistsError:
        stored = path.read_text(encoding="utf-8").strip()
    if stored:
        return stored
    path.write_text(new + "\n", encoding="utf-8")
    return new


def answers_path(quiz: str, learner: str) -> Path:
    """Where ``learner``'s answers to bank ``quiz`` (a file name such as ``01_paging.yaml``) are
    kept between sessions: ``~/.course-quizzes/<learner>/<quiz stem>.json``."""
    folder = re.sub(r"[^\w.-]", "_", learner).lstrip(".") or "learner"
    return Path.home() / ANSWERS_FOLDER / folder / f"{Path(quiz).stem}.json"
