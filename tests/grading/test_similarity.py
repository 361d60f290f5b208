"""The similarity report (course_lib/grading/similarity.py) on a planted cohort
(similarity_cohort.py): every planted copy is flagged with the right pair, whatever its disguise,
and no honest learner is; normalising, the starter's subtraction, short answers, cells a learner
added, learner data that is hostile, and ``grade-cohort`` writing the report into the gradebook.
"""

from __future__ import annotations

import csv
import io

import nbformat
import pytest

from course_lib.exercise_files import course_exercise, exercise_file
from course_lib.grading import cohort as cohort_command
from course_lib.grading.cohort import graded_notebooks
from course_lib.grading.grade import prepare_exercise
from course_lib.grading.similarity import (FLAG_SCORE, MIN_FINGERPRINTS, SOLUTION, compare_cohort, compare_task,
                                           given_code, load_solutions, normalised_tokens, similarity_csv,
                                           similarity_html, write_similarity)
from needs_sandbox import require_sandbox
from similarity_cohort import HONEST, PAGING, PLANTED, ROOFLINE, TODO, answer_cell, student_cells, write_cohort

MODULES = (PAGING, ROOFLINE)


@pytest.fixture(scope="module")
def exercises():
    return [prepare_exercise(course_exercise(module)) for module in MODULES]


@pytest.fixture(scope="module")
def planted(tmp_path_factory, exercises):
    root = tmp_path_factory.mktemp("similarity") / "submissions"
    write_cohort(root)
    learners = sorted(path.name for path in root.iterdir())
    return root, compare_cohort(learners, exercises, load_solutions(MODULES), graded_notebooks(root))


def key(pair) -> tuple:
    number = int(pair.task.split()[1])
    return (pair.exercise, number, pair.first, pair.second)


def test_every_planted_copy_is_flagged_with_its_pair_and_no_honest_learner_is(planted):
    _, report = planted
    flagged = {key(pair) for pair in report.flagged}
    assert flagged == PLANTED
    honest = set(HONEST)
    for pair in report.pairs:  # honest learners are listed, at most, never flagged
        if {pair.first, pair.second} & honest and key(pair) not in PLANTED:
            assert pair.score < FLAG_SCORE and not pair.flagged, pair
    scores = {key(pair): pair.score for pair in report.flagged}
    assert scores[(ROOFLINE, 1, "vera", SOLUTION)] == 1.0  # verbatim, markers and all
    assert scores[(ROOFLINE, 1, "chen", "gus")] == 1.0  # another learner's cell, verbatim
    assert scores[(ROOFLINE, 2, "dara", "gus")] == 1.0  # renamed and re-commented
    assert scores[(ROOFLINE, 3, "rene", SOLUTION)] == 1.0  # renamed, re-commented, 1. for 1.0
    assert 0.85 < scores[(ROOFLINE, 1, "rene", SOLUTION)] < 1.0  # also reformatted and reordered
    assert all(pair.identical == (pair.score == 1.0) for pair in report.flagged)
    padded = [pair for pair in report.flagged if pair.first == "pia" and pair.second == SOLUTION]
    assert len(padded) == 2 and all(pair.score < 0.5 and pair.contained > 0.95 for pair in padded)
    honest_pairs = [pair for pair in report.pairs if {pair.first, pair.second} & honest and key(pair) not in PLANTED]
    assert max(pair.contained for pair in honest_pairs) < 0.75


def test_short_answers_are_counted_but_never_flagged(planted):
    """Exercise 01's answers are one to four lines: vera's verbatim copy of the solution cannot be told
    from ana's own formula, so neither is flagged, and the summary says how many were compared."""
    _, report = planted
    assert not [pair for pair in report.pairs if pair.exercise == PAGING and pair.flagged]
    paging = [task for task in report.tasks if task.exercise == PAGING]
    assert [task.answers for task in paging] == [5, 5, 5, 5]  # four honest learners and vera
    assert all(task.compared < task.answers for task in paging)
    assert all(0 < task.solution_size < MIN_FINGERPRINTS for task in paging)
    task4 = next(task for task in report.tasks if task.exercise == ROOFLINE and task.task.startswith("Task 4"))
    assert task4.compared == 0  # the P:D ratio: three dictated lines, written alike by everyone


def test_renaming_layout_comments_docstrings_and_literal_spelling_are_normalised_away():
    original = '''def f(a, b):
    """Add them."""
    total = a + b * 1000.0  # scale
    return {"sum": total, 'n': len([a, b])}
'''
    disguised = '''def function(x,
             y):
    # my own comment
    """Something else entirely."""
    s = x + (
        y * 1e3
    )
    return {'sum': s, "n": len([x, y])}   # done
'''
    assert normalised_tokens(original) != normalised_tokens(disguised)  # the parentheses stay
    assert normalised_tokens(original.replace("b * 1000.0", "(b * 1000.0)")) == normalised_tokens(disguised)
    tokens = normalised_tokens(original)
    assert "len" in tokens and "'sum'" in tokens and "1000.0" in tokens and "total" not in tokens
    assert normalised_tokens("x = model.num_layers\n") == ["V", "=", "V", ".", "num_layers"]
    assert normalised_tokens("y = torch.clamp(p, min=0)\n") == ["V", "=", "V", ".", "clamp", "(", "V", ",", "min",
                                                              "=", "0", ")"]


def test_the_starter_the_set_up_and_ipython_lines_count_for_nothing(exercises):
    roofline = exercises[1]
    given = given_code(roofline.pristine)[0]  # the set-up cell and task 1's starter
    starter = student_cells(roofline.pristine)[0].source
    assert compare_task(ROOFLINE, "Task 1", {"amy": starter, "bo": starter + "\n" + given}, given)[1].answers == 0
    mine = answer_cell(starter, HONEST["ana"][ROOFLINE][0])
    variants = {
        "plain": mine,
        "kept the raise": mine + f"\n    {TODO}",
        "magics": "%timeit step_intensity('x', 'y', [])\n!ls\n" + mine,
        "re-imported": "from course_lib.perf.models import get_model\n\n" + mine,
    }
    pairs, summary, _ = compare_task(ROOFLINE, "Task 1", variants, given)
    assert summary.answers == summary.compared == 4
    assert len(pairs) == 6 and all(pair.identical and pair.score == 1.0 for pair in pairs)


def test_code_that_does_not_tokenize_is_still_compared_and_never_run(tmp_path):
    marker = tmp_path / "ran"
    broken = f"open({str(marker)!r}, 'w').write('x')\ndef f(:\n    '''unclosed\n" + "    y = [i * 2 for i in x]\n" * 3
    tokens = normalised_tokens(broken)
    assert tokens and "open" in tokens
    pairs, summary, _ = compare_task("99_x", "Task 1", {"a": broken * 3, "b": broken * 3})
    assert summary.answers == 2 and not marker.exists()


def test_a_cell_the_learner_added_counts_for_the_task_whose_function_it_defines(tmp_path, exercises):
    """A learner who deleted task 1's *Your code* cell of exercise 04 and pasted the solution into a new
    cell further down (a new id) is compared under task 1, where the copy is flagged."""
    roofline = exercises[1]
    solution = load_solutions([ROOFLINE])[ROOFLINE]
    book = nbformat.read(course_exercise(ROOFLINE), as_version=4)
    first = student_cells(book)[0]
    book.cells.remove(first)
    pasted = nbformat.v4.new_code_cell(solution[0].replace("### BEGIN SOLUTION", "# mine"))
    book.cells.append(pasted)
    (tmp_path / "paula").mkdir()
    nbformat.write(book, tmp_path / "paula" / exercise_file(ROOFLINE))
    report = compare_cohort(["paula"], [roofline], {ROOFLINE: solution}, graded_notebooks(tmp_path))
    assert [(pair.first, pair.second, pair.task.split(" ·")[0]) for pair in report.flagged] == \
        [("paula", SOLUTION, "Task 1")]


def test_the_report_files_are_reproducible_and_hostile_names_and_code_stay_data(tmp_path, planted, exercises):
    root, report = planted
    first = write_similarity(report, tmp_path / "a")
    again = compare_cohort(sorted(p.name for p in root.iterdir()), exercises, load_solutions(MODULES),
                           graded_notebooks(root))
    second = write_similarity(again, tmp_path / "b")
    assert [path.read_bytes() for path in first] == [path.read_bytes() for path in second]
    csv_text, page = (tmp_path / "a" / "similarity.csv").read_text(), (tmp_path / "a" / "similarity.html").read_text()
    assert csv_text.splitlines()[0].startswith("exercise,task,learner,other,against,score")
    assert f"{ROOFLINE},Task 1 · Arithmetic intensity and the binding roof,chen,gus,learner,1.000" in csv_text
    assert "evidence for a conversation, not proof" in page and f"Flagged: {len(PLANTED)} pair(s)" in page
    task1 = page[page.index("<h3>04_roofline · Task 1"):page.index("<h3>04_roofline · Task 2")]
    assert "<b>Like the course solution:</b> rene (0.9" in task1 and "vera (1.000)" in task1
    assert "<b>Alike:</b> chen, gus (chen and gus 1.000)" in task1  # rene and vera: both like the solution

    hostile = "=cmd|' /C calc'!A0"
    code = "".join(f"x = '<script>alert({i})</script>' * {i}\n" for i in range(20))
    pairs, summary, shown = compare_task(ROOFLINE, "Task 1", {hostile: code, "<b>x</b>": code})
    page = similarity_html(type(report)(tuple(pairs), (summary,), shown))
    assert "<script>" not in page and "&lt;script&gt;" in page and "<b>x</b>" not in page
    assert ",'=cmd|" in similarity_csv(type(report)(tuple(pairs), (summary,), shown))


def test_grade_cohort_writes_the_similarity_report_into_the_gradebook(tmp_path, monkeypatch, capsys):
    """``grade-cohort`` end to end, with grading itself replaced (it has tests of its own): the report
    is computed from the notebooks handed in, after grading, and lands beside grades.csv."""
    submissions = tmp_path / "submissions"
    write_cohort(submissions)

    def grade_cohort(root, exercises, *args, **kwargs):
        return [exercise.every_check(folder.name, "graded", "not run here") for folder in sorted(root.iterdir())
                for exercise in exercises]

    monkeypatch.setattr(cohort_command, "grade_cohort", grade_cohort)
    out = tmp_path / "gradebook"
    assert cohort_command.main([str(submissions), "--out", str(out), "--no-sandbox", "--jobs", "1",
                                "--exercise", ROOFLINE]) == 0
    assert f"{len([p for p in PLANTED if p[0] == ROOFLINE])} pair(s) of answers flagged" in capsys.readouterr().out
    rows = list(csv.DictReader(io.StringIO((out / "similarity.csv").read_text())))
    assert {(row["learner"], row["other"]) for row in rows if row["flagged"] == "1"} == \
        {(first, second) for _, _, first, second in PLANTED}
    assert (out / "similarity.html").is_file() and (out / "grades.csv").is_file()


def test_grade_cohort_with_real_grading_writes_the_report(tmp_path):
    """The same through real, sandboxed grading of exercise 04 for a copier and an honest learner
    (skipped without bubblewrap on a learner's machine; CI must run it)."""
    require_sandbox()
    submissions = tmp_path / "submissions"
    write_cohort(tmp_path / "all")
    submissions.mkdir()
    for learner in ("ana", "vera"):
        (tmp_path / "all" / learner).rename(submissions / learner)
    out = tmp_path / "gradebook"
    assert cohort_command.main([str(submissions), "--out", str(out), "--jobs", "2", "--exercise", ROOFLINE]) == 0
    rows = list(csv.DictReader(io.StringIO((out / "similarity.csv").read_text())))
    flagged = [row for row in rows if row["flagged"] == "1"]
    assert sorted((row["task"].split(" ·")[0], row["learner"], row["other"]) for row in flagged) == \
        [("Task 1", "vera", SOLUTION), ("Task 2", "vera", SOLUTION), ("Task 3", "vera", SOLUTION)]
    grades = list(csv.DictReader(io.StringIO((out / "grades.csv").read_text())))
    assert [row["passed"] for row in grades if row["learner"] == "vera"] == ["1"] * 4  # a copy passes: hence the report


def test_a_linked_or_unreadable_notebook_is_left_out_never_followed(tmp_path, exercises):
    roofline = exercises[1]
    solution = load_solutions([ROOFLINE])[ROOFLINE]
    outside = tmp_path / "outside.ipynb"
    book = nbformat.read(course_exercise(ROOFLINE), as_version=4)
    student_cells(book)[0].source = solution[0]
    nbformat.write(book, outside)
    root = tmp_path / "submissions"
    for learner in ("linked", "garbled", "folder_link"):
        (root / learner).mkdir(parents=True)
    (root / "linked" / exercise_file(ROOFLINE)).symlink_to(outside)
    (root / "garbled" / exercise_file(ROOFLINE)).write_bytes(b"\x00{not json")
    (root / "folder_link").rmdir()
    (root / "folder_link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir()
    nbformat.write(book, tmp_path / "elsewhere" / exercise_file(ROOFLINE))
    report = compare_cohort(["folder_link", "garbled", "linked"], [roofline], {ROOFLINE: solution},
                            graded_notebooks(root))
    assert report.pairs == () and all(task.answers == 0 for task in report.tasks)
