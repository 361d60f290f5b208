"""The learner's working copy: created from the course, refreshed without losing the learner's work."""

import json
import os
import subprocess

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
