"""Every lesson follows the course outline (course_lib/outline.py): its title, its numbered sections
in order, and the same title wherever the course names the module (home page, README, lesson links,
the final review's table). A section that disappears from a lesson fails here."""

import json
import re
from pathlib import Path

import pytest

from course_lib import outline, review
from course_lib.exercise_files import module_of, solution_file
from course_lib.paths import REPO_ROOT

NOTEBOOKS = REPO_ROOT / "notebooks"
NUMBERED = re.compile(r"(\d+) · (.+)")
MODULE_LINK = re.compile(r"\[[Mm]odule (\d\d)(?: · |, )([^\]]+)\]\(([^)\s]+)\)")


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def markdown(path: Path) -> str:
    return "\n\n".join("".join(c["source"]) for c in cells(path) if c["cell_type"] == "markdown")


def headings(notebook_cells: list[dict]) -> list[tuple[int, int, str]]:
    """(cell index, level, text) of every Markdown heading, skipping lines inside fenced code."""
    found = []
    for index, cell in enumerate(notebook_cells):
        if cell["cell_type"] != "markdown":
            continue
        fenced = False
        for line in "".join(cell["source"]).splitlines():
            if line.lstrip().startswith(("```", "~~~")):
                fenced = not fenced
            elif not fenced and (match := re.match(r"(#{1,6}) +(.+?) *$", line)):
                found.append((index, len(match.group(1)), match.group(2)))
    return found


def structure_problems(lesson: outline.Lesson, notebook_cells: list[dict]) -> list[str]:
    """What in ``notebook_cells`` departs from the outline's entry ``lesson``, in words."""
    problems, found = [], headings(notebook_cells)
    titles = [(index, text) for index, level, text in found if level == 1]
    if titles != [(0, lesson.heading)]:
        problems.append(f"{lesson.file} must open with '# {lesson.heading}' and have no other '#' title; has {titles}")
    sections = [text for _, level, text in found if level == 2]
    numbers = [int(m.group(1)) for text in sections if (m := NUMBERED.fullmatch(text))]
    if numbers != list(range(1, len(numbers) + 1)):
        problems.append(f"{lesson.file}: sections numbered {numbers}, not 1 to {len(numbers)} in order")
    expected = [f"{n} · {name}" for n, name in enumerate(lesson.sections, 1)] + [lesson.last_section]
    missing = [name for name in expected if name not in sections]
    if sections != expected:
        problems.append(f"{lesson.file}: '##' headings {sections} differ from course_lib/outline.py's {expected}"
                        + (f"; missing {missing}" if missing else ""))
    last_markdown = max(i for i, c in enumerate(notebook_cells) if c["cell_type"] == "markdown")
    ends = [index for index, level, text in found if level == 2 and text == lesson.last_section]
    if ends != [last_markdown]:
        problems.append(f"{lesson.file}: '## {lesson.last_section}' must head the last Markdown cell")
    return problems


def test_the_outline_lists_every_lesson_and_exercise_once():
    lessons = {entry.file for entry in outline.OUTLINE}
    assert lessons == {p.name for p in NOTEBOOKS.glob("*.ipynb")} - {outline.HOME}
    assert [entry.module for entry in outline.OUTLINE] == [f"{n:02d}" for n in range(11)]
    exercises = {entry.exercise for entry in outline.OUTLINE if entry.exercise}
    assert exercises == {p.name for p in (REPO_ROOT / "exercises").glob("*.ipynb")}
    assert all(entry.file.startswith(entry.module + "_") for entry in outline.OUTLINE)


def test_lesson_exercise_and_solution_have_different_file_names():
    """JupyterLab titles a tab with the file's name alone: a lesson open beside its exercise (or an author's
    solution) must not read the same. The module's id stays the lesson's name, as quiz banks and grades use it."""
    for entry in outline.OUTLINE:
        if entry.exercise:
            names = {entry.file, entry.exercise, solution_file(entry.module_id)}
            assert len(names) == 3, names
            assert (REPO_ROOT / "solutions" / solution_file(entry.module_id)).is_file()
            assert module_of(entry.exercise) == module_of(solution_file(entry.module_id)) == entry.module_id


@pytest.mark.parametrize("lesson", outline.OUTLINE, ids=lambda entry: entry.file)
def test_lesson_has_the_outlines_title_and_sections_numbered_from_1(lesson):
    assert structure_problems(lesson, cells(NOTEBOOKS / lesson.file)) == []


def test_a_lost_section_is_caught():
    """Lesson 03 once lost its sections 3 and 4 without a test noticing: dropping either is caught."""
    lesson = outline.lesson("03")
    for lost in ("## 3 · When the KV cache runs out: preemption", "## 4 · Prefix caching"):
        kept = [c for c in cells(NOTEBOOKS / lesson.file) if not "".join(c["source"]).startswith(lost)]
        problems = structure_problems(lesson, kept)
        assert any("numbered" in p for p in problems) and any(f"missing ['{lost[3:]}']" in p for p in problems)


def test_a_heading_inside_fenced_code_is_not_a_section():
    fenced = {"cell_type": "markdown", "source": ["## 1 · Shell\n", "```bash\n", "# a comment, not a title\n", "```\n"]}
    assert headings([fenced]) == [(0, 2, "1 · Shell")]


def sections_of(notebook_cells: list[dict]) -> list[tuple[str, dict]]:
    """Each cell with the name of the '##' section it belongs to ('' before the first)."""
    section, placed = "", []
    for cell in notebook_cells:
        for _, level, text in headings([cell]):
            if level == 2:
                match = NUMBERED.fullmatch(text)
                section = match.group(2) if match else text
        placed.append((section, cell))
    return placed


def shows_a_staff_answer(cell: dict) -> bool:
    """A StaffAnswer widget; a model answer is never Markdown (tests/test_staff_answers.py)."""
    return cell["cell_type"] == "code" and "StaffAnswer(" in "".join(cell["source"])


@pytest.mark.parametrize("lesson", outline.OUTLINE, ids=lambda entry: entry.file)
def test_the_quiz_and_the_staff_answers_sit_in_their_named_sections(lesson):
    """Every lesson names them alike: its quiz under 'Check yourself'; its staff answers under
    'Staff answers', and no staff-answer widget before that section (a lesson body never shows one)."""
    placed = sections_of(cells(NOTEBOOKS / lesson.file))
    quizzes = [section for section, cell in placed if "show_quiz(" in "".join(cell["source"])]
    has_bank = (REPO_ROOT / "quizzes" / lesson.file.replace(".ipynb", ".yaml")).exists()
    assert quizzes == ([outline.CHECK_YOURSELF] if has_bank else []), f"{lesson.file}: quiz under {quizzes}"
    widgets = [section for section, cell in placed if shows_a_staff_answer(cell)]
    if outline.STAFF_ANSWERS not in lesson.sections:
        assert widgets == [], f"{lesson.file} shows staff answers but has no '{outline.STAFF_ANSWERS}' section"
        return
    assert any(shows_a_staff_answer(cell) for section, cell in placed if section == outline.STAFF_ANSWERS), \
        f"{lesson.file}: its '{outline.STAFF_ANSWERS}' section shows none"
    assert widgets[:1] in ([], [outline.STAFF_ANSWERS]), f"{lesson.file}: a staff answer shown under '{widgets[0]}'"


def table_rows(text: str) -> list[list[str]]:
    """The rows of every Markdown table in ``text``, as lists of stripped cells."""
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines()
            if line.startswith("|")]


def test_home_page_lists_every_lesson_with_its_title_and_links():
    table = {row[0]: row for row in table_rows(markdown(NOTEBOOKS / outline.HOME)) if re.fullmatch(r"\d\d", row[0])}
    assert set(table) == {lesson.module for lesson in outline.OUTLINE}
    for lesson in outline.OUTLINE:
        number, title, _, lesson_link, exercise_link = table[lesson.module]
        assert title == lesson.title, f"the home page calls module {number} {title!r}, the outline {lesson.title!r}"
        assert f"]({lesson.file})" in lesson_link
        assert (f"](../exercises/{lesson.exercise})" in exercise_link) if lesson.exercise else exercise_link == ""


def test_readme_module_table_uses_the_outlines_titles():
    rows = re.findall(r"^\| (\d\d) \| \*\*(.+?)\*\* \|", (REPO_ROOT / "README.md").read_text(encoding="utf-8"), re.M)
    assert [module for module, _ in rows] == [lesson.module for lesson in outline.OUTLINE[1:]]
    for module, title in rows:
        assert title == outline.lesson(module).title, f"README calls module {module} {title!r}"


@pytest.mark.parametrize("notebook", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.name)
def test_every_link_that_names_a_module_uses_its_title(notebook):
    """'[Module 04 · Throughput versus latency](04_roofline.ipynb)' or '[module 04, throughput versus
    latency](...)': the words after the number are the outline's title, and the link is its lesson."""
    for module, words, target in MODULE_LINK.findall(markdown(notebook)):
        lesson = outline.lesson(module)
        assert target == lesson.file, f"{notebook.name}: module {module} links to {target}"
        assert words.lower() == lesson.title.lower(), f"{notebook.name}: module {module} called {words!r}"


def test_the_final_reviews_table_names_each_module_by_its_outline_title():
    table = review.as_markdown(review.resource_map())
    for row, line in zip(review.resource_map(), table.splitlines()[2:]):
        lesson = outline.lesson(row.module)
        assert line.startswith(f"| [{lesson.module} {lesson.title}]({lesson.file})"), line[:80]


def test_lesson_lookup_names_the_modules_on_a_miss():
    assert outline.lesson("04").title == "Throughput versus latency"
    assert outline.next_lesson(outline.lesson("09")) == outline.lesson("10")
    assert outline.next_lesson(outline.lesson("10")) is None
    with pytest.raises(KeyError, match="choose one of"):
        outline.lesson("11")
