"""Lessons link to files that exist, and every lesson ends by pointing to its exercise, the next lesson
and the course home (course_lib/outline.py says which)."""

import json
import re
from pathlib import Path

import pytest

from course_lib import outline
from course_lib.exercise_files import EXERCISE, exercise_file, exercise_modules, module_of
from course_lib.paths import REPO_ROOT

NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))
LESSONS = [p for p in NOTEBOOKS if re.match(r"\d\d_", p.name) and not p.name.startswith("00_")]
LINK = re.compile(r"\]\(([^)\s]+\.ipynb)\)")


def _markdown(path: Path) -> list[str]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]


EXERCISES = sorted((REPO_ROOT / "exercises").glob("*.ipynb"))
SOLUTIONS = sorted((REPO_ROOT / "solutions").glob("*.ipynb"))


@pytest.mark.parametrize("notebook", NOTEBOOKS + EXERCISES + SOLUTIONS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_notebook_link_resolves(notebook):
    for text in _markdown(notebook):
        for target in LINK.findall(text):
            assert (notebook.parent / target).resolve().exists(), f"{notebook.name} links to missing {target}"


@pytest.mark.parametrize("lesson", outline.OUTLINE, ids=lambda entry: entry.file)
def test_lesson_ends_with_links_to_its_exercise_the_next_lesson_and_the_course_home(lesson):
    """The hand-off: the last cell links the exercise (if any), the next lesson by its outline name
    ('Module 05 · Collective communication primitives'), and the course home."""
    last = _markdown(REPO_ROOT / "notebooks" / lesson.file)[-1]
    targets = LINK.findall(last)
    if lesson.exercise:
        assert f"../exercises/{lesson.exercise}" in targets, f"{lesson.file} must end with a link to its exercise"
    following = outline.next_lesson(lesson)
    if following:
        assert f"[{following.name}]({following.file})" in last, \
            f"{lesson.file} must end with a link '[{following.name}]({following.file})' to the next lesson"
    assert outline.HOME in targets, f"{lesson.file} must end with a link to the course home, {outline.HOME}"


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.name)
def test_lesson_says_how_to_bring_widgets_back(lesson):
    assert "Run All Cells" in _markdown(lesson)[0]


GRADE_COMMAND = re.compile(r"\./course grade (\S+?)`")
NEW_TERMINAL = "File ▸ New ▸ Terminal"


@pytest.mark.parametrize("lesson", [entry for entry in outline.OUTLINE if entry.exercise], ids=lambda entry: entry.file)
def test_hand_off_says_to_grade_the_exercise_in_a_terminal_of_the_working_copy(lesson):
    """JupyterLab's Terminal opens in the learner's working copy, whose own ./course grades
    exercises/NAME.ipynb: the hand-off says exactly that, as every exercise does."""
    last = _markdown(REPO_ROOT / "notebooks" / lesson.file)[-1]
    assert GRADE_COMMAND.findall(last) == [f"exercises/{lesson.exercise}"] and NEW_TERMINAL in last, \
        f"{lesson.file}'s 'What next' must say: open {NEW_TERMINAL} and run `./course grade exercises/{lesson.exercise}`"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_every_grade_command_in_a_lesson_is_the_working_copys(notebook):
    """A notebook runs in the working copy, so the grade command it shows takes the copy's path
    (exercises/NN_name_exercise.ipynb, not my-work/exercises/... nor the exercise's old name
    exercises/NN_name.ipynb) and the cell says where to open the terminal."""
    for text in _markdown(notebook):
        for path in GRADE_COMMAND.findall(text):
            module = module_of(path.removeprefix("exercises/"), EXERCISE)
            assert path.startswith("exercises/") and module in (*exercise_modules(), "NN_name") \
                and NEW_TERMINAL in text, f"{notebook.name} shows `./course grade {path}`; say: open " \
                f"{NEW_TERMINAL} and run `./course grade exercises/{exercise_file('NN_name')}`"


@pytest.mark.parametrize("notebook", EXERCISES + SOLUTIONS, ids=lambda p: p.name)
def test_an_exercise_tells_the_learner_to_grade_it_under_its_own_name(notebook):
    """The exercise (and the solution it is built from) names the file the learner has open, under the
    name it has in the working copy: exercises/04_roofline_exercise.ipynb, never the lesson's name."""
    commands = [path for text in _markdown(notebook) for path in GRADE_COMMAND.findall(text)]
    own = f"exercises/{exercise_file(module_of(notebook.name))}"
    assert commands and set(commands) == {own}, f"{notebook.name} shows {commands}; say `./course grade {own}`"
