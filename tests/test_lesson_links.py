"""Lessons link to files that exist, and every lesson ends by pointing to its exercise and what comes next."""

import json
import re
from pathlib import Path

import pytest

from course_lib.paths import REPO_ROOT

NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))
LESSONS = [p for p in NOTEBOOKS if re.match(r"\d\d_", p.name) and not p.name.startswith("00_")]
LINK = re.compile(r"\]\(([^)\s]+\.ipynb)\)")


def _markdown(path: Path) -> list[str]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebook_link_resolves(notebook):
    for text in _markdown(notebook):
        for target in LINK.findall(text):
            assert (notebook.parent / target).resolve().exists(), f"{notebook.name} links to missing {target}"


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.name)
def test_lesson_ends_with_links_to_its_exercise_and_the_next_step(lesson):
    last = _markdown(lesson)[-1]
    targets = LINK.findall(last)
    exercise = REPO_ROOT / "exercises" / lesson.name
    if exercise.exists():
        assert f"../exercises/{lesson.name}" in targets, f"{lesson.name} must end with a link to its exercise"
    assert any(not t.startswith("../") for t in targets), f"{lesson.name} must end with a link to the next lesson"


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.name)
def test_lesson_says_how_to_bring_widgets_back(lesson):
    assert "Run All Cells" in _markdown(lesson)[0]
