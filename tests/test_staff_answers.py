"""Staff answers stay out of sight until the learner has written one: the text lives in
course_lib/review.py's registry, never in a notebook cell, and each lesson's cells name a topic key
that the registry holds and that belongs to that lesson (or is asked again in the final review)."""

import ast
import json
import re
from pathlib import Path

import pytest

from course_lib import outline
from course_lib.paths import REPO_ROOT
from course_lib.review import STAFF_QUESTIONS

NOTEBOOKS = sorted(p for folder in ("notebooks", "exercises", "solutions") for p in (REPO_ROOT / folder).glob("*.ipynb"))
LESSONS = [REPO_ROOT / "notebooks" / entry.file for entry in outline.OUTLINE]
KEYS = {q.key for q in STAFF_QUESTIONS}
REVIEW = outline.lesson("10").file


def _normal(text: str) -> str:
    return " ".join(text.split())


def _sentences(answer: str) -> list[str]:
    """The answer's sentences of some length: any one of them in a cell gives the answer away."""
    return [s for s in re.split(r"(?<=[.?!:;])\s+", _normal(answer)) if len(s) >= 40]


def _cells(notebook: Path) -> list[dict]:
    return json.loads(notebook.read_text(encoding="utf-8"))["cells"]


def _texts(cell: dict) -> list[str]:
    outputs = cell.get("outputs", [])
    return ["".join(cell["source"])] + ["".join(o.get("text", "")) for o in outputs] + [
        "".join(value) for o in outputs for kind, value in o.get("data", {}).items() if kind.startswith("text/")]


def keys_used(source: str) -> list[str | None]:
    """The topic keys a code cell passes to ``staff_question``: a literal, or each literal of the
    tuple a ``for`` loop binds the argument to. None for an argument whose key cannot be read."""
    tree = ast.parse(source)
    loops = {node.target.id: node.iter for node in ast.walk(tree)
             if isinstance(node, ast.For) and isinstance(node.target, ast.Name)}
    keys = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "staff_question"):
            continue
        argument = node.args[0] if node.args else None
        if isinstance(argument, ast.Name) and isinstance(loops.get(argument.id), (ast.Tuple, ast.List)):
            keys += [element.value if isinstance(element, ast.Constant) else None for element in loops[argument.id].elts]
        else:
            keys.append(argument.value if isinstance(argument, ast.Constant) else None)
    return keys


def typed_in_answers(source: str) -> list[int]:
    """Lines of ``StaffAnswer(...)`` calls that spell out text instead of passing a registry entry."""
    return [node.lineno for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "StaffAnswer"
            and any(isinstance(arg, (ast.Constant, ast.JoinedStr)) for arg in node.args)]


def _code(lesson: Path) -> list[str]:
    return ["".join(c["source"]) for c in _cells(lesson) if c["cell_type"] == "code"]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_cell_spells_out_a_staff_answer(notebook):
    for index, cell in enumerate(_cells(notebook)):
        shown = _normal(" ".join(_texts(cell)))
        for q in STAFF_QUESTIONS:
            leaked = [s for s in _sentences(q.answer) if s in shown]
            assert not leaked, f"{notebook.parent.name}/{notebook.name} cell {index} shows {q.key!r}'s answer: {leaked[0]!r}"


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.name)
def test_every_topic_key_a_lesson_uses_exists_and_belongs_to_it(lesson):
    for source in _code(lesson):
        assert typed_in_answers(source) == [], f"{lesson.name}: a StaffAnswer with its text typed in the cell"
        for key in keys_used(source):
            assert key in KEYS, f"{lesson.name} asks for staff question {key!r}; the registry has {sorted(KEYS)}"
            owner = next(q.lesson for q in STAFF_QUESTIONS if q.key == key)
            assert lesson.name in (owner, REVIEW), f"{lesson.name} shows {key!r}, which {owner} teaches"


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.name)
def test_no_staff_answers_section_quotes_an_answer_in_markdown(lesson):
    """A model answer typed into the section's Markdown is visible before the learner writes one,
    whether or not the registry holds it: the section has a lead-in and the widget, no quotation."""
    section = ""
    for index, cell in enumerate(_cells(lesson)):
        text = "".join(cell["source"])
        section = next((line[3:] for line in text.splitlines() if line.startswith("## ")), section)
        if cell["cell_type"] == "markdown" and section.endswith(outline.STAFF_ANSWERS):
            quoted = [line for line in text.splitlines() if line.startswith(">")]
            assert not quoted, (f"{lesson.name} cell {index} quotes a model answer under '{outline.STAFF_ANSWERS}': "
                                f"{quoted[0][:80]!r}; move it into course_lib/review.py and show it with StaffAnswer")


def test_every_registered_question_is_asked_somewhere():
    asked = {key for lesson in LESSONS for source in _code(lesson) for key in keys_used(source)}
    assert KEYS - asked == set(), f"staff questions no lesson shows: {sorted(KEYS - asked)}"


def test_the_checks_read_keys_and_catch_typed_answers():
    loop = 'for topic in ("a", "b"):\n    q = staff_question(topic)\n'
    assert keys_used(loop) == ["a", "b"]
    assert keys_used('q = staff_question("c")') == ["c"]
    assert keys_used("q = staff_question(name)") == [None]
    assert typed_in_answers('StaffAnswer("Why?", "Because.", "did you?")') == [1]
    assert typed_in_answers("StaffAnswer(q.question, q.answer, q.compare)") == []
    assert _sentences("Short. " + "A sentence long enough to give the answer away, surely.") == [
        "A sentence long enough to give the answer away, surely."]
