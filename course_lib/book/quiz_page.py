"""A module's quiz as a page of the website: its questions to read, never their answers.

``quiz_markdown("04_roofline")`` is a MyST Markdown page of ``quizzes/04_roofline.yaml``: the bank's
title as its heading, where in JupyterLab the quiz is answered and scored (the lesson's "Check
yourself" section), then one section per question with its prompt and what a learner picks from:
single and multiple choice, the options in the bank's order (which the bank lint keeps free of
position cues); numeric, the unit; matching, the left items in the bank's order and the right-hand
choices sorted, as the quiz widget lists them; spot the bug, the snippet's numbered lines.

Invariant: the page shows only what a learner sees before answering. Two banks that differ only in
which options are right, the `why` texts, explanations, numeric answers, tolerances and classic
wrong values, the pairing of a matching question, a bug's line or the line hints give the same
page. Bank text goes through ``myst_inline``, so it renders as the widget shows it.
"""

from __future__ import annotations

from course_lib.book.myst_text import myst_fence, myst_inline
from course_lib.outline import CHECK_YOURSELF, OUTLINE, Lesson
from course_lib.quiz.bank import QuizBank, load_bank
from course_lib.quiz.questions import (
    Matching,
    MultiSelect,
    Numeric,
    Question,
    SingleChoice,
    SpotTheBug,
)


def _bullets(texts: list[str]) -> list[str]:
    return [f"- {myst_inline(text)}" for text in texts]


def _offered(question: Question) -> list[str]:
    """The Markdown blocks for what ``question`` lets a learner pick or type, and nothing more."""
    if isinstance(question, SingleChoice):
        return ["Pick one:", "\n".join(_bullets([o.text for o in question.options]))]
    if isinstance(question, MultiSelect):
        return ["Pick all that apply:", "\n".join(_bullets([o.text for o in question.options]))]
    if isinstance(question, Numeric):
        return [f"Answer with a number, in {myst_inline(question.unit)}."]
    if isinstance(question, Matching):
        return ["Match each of these:", "\n".join(_bullets([left for left, _ in question.pairs])),
                "with one of these:", "\n".join(_bullets(question.choices))]
    if isinstance(question, SpotTheBug):
        numbered = [f"{n:>2}  {line}" for n, line in enumerate(question.lines, start=1)]
        return [f"Pick one line, 1 to {len(numbered)}:", myst_fence("\n".join(numbered))]
    raise ValueError(f"No quiz page layout for question kind {question.kind!r} ({question.id!r}): "
                     "add one to course_lib/book/quiz_page.py.")


def bank_markdown(bank: QuizBank, lesson: Lesson) -> str:
    """``bank`` as a MyST page whose quiz is answered in ``lesson``'s "Check yourself" section."""
    if CHECK_YOURSELF not in lesson.sections:
        raise ValueError(f"{lesson.file} has no {CHECK_YOURSELF!r} section, where its quiz is answered: "
                         "add it to the lesson's sections in course_lib/outline.py.")
    section = f"{lesson.sections.index(CHECK_YOURSELF) + 1} · {CHECK_YOURSELF}"
    blocks = [f"# {myst_inline(bank.title)}",
              f"Read the questions here, and answer them in JupyterLab, where they are scored: run "
              f"`./course lab`, open `notebooks/{lesson.file}` ({myst_inline(lesson.name)}) and go to "
              f"section {section}."]
    for number, question in enumerate(bank.questions, start=1):
        blocks += [f"## Question {number}", myst_inline(question.prompt), *_offered(question)]
    return "\n\n".join(blocks) + "\n"


def quiz_markdown(module_id: str) -> str:
    """The quiz page of module ``module_id`` (``04_roofline``), from ``quizzes/<module_id>.yaml``."""
    lessons = {lesson.module_id: lesson for lesson in OUTLINE}
    if module_id not in lessons:
        raise ValueError(f"No lesson in course_lib/outline.py has the id {module_id!r}; "
                         f"use one of {sorted(lessons)}.")
    return bank_markdown(load_bank(module_id), lessons[module_id])
