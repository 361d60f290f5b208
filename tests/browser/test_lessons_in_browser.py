"""Every lesson in a real browser: JupyterLab on 127.0.0.1, headless Chromium through Playwright.

For each notebook: open it, run all cells, and check that no cell raised, that widgets
rendered, that moving a slider changes what is shown, and that answering a quiz question
gives feedback. A screenshot of each notebook lands in ``browser-screenshots/``.
Run just these with ``./course test tests/browser``; the fixtures are in ``conftest.py``.
"""

from __future__ import annotations

import pytest

from course_lib.paths import REPO_ROOT

from .conftest import answer_first_quiz_question

LESSONS = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))
SCREENSHOTS = REPO_ROOT / "browser-screenshots"


def _outputs_text(page) -> str:
    return "\n".join(page.locator(".jp-OutputArea").all_inner_texts())


def _move_first_slider(page) -> bool:
    """Press the right arrow on the first slider; True if any output changed within 20 s."""
    handle = page.locator(".jp-OutputArea .widget-slider .noUi-handle").first
    before = _outputs_text(page)
    handle.focus()
    page.keyboard.press("ArrowRight")
    for _ in range(40):
        page.wait_for_timeout(500)
        if _outputs_text(page) != before:
            return True
    return False


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_lesson_runs_and_responds_in_a_browser(open_lesson, lesson):
    page = open_lesson(lesson.name)
    errors = [text for text in page.locator(
        ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").all_inner_texts()
        if "Traceback" in text]
    assert not errors, f"{lesson.name} raised: {errors[0][:2000]}"
    source = lesson.read_text(encoding="utf-8")
    if "course_lib.widgets" in source or "import ipywidgets" in source:
        assert page.locator(".jp-OutputArea .jupyter-widgets").count() > 0, f"{lesson.name}: no widget rendered"
    if page.locator(".jp-OutputArea .widget-slider .noUi-handle").count():
        assert _move_first_slider(page), f"{lesson.name}: moving the first slider changed nothing"
    if "show_quiz" in source:
        assert "✓" in answer_first_quiz_question(page) or "✗" in page.content()
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{lesson.stem}.png"), full_page=True)
