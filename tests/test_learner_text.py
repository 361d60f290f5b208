"""What learners read names real sources: never the course's internal word for its source material."""

import json
import re

import pytest

from course_lib.paths import REPO_ROOT

# "the seeds", "the seeds' scenario", "seed material": a random seed is fine.
INTERNAL_WORD = re.compile(r"\bseeds'|\bthe seeds\b|\bseed (?:files?|material|texts?)\b", re.IGNORECASE)
NOTEBOOKS = sorted(p for folder in ("notebooks", "exercises", "solutions") for p in (REPO_ROOT / folder).glob("*.ipynb"))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_notebooks_never_say_seeds(notebook):
    """Markdown, code and printed output alike: learners read all three."""
    for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
        texts = ["".join(cell["source"])] + ["".join(o.get("text", "")) for o in cell.get("outputs", [])]
        for text in texts:
            match = INTERNAL_WORD.search(text)
            assert not match, f"{notebook.name}: {match.group(0)!r} in {text[:120]!r}"


@pytest.mark.parametrize("bank", sorted((REPO_ROOT / "quizzes").glob("*.yaml")), ids=lambda p: p.name)
def test_quiz_text_never_says_seeds(bank):
    match = INTERNAL_WORD.search(bank.read_text(encoding="utf-8"))
    assert not match, f"{bank.name} says {match.group(0)!r}"
