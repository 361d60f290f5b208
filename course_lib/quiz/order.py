"""The order in which a learner sees a question's options: shuffled, and the same every time.

Shown in the bank's own order, a quiz could be passed blind (authors tend to write the right
option first). So cards show options in ``display_order``, a permutation fixed by the learner,
the question id and the option texts, and nothing else: the same learner sees the same order in
every session and on every machine, and different learners see different orders.

Invariant: the order is presentation only. Answers are checked and recorded in the bank's terms
(option indices into the bank's list, matching choices by their text), so grading and the
gradebook never depend on what was shown. A scorecard names its learner (see learner.py for
where the id comes from), so the order a learner saw can be rebuilt from it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def display_order(texts: Sequence[str], question_id: str, learner: str) -> list[int]:
    """Indices into ``texts`` in the order ``learner`` sees them: a permutation of
    ``range(len(texts))`` that depends only on the arguments (sha256 keys, no random state)."""

    def key(i: int) -> tuple[bytes, int]:
        return hashlib.sha256(f"{learner}\0{question_id}\0{texts[i]}".encode()).digest(), i

    return sorted(range(len(texts)), key=key)
