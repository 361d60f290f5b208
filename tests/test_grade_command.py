"""``./course grade`` (course_lib/grading/__main__.py) pointed at the wrong notebook: the checkout's own
exercise is not graded and the learner's copy is named; a notebook whose cells all equal the course's
exercise is graded with a note that says so and where the learner's copy is; a notebook under the
exercise's old name is graded as its module, with a note giving the new name."""

from __future__ import annotations

import shutil

import nbformat
import pytest

from course_lib.exercise_files import course_exercise, exercise_file, old_exercise_file, solution_file
from course_lib.grading.__main__ import build_targets
from course_lib.grading.__main__ import main as grade_main
from course_lib.grading.__main__ import unchanged_note
from course_lib.paths import REPO_ROOT

NAME = exercise_file("01_paging")
COURSE_COPY = course_exercise("01_paging")
SOLVED = REPO_ROOT / "solutions" / solution_file("01_paging")


@pytest.fixture
def working_copy(tmp_path, monkeypatch):
    """A learner's working copy holding the exercise, as ./course lab makes it."""
    work = tmp_path / "work"
    (work / "exercises").mkdir(parents=True)
    shutil.copyfile(COURSE_COPY, work / "exercises" / NAME)
    monkeypatch.setenv("COURSE_WORKDIR", str(work))
    return work


@pytest.mark.parametrize("how", ["absolute", "relative to the checkout", "through a link"])
def test_the_checkouts_own_exercise_is_not_graded_and_the_learners_copy_is_named(working_copy, tmp_path,
                                                                                   monkeypatch, capsys, how):
    path = str(COURSE_COPY)
    if how == "relative to the checkout":
        monkeypatch.chdir(REPO_ROOT)
        path = f"exercises/{NAME}"
    elif how == "through a link":
        (tmp_path / "link").mkdir()
        (tmp_path / "link" / NAME).symlink_to(COURSE_COPY)
        path = str(tmp_path / "link" / NAME)
    assert grade_main([path]) == 1
    out = capsys.readouterr().out
    assert "the course's own copy of the exercise" in out and f"{path}: not graded" in out
    assert f"./course grade {working_copy / 'exercises' / NAME}" in out and "Task 1" not in out


def test_an_unchanged_copy_is_graded_with_a_note_naming_the_learners_copy(working_copy, tmp_path, capsys):
    download = tmp_path / "downloads" / NAME  # byte for byte the course's exercise
    download.parent.mkdir()
    shutil.copyfile(COURSE_COPY, download)
    assert grade_main([str(download)]) == 1
    out = capsys.readouterr().out
    assert "0/4 tasks, FAIL" in out
    assert f"note: {download} is the course's exercise unchanged" in out
    assert f"./course grade {working_copy / 'exercises' / NAME}" in out


def test_the_note_on_the_learners_own_unchanged_copy_says_to_save_it(working_copy, monkeypatch):
    mine = working_copy / "exercises" / NAME
    book = nbformat.read(mine, as_version=4)  # run, not edited: outputs do not count as work
    first_code = next(cell for cell in book.cells if cell.cell_type == "code")
    first_code.outputs = [nbformat.v4.new_output("stream", name="stdout", text="ran\n")]
    nbformat.write(book, mine)
    monkeypatch.chdir(working_copy)
    note = unchanged_note(f"exercises/{NAME}")
    assert note.startswith(f"exercises/{NAME} is the course's exercise unchanged") and "Save Notebook" in note


def test_a_notebook_with_work_in_it_gets_no_note(working_copy):
    solved = working_copy / "exercises" / NAME
    shutil.copyfile(SOLVED, solved)
    assert unchanged_note(solved) is None
    book = nbformat.read(COURSE_COPY, as_version=4)
    book.cells.append(nbformat.v4.new_code_cell("print('my own cell')"))  # any edit counts
    nbformat.write(book, solved)
    assert unchanged_note(solved) is None


def test_build_names_pick_the_exercise_the_lesson_or_both():
    """A path picks a module's solution (and so its exercise) or its lesson, a bare module id both."""
    solution = REPO_ROOT / "solutions" / solution_file("03_scheduler")
    lesson = REPO_ROOT / "notebooks" / "03_scheduler.ipynb"
    assert build_targets([f"solutions/{solution_file('03_scheduler')}"]) == ([solution], [])
    assert build_targets([f"exercises/{exercise_file('03_scheduler')}"]) == ([solution], [])
    assert build_targets(["notebooks/03_scheduler.ipynb"]) == ([], [lesson])
    assert build_targets(["03_scheduler"]) == ([solution], [lesson])
    assert build_targets(["notebooks/10_review.ipynb", f"solutions/{solution_file('01_paging')}"]) == (
        [SOLVED], [REPO_ROOT / "notebooks" / "10_review.ipynb"])
    everything = build_targets([])
    assert solution in everything[0] and lesson in everything[1]
    for wrong in ("03_schedular", "drafts/03_scheduler.ipynb"):
        with pytest.raises(ValueError, match="the modules are 00_setup"):
            build_targets([wrong])


# --- the exercise's old name (04_roofline.ipynb, before exercises had their own) -------------------

def test_an_old_name_copy_is_graded_as_its_module_with_a_note_giving_the_new_name(working_copy, monkeypatch, capsys):
    old = working_copy / "exercises" / old_exercise_file("01_paging")
    (working_copy / "exercises" / NAME).rename(old)  # a working copy made before the rename, never refreshed
    shutil.copyfile(SOLVED, old)
    monkeypatch.chdir(working_copy)
    assert grade_main([f"exercises/{old.name}"]) == 0
    out = capsys.readouterr().out
    assert "4/4 tasks, PASS" in out
    assert (f"note: exercises/01_paging.ipynb has the exercise's old name and was graded as module 01_paging. "
            f"The exercise is now {NAME}: ./course refresh renames the one in your working copy") in out


def test_an_old_name_copy_beside_the_new_one_is_graded_and_the_new_one_named_as_the_graded_one(working_copy,
                                                                                                monkeypatch, capsys):
    shutil.copyfile(SOLVED, working_copy / "exercises" / old_exercise_file("01_paging"))
    monkeypatch.chdir(working_copy)
    assert grade_main([f"exercises/{old_exercise_file('01_paging')}"]) == 0
    assert (f"exercises/{NAME}, its new name, is beside it: that is the file your course collects and grades, "
            "so move your work there.") in capsys.readouterr().out


def test_a_missing_old_name_points_to_the_new_name_and_a_lesson_is_not_graded(working_copy, monkeypatch, capsys):
    monkeypatch.chdir(working_copy)
    assert grade_main([f"exercises/{old_exercise_file('01_paging')}"]) == 1
    assert f"exercises/01_paging.ipynb is not there: the exercise is now named {NAME}; grade it with " \
           f"./course grade exercises/{NAME}" in capsys.readouterr().out
    lesson = working_copy / "notebooks" / "01_paging.ipynb"
    lesson.parent.mkdir()
    shutil.copyfile(REPO_ROOT / "notebooks" / "01_paging.ipynb", lesson)
    assert grade_main(["notebooks/01_paging.ipynb"]) == 1
    out = capsys.readouterr().out
    assert f"01_paging.ipynb is a lesson, its exercise is exercises/{NAME}" in out and "Task 1" not in out
