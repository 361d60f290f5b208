"""The learner's working copy: created from the course, refreshed without losing the learner's work."""

import json
import os
import shutil
import subprocess

import pytest

from course_lib import workspace
from course_lib.exercise_files import exercise_file, exercise_modules, old_exercise_file, solution_file
from course_lib.paths import REPO_ROOT
from course_lib.workspace import COMMAND_MARK, MANIFEST, sources_hash, sync, write_command


def _notebook(path, *sources, outputs=()):
    cells = [{"cell_type": "code", "id": str(i), "metadata": {}, "source": s, "execution_count": None,
              "outputs": list(outputs)} for i, s in enumerate(sources)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))


def _course(root, lesson="print(1)", exercise="raise NotImplementedError"):
    _notebook(root / "notebooks" / "01_lesson.ipynb", lesson)
    _notebook(root / "exercises" / "01_demo_exercise.ipynb", exercise)


def test_first_sync_copies_lessons_and_exercises(tmp_path):
    course, work = tmp_path / "course", tmp_path / "work"
    _course(course)
    report = sync(work, course)
    assert sorted(report) == ["added    exercises/01_demo_exercise.ipynb", "added    notebooks/01_lesson.ipynb"]
    assert (work / "notebooks" / "01_lesson.ipynb").read_text() == (course / "notebooks" / "01_lesson.ipynb").read_text()
    assert (work / MANIFEST).exists()


def test_refresh_updates_a_run_lesson_but_keeps_an_edited_exercise(tmp_path):
    course, work = tmp_path / "course", tmp_path / "work"
    _course(course)
    sync(work, course)
    # The learner runs the lesson (outputs only) and solves the exercise (an edited source).
    _notebook(work / "notebooks" / "01_lesson.ipynb", "print(1)", outputs=[{"output_type": "stream", "name": "stdout",
                                                                             "text": "1\n"}])
    _notebook(work / "exercises" / "01_demo_exercise.ipynb", "answer = 42")
    _course(course, lesson="print(2)", exercise="raise NotImplementedError('new hint')")
    assert sync(work, course) == [], "a plain sync only adds missing files"
    report = sync(work, course, refresh=True)
    assert sources_hash(work / "notebooks" / "01_lesson.ipynb") == sources_hash(course / "notebooks" / "01_lesson.ipynb")
    assert "answer = 42" in (work / "exercises" / "01_demo_exercise.ipynb").read_text()
    beside = work / "exercises" / "01_demo_exercise.updated.ipynb"
    assert "new hint" in beside.read_text()
    assert any(line.startswith("kept") for line in report) and any(line.startswith("updated") for line in report)


def test_refresh_leaves_unchanged_and_learner_files_alone(tmp_path):
    course, work = tmp_path / "course", tmp_path / "work"
    _course(course)
    sync(work, course)
    mine = work / "notebooks" / "scratch.ipynb"
    _notebook(mine, "x = 1")
    assert sync(work, course, refresh=True) == []
    assert mine.exists()
    (work / "exercises" / "01_demo_exercise.ipynb").unlink()
    assert sync(work, course) == ["added    exercises/01_demo_exercise.ipynb"]


def test_a_second_refresh_never_overwrites_the_offered_version_the_learner_edited(tmp_path):
    course, work = tmp_path / "course", tmp_path / "work"
    _course(course)
    sync(work, course)
    _notebook(work / "exercises" / "01_demo_exercise.ipynb", "answer = 42")
    _course(course, exercise="raise NotImplementedError('v2')")
    assert any(line.startswith("kept") for line in sync(work, course, refresh=True))
    assert sync(work, course, refresh=True) == [], "an offer already made is not repeated"
    beside = work / "exercises" / "01_demo_exercise.updated.ipynb"
    _notebook(beside, "my edits to the new version")
    _course(course, exercise="raise NotImplementedError('v3')")
    report = sync(work, course, refresh=True)
    assert "my edits to the new version" in beside.read_text()
    assert any("has your edits too" in line for line in report)


def test_a_copy_that_catches_up_with_the_course_counts_as_unedited_again(tmp_path):
    course, work = tmp_path / "course", tmp_path / "work"
    _course(course)
    sync(work, course)
    _course(course, lesson="print(2)")
    _notebook(work / "notebooks" / "01_lesson.ipynb", "print(2)")  # the learner typed the fix themselves
    assert sync(work, course, refresh=True) == []
    _course(course, lesson="print(3)")
    assert sync(work, course, refresh=True) == ["updated  notebooks/01_lesson.ipynb"]


def test_broken_notebooks_and_manifests_do_not_stop_a_sync(tmp_path, capsys):
    course, work = tmp_path / "course", tmp_path / "work"
    _course(course)
    sync(work, course)
    (work / "exercises" / "01_demo_exercise.ipynb").write_text("{ not json")
    (work / MANIFEST).write_text("")
    _course(course, lesson="print(2)", exercise="raise NotImplementedError('v2')")
    report = sync(work, course, refresh=True)
    assert "unreadable" in capsys.readouterr().err
    assert (work / "exercises" / "01_demo_exercise.ipynb").read_text() == "{ not json", "a broken copy is kept"
    assert any("not a readable notebook" in line for line in report)
    assert sorted(json.loads((work / MANIFEST).read_text())["offered"]) == [  # nothing is trusted as unedited
        "exercises/01_demo_exercise.ipynb", "notebooks/01_lesson.ipynb"]


def test_the_working_copy_has_its_own_course_command(tmp_path):
    course, work = tmp_path / "course", tmp_path / "work"
    _course(course)
    (course / "course").write_text('#!/bin/sh\necho "workdir=$COURSE_WORKDIR args=$*"\n')  # stands in for ./course
    (course / "course").chmod(0o755)
    sync(work, course)
    write_command(work, course)
    ran = subprocess.run(["./course", "grade", "exercises/01_demo_exercise.ipynb"], cwd=work, capture_output=True,
                         text=True, env={"PATH": os.environ["PATH"], "COURSE_WORKDIR": "somewhere else"})
    assert ran.stdout == f"workdir={work.resolve()} args=grade exercises/01_demo_exercise.ipynb\n", ran.stderr
    (work / "course").write_text(f"#!/bin/sh\n{COMMAND_MARK}\nexec /old/checkout/course")  # the course moved
    write_command(work, course)
    assert "/old/checkout" not in (work / "course").read_text() and str(course.resolve()) in (work / "course").read_text()


def test_a_course_file_the_learner_made_is_kept(tmp_path, capsys):
    course, work = tmp_path / "course", tmp_path / "work"
    _course(course)
    sync(work, course)
    (work / "course").write_text("my notes about the course")
    write_command(work, course)
    assert (work / "course").read_text() == "my notes about the course"
    assert "is not the course's; kept it" in capsys.readouterr().err


# --- exercises made under their old name (exercises/01_demo.ipynb, before exercises had their own) ---

OLD, NEW = f"exercises/{old_exercise_file('01_demo')}", f"exercises/{exercise_file('01_demo')}"
REPLACED = (f"replaced {OLD} (unedited) by {NEW}, the exercise's new name; if JupyterLab has it open, close that "
            "tab and open the new name")
RENAMED = (f"renamed  {OLD} -> {NEW} (the exercise's new name), with your edits; if JupyterLab has it open, close "
           "that tab and open the new name")


def _copy_made_before_the_rename(course, work, exercise="raise NotImplementedError"):
    """A working copy synced while the course named its exercise like the lesson; the course then renamed it."""
    _notebook(course / "notebooks" / "01_demo.ipynb", "print(1)")
    _notebook(course / OLD, exercise)
    sync(work, course)
    (course / OLD).unlink()
    _notebook(course / NEW, exercise + "  # the text names the new file")


@pytest.mark.parametrize("refresh", [False, True], ids=["start-up", "refresh"])
def test_an_unedited_old_name_exercise_is_replaced_by_the_new_one(tmp_path, refresh):
    course, work = tmp_path / "course", tmp_path / "work"
    _copy_made_before_the_rename(course, work)
    _notebook(work / OLD, "raise NotImplementedError", outputs=[{"output_type": "error", "ename": "E", "evalue": "",
                                                                  "traceback": []}])  # run, not edited
    assert sync(work, course, refresh=refresh) == [REPLACED, f"added    {NEW}"]
    assert not (work / OLD).exists() and sources_hash(work / NEW) == sources_hash(course / NEW)
    assert sync(work, course, refresh=True) == [], "the new name now follows the course like any copy"
    assert OLD not in json.loads((work / MANIFEST).read_text())["copied"]


@pytest.mark.parametrize("refresh", [False, True], ids=["start-up", "refresh"])
def test_an_edited_old_name_exercise_moves_to_the_new_name_with_its_edits(tmp_path, refresh):
    course, work = tmp_path / "course", tmp_path / "work"
    _copy_made_before_the_rename(course, work)
    _notebook(work / OLD, "answer = 42")
    report = sync(work, course, refresh=refresh)
    assert report[0] == RENAMED and not (work / OLD).exists()
    assert "answer = 42" in (work / NEW).read_text()
    beside = work / "exercises" / f"{exercise_file('01_demo').removesuffix('.ipynb')}.updated.ipynb"
    if refresh:  # still an edited copy of an older version: the course's new one lands beside it
        assert report[1:] == [f"kept     {NEW} (you edited it); the course's new version is exercises/{beside.name}"]
        assert sources_hash(beside) == sources_hash(course / NEW)
    else:
        assert report[1:] == [] and not beside.exists()
    assert sync(work, course, refresh=refresh) == [], "done once"


def test_the_course_version_once_offered_beside_the_old_name_goes_with_it(tmp_path):
    course, work = tmp_path / "course", tmp_path / "work"
    _notebook(course / "notebooks" / "01_demo.ipynb", "print(1)")
    _notebook(course / OLD, "raise NotImplementedError")
    sync(work, course)
    _notebook(work / OLD, "answer = 42")
    _notebook(course / OLD, "raise NotImplementedError('v2')")
    sync(work, course, refresh=True)  # offers exercises/01_demo.updated.ipynb
    offered = work / "exercises" / "01_demo.updated.ipynb"
    assert offered.exists()
    (course / OLD).unlink()
    _notebook(course / NEW, "raise NotImplementedError('v3')")
    assert sync(work, course)[0] == RENAMED
    assert not offered.exists() and "answer = 42" in (work / NEW).read_text()


def test_an_edited_old_name_beside_the_new_name_keeps_both_and_says_which_is_graded(tmp_path):
    """JupyterLab may save an open tab under the old name after the move: nothing is lost, the report says
    which file counts, at every start until the learner moves their work."""
    course, work = tmp_path / "course", tmp_path / "work"
    _copy_made_before_the_rename(course, work)
    sync(work, course)  # replaced, unedited
    _notebook(work / OLD, "answer = 42")  # the old tab, saved with work in it
    kept = (f"kept     {OLD} (you edited it) beside {NEW}, the exercise's new name: {NEW} is the one graded and "
            "collected, so move your work into it")
    assert sync(work, course) == [kept] and sync(work, course, refresh=True) == [kept]
    assert "answer = 42" in (work / OLD).read_text() and sources_hash(work / NEW) == sources_hash(course / NEW)


def test_without_a_readable_manifest_an_old_name_exercise_counts_as_edited_and_is_moved(tmp_path, capsys):
    course, work = tmp_path / "course", tmp_path / "work"
    _copy_made_before_the_rename(course, work)
    (work / MANIFEST).write_text("")
    assert sync(work, course)[0] == RENAMED
    assert "unreadable" in capsys.readouterr().err and (work / NEW).exists() and not (work / OLD).exists()


def test_refresh_moves_a_real_working_copy_made_before_the_rename(tmp_path, capsys):
    """The course's own exercises, as a copy made before the rename holds them: each under its old name, its
    text naming that file. ./course refresh keeps the learner's work and leaves every exercise at its new name."""
    work = tmp_path / "work"
    workspace.main(["--workdir", str(work)])
    manifest = json.loads((work / MANIFEST).read_text())
    for module in exercise_modules():
        new, old = work / "exercises" / exercise_file(module), work / "exercises" / old_exercise_file(module)
        old.write_text(new.read_text().replace(exercise_file(module), old_exercise_file(module)))
        new.unlink()
        manifest["copied"][f"exercises/{old.name}"] = sources_hash(old)
        del manifest["copied"][f"exercises/{new.name}"]
    (work / MANIFEST).write_text(json.dumps(manifest))
    solved = work / "exercises" / old_exercise_file("04_roofline")
    shutil.copyfile(REPO_ROOT / "solutions" / solution_file("04_roofline"), solved)
    capsys.readouterr()
    workspace.main(["--refresh", "--workdir", str(work)])
    report = capsys.readouterr().out
    assert "renamed  exercises/04_roofline.ipynb -> exercises/04_roofline_exercise.ipynb" in report
    assert report.count("replaced ") == len(exercise_modules()) - 1
    assert sorted(p.name for p in (work / "exercises").glob("*.ipynb")) == sorted(
        [*map(exercise_file, exercise_modules()), "04_roofline_exercise.updated.ipynb"])
    moved = work / "exercises" / exercise_file("04_roofline")
    assert sources_hash(moved) == sources_hash(REPO_ROOT / "solutions" / solution_file("04_roofline"))
