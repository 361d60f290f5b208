"""The website's quiz and exercise pages show the questions and the tasks, never the answers.

Quiz pages are read back with markdown-it (CommonMark, as MyST extends it), so each check is about
what the page shows, not how its Markdown is spelled. A page must not change when a bank's answers
do: a twin of every bank, with other right options, other whys, answers and pairings, gives the same
page. Exercise pages must hold each task and no line of the solution's code that the exercise lacks.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest
import yaml
from markdown_it import MarkdownIt

from course_lib.book.exercise_page import exercise_notebook, read_only_copy
from course_lib.book.quiz_page import bank_markdown, quiz_markdown
from course_lib.exercise_files import course_exercise, exercise_file, exercise_modules, solution_file
from course_lib.outline import CHECK_YOURSELF, OUTLINE, lesson
from course_lib.paths import QUIZ_DIR, REPO_ROOT
from course_lib.quiz.bank import load_bank, parse_bank
from course_lib.quiz.questions import Matching, MultiSelect, Numeric, SingleChoice, SpotTheBug
from course_lib.quiz.text import INLINE_CODE

BANKS = sorted(path.stem for path in QUIZ_DIR.glob("*.yaml"))
LESSONS = {entry.module_id: entry for entry in OUTLINE}
# What MyST reads on top of CommonMark: tables and strikethrough, as the site's parser does.
MARKDOWN = MarkdownIt("commonmark").enable(["table", "strikethrough"])


def shown(text: str) -> str:
    """What the quiz widget shows of a bank's text: code spans without backticks, lines run together."""
    return re.sub(r"\s*\n\s*", " ", INLINE_CODE.sub(r"\1", text)).strip()


def inline_text(token) -> str:
    """The text an inline token renders; fails on any markup but code spans (emphasis, links, HTML)."""
    parts = []
    for child in token.children:
        assert child.type in ("text", "code_inline", "softbreak"), f"{child.type} in {token.content!r}"
        parts.append(" " if child.type == "softbreak" else child.content)
    return "".join(parts)


def sections(page: str) -> list[list[str]]:
    """The page's sections (the title's, then one per ``##`` heading) as lists of what each block
    shows: a heading's or paragraph's or list item's text, a fence's content."""
    found: list[list[str]] = []
    tokens = MARKDOWN.parse(page)
    for index, token in enumerate(tokens):
        if token.type == "heading_open" and token.tag in ("h1", "h2"):
            found.append([])
        elif token.type == "inline":
            found[-1].append(inline_text(token))
        elif token.type == "fence":
            found[-1].append(token.content)
        else:
            allowed = ("heading_open", "heading_close", "paragraph_open", "paragraph_close", "bullet_list_open",
                       "bullet_list_close", "list_item_open", "list_item_close")
            assert token.type in allowed, f"unexpected {token.type} after {tokens[index - 1].content!r}"
    return found


def question_sections(page: str) -> list[list[str]]:
    title, *questions = sections(page)
    return questions


@pytest.mark.parametrize("module_id", BANKS)
def test_a_quiz_page_opens_with_the_bank_title_and_says_where_it_is_scored(module_id):
    bank, page = load_bank(module_id), quiz_markdown(module_id)
    assert page.startswith("# ")
    title = sections(page)[0]
    assert title[0] == bank.title
    assert "./course lab" in title[1] and LESSONS[module_id].file in title[1] and CHECK_YOURSELF in title[1]
    assert len(question_sections(page)) == len(bank.questions)


@pytest.mark.parametrize("module_id", BANKS)
def test_a_quiz_page_shows_every_prompt_option_choice_and_line_in_its_question(module_id):
    bank = load_bank(module_id)
    for question, blocks in zip(bank.questions, question_sections(quiz_markdown(module_id)), strict=True):
        assert blocks[0].startswith("Question ") and blocks[1] == shown(question.prompt)
        if isinstance(question, (SingleChoice, MultiSelect)):
            texts = [shown(option.text) for option in question.options]
            assert blocks[-len(texts):] == texts, "the options in the bank's order"
            assert ("Pick one:" if isinstance(question, SingleChoice) else "Pick all that apply:") in blocks
        elif isinstance(question, Numeric):
            assert blocks[2] == f"Answer with a number, in {shown(question.unit)}."
        elif isinstance(question, Matching):
            lefts = [shown(left) for left, _ in question.pairs]
            rights = sorted(shown(right) for right in {right for _, right in question.pairs})
            assert blocks[3:3 + len(lefts)] == lefts and blocks[-len(rights):] == rights
        elif isinstance(question, SpotTheBug):
            listing = blocks[-1].splitlines()
            assert [line.split("  ", 1)[1] for line in listing] == question.lines
            assert [int(line.split()[0]) for line in listing] == list(range(1, len(question.lines) + 1))


def feedback_texts(question) -> list[str]:
    """Everything a question says only after an answer: whys, hints and the explanation."""
    texts = [question.explanation]
    texts += [option.why for option in getattr(question, "options", ())]
    texts += [wrong.why for wrong in getattr(question, "wrong", ())]
    texts += list(getattr(question, "line_hints", {}).values())
    return [text for text in texts if text]


@pytest.mark.parametrize("module_id", BANKS)
def test_no_why_explanation_or_hint_reaches_a_quiz_page(module_id):
    page = quiz_markdown(module_id)
    shown_page = "\n".join(text for blocks in sections(page) for text in blocks)
    for question in load_bank(module_id).questions:
        for text in feedback_texts(question):
            assert text not in page and shown(text) not in shown_page, f"{question.id}: {text[:60]!r}"


@pytest.mark.parametrize("module_id", [m for m in BANKS if any(isinstance(q, Numeric) for q in load_bank(m).questions)])
def test_no_numeric_answer_tolerance_or_wrong_value_reaches_a_quiz_page(module_id):
    """The numbers as the bank writes them, looked for in all that a numeric question shows besides
    its prompt (which may state some of them) and its numbered heading."""
    raw = {q["id"]: q for q in yaml.safe_load((QUIZ_DIR / f"{module_id}.yaml").read_text(encoding="utf-8"))["questions"]}
    bank = load_bank(module_id)
    for question, blocks in zip(bank.questions, question_sections(quiz_markdown(module_id)), strict=True):
        if not isinstance(question, Numeric):
            continue
        entry = raw[question.id]
        numbers = [entry["answer"], *entry["tolerance"].values(), *(wrong["value"] for wrong in entry.get("wrong", []))]
        rest = " ".join(blocks[2:])
        for number in numbers:
            assert not re.search(rf"(?<![\d.]){re.escape(str(number))}(?![\d.])", rest), f"{question.id}: {number}"


def answers_moved(data: dict) -> dict:
    """A twin of a bank's YAML with other right options, whys, explanations, numeric answers and
    classic wrong values, matching pairs and bug lines; what a learner sees first is unchanged."""
    twin = json.loads(json.dumps(data))
    for q in twin["questions"]:
        q["explanation"] = "Another explanation."
        options = q.get("options", [])
        flags = [option.get("correct", False) for option in options]
        for option, flag in zip(options, flags[-1:] + flags[:-1]):
            option["correct"], option["why"] = flag, "Another why."
        if q["kind"] == "numeric":
            q["answer"], q["wrong"] = q["answer"] * 7 + 3, [{"value": -1, "why": "Another why."}]
        if q["kind"] == "matching":
            rights = [pair["right"] for pair in q["pairs"]]
            for pair, right in zip(q["pairs"], rights[1:] + rights[:1]):
                pair["right"] = right
        if q["kind"] == "spot_the_bug":
            q["bug_line"] = q["bug_line"] % len(q["code"].rstrip("\n").splitlines()) + 1
            q["line_hints"] = {1: "Another hint."}
    return twin


@pytest.mark.parametrize("module_id", BANKS)
def test_a_quiz_page_is_the_same_whatever_the_answers(module_id):
    data = yaml.safe_load((QUIZ_DIR / f"{module_id}.yaml").read_text(encoding="utf-8"))
    bank, twin = parse_bank(data, module_id), parse_bank(answers_moved(data), module_id)
    assert any(a != b for a, b in zip(bank.questions, twin.questions)), "the twin must differ in its answers"
    assert bank_markdown(twin, LESSONS[module_id]) == bank_markdown(bank, LESSONS[module_id])


TRICKY = [
    "# not a heading #",
    "(not-a-target)=",
    "% not a comment",
    ":::{note} not a fence",
    "1. not a list, nor 2) this",
    "- not a bullet",
    "> not a quote",
    "+ plus, = equals, --- dashes",
    "a *star* and **strong** and _under_ and ~~struck~~",
    "{math}`x^2` and $y$ and $$z$$ and {{ substitution }}",
    "<b>html</b> & &amp; and a <http://example.com> autolink",
    "[a link](http://example.com) and ![an image](x.png) and [^footnote]",
    "a back\\slash, a lone ` backtick and | a | table |",
    "`code with $ and * and {role}` then `(label)=`",
    "a prompt\nover two lines\n# with a hash line",
]


def test_myst_special_characters_in_a_bank_show_as_written():
    """A hand-made bank with every kind and text that MyST would read as markup."""
    data = {"title": "Tricky *bank*: $1 {title}", "questions": [
        {"id": "single", "kind": "single", "prompt": TRICKY[0], "options": [
            {"text": text, "correct": n == 0, "why": f"Why {n}."} for n, text in enumerate(TRICKY)]},
        {"id": "multi", "kind": "multi", "prompt": TRICKY[-1], "options": [
            {"text": text, "correct": n % 2 == 0, "why": f"Why {n}."} for n, text in enumerate(TRICKY)]},
        {"id": "numeric", "kind": "numeric", "prompt": "(x)= how many?", "answer": 3, "unit": "$/h {u}",
         "tolerance": {"absolute": 0}},
        {"id": "matching", "kind": "matching", "prompt": "{ref}`match`", "pairs": [
            {"left": "# left", "right": "*right*"}, {"left": "- other", "right": "$x$"}]},
        {"id": "bug", "kind": "spot_the_bug", "prompt": "% click", "code": "x = 1\nprint(f'```{x}```')\n# end",
         "bug_line": 2},
    ]}
    bank = parse_bank(data, "tricky")
    page = bank_markdown(bank, lesson("01"))
    title, *questions = sections(page)
    assert title[0] == bank.title
    texts = [block for blocks in questions for block in blocks]
    for text in TRICKY:
        assert shown(text) in texts, text
    assert shown("(x)= how many?") in texts and "Answer with a number, in $/h {u}." in texts
    assert {"{ref}match", "# left", "- other", "$x$", "*right*", "% click"} <= set(texts)
    assert questions[-1][-1] == " 1  x = 1\n 2  print(f'```{x}```')\n 3  # end\n"
    # MyST's own syntax, which CommonMark leaves as text: outside code, every $, {, }, and every
    # block's first character that could open a target, comment or fence, is escaped.
    outside_code = re.sub(r"(`{3,})text\n.*?\n\1|`[^`\n]+`", "", page, flags=re.DOTALL)
    assert not re.search(r"(?<!\\)[${}]", outside_code)
    assert not re.search(r"^(- )?[(%:+]", outside_code, re.MULTILINE)


@pytest.mark.parametrize("module_id", exercise_modules())
def test_an_exercise_page_keeps_every_cell_and_tag_and_adds_the_note_under_its_title(module_id):
    exercise = nbformat.read(course_exercise(module_id), as_version=4)
    page = exercise_notebook(module_id)
    nbformat.validate(page)
    title, note, *rest = page.cells
    assert title.source.startswith("# Exercise ")
    cells = [title, *rest]
    assert [(c.cell_type, c.source) for c in cells] == [(c.cell_type, c.source) for c in exercise.cells]
    assert [c.metadata.get("tags") for c in cells] == [c.metadata.get("tags") for c in exercise.cells]
    assert note.cell_type == "markdown"
    for needed in ("./course lab", f"exercises/{exercise_file(module_id)}",
                   f"./course grade exercises/{exercise_file(module_id)}", "solution is not on this site"):
        assert needed in note.source
    assert page.metadata["mystnb"] == {"execution_mode": "off"}


def test_an_exercise_page_drops_outputs_counts_and_locks():
    """A run and saved exercise, as JupyterLab writes it, made read-only."""
    exercise = nbformat.read(course_exercise(exercise_modules()[0]), as_version=4)
    for cell in exercise.cells:
        cell.metadata.update(editable=False, deletable=False, collapsed=True)
        if cell.cell_type == "code":
            cell.execution_count = 7
            cell.outputs = [nbformat.v4.new_output("stream", text="printed\n")]
    page = read_only_copy(exercise, "ran.ipynb")
    code = [cell for cell in page.cells if cell.cell_type == "code"]
    assert code and all(cell.outputs == [] and cell.execution_count is None for cell in code)
    assert all(set(cell.metadata) <= {"tags"} for cell in page.cells)
    assert exercise.cells[1].metadata["editable"] is False, "the exercise it was given is left as it was"


def solution_only_lines(module_id: str) -> list[str]:
    """Code lines of the solution's ``student`` cells that appear nowhere in the exercise's JSON."""
    solution = nbformat.read(REPO_ROOT / "solutions" / solution_file(module_id), as_version=4)
    exercise_json = Path(course_exercise(module_id)).read_text(encoding="utf-8")
    lines = {line.strip() for cell in solution.cells if "student" in cell.metadata.get("tags", [])
             for line in cell.source.splitlines()}
    return sorted(line for line in lines if line and json.dumps(line)[1:-1] not in exercise_json)


@pytest.mark.parametrize("module_id", exercise_modules())
def test_an_exercise_page_holds_no_line_of_the_solution_that_the_exercise_lacks(module_id):
    hidden = solution_only_lines(module_id)
    assert hidden, "a solution with no code of its own would make this test vacuous"
    page_json = nbformat.writes(exercise_notebook(module_id))
    leaked = [line for line in hidden if json.dumps(line)[1:-1] in page_json]
    assert not leaked, f"{module_id}: solution code on the page: {leaked[:3]}"


def test_unknown_modules_are_refused_with_the_ids_to_use():
    with pytest.raises(ValueError, match="01_paging"):
        quiz_markdown("04_rooflines")
    with pytest.raises(ValueError, match="01_paging"):
        exercise_notebook("10_review")
