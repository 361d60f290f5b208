"""The order in which a learner sees a question's options: shuffled, and the same every time.

Shown in the bank's own order, a quiz could be passed blind (authors tend to write the right
option first). So cards show options in ``display_order``, a permutation fixed by the learner,
the question id and the option texts, and nothing else: the same learner sees the same order in
every session and on every machine, and different learners see different orders.

Invariant: the order is presentation only. Answers are checked and recorded in the bank's terms
(option indices into the bank's list, matching choices by their text), so grading and the
gradebook never depend on what was shown. A scorecard names its learner, so the order a learner
saw can be rebuilt from it.

The learner is the ``COURSE_LEARNER`` environment variable when it is set (an instructor can set
it to a student id), otherwise the operating system's user name.
"""

from __future__ import annotations

import getpass
import hashlib
import os
from collections.abc import Sequence

LEARNER_VARIABLE = "COURSE_LEARNER"


def learner_id() -> str:
    """``$COURSE_LEARNER`` if set and not blank, else the OS user name, else ``"learner"``."""
    name = os.environ.get(LEARNER_VARIABLE, "").strip()
    if name:
        return name
    try:
        return getpass.getuser()
    except (KeyError, OSError, ImportError):  # no user name in this environment (some containers)
        return "learner"


def display_order(texts: Sequence[str], question_id: str, learner: str) -> list[int]:
    """Indices into ``texts`` in the order ``learner`` sees them: a permutation of
    ``range(len(texts))`` that depends only on the arguments (sha256 keys, no random state)."""

    def key(i: int) -> tuple[bytes, int]:
        return hashlib.sha256(f"{learner}\0{question_id}\0{texts[i]}".encode()).digest(), i

    return sorted(range(len(texts)), key=key)
