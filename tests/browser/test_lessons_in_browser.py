"""Every lesson in a real browser: JupyterLab on 127.0.0.1, headless Chromium through Playwright.

For each notebook: open it, run all cells, and check that no cell raised, that widgets
rendered, that every plotly figure is drawn with data on axes that span that data (the
figures listed in ``PLOTLY_FIGURES``, no more and no fewer), that moving a slider changes what
is shown, and that answering a quiz question gives feedback. Then save, reload the page with
the kernel still running, as a learner pressing F5 does, and check that every figure and
widget picture comes back. A screenshot of each notebook lands in ``browser-screenshots/``.
Run just these with ``./course test tests/browser``; the fixtures are in ``conftest.py``.
"""

from __future__ import annotations

import pytest

from course_lib.paths import REPO_ROOT

from .conftest import answer_first_quiz_question, save
from .plotly_checks import FIGURES_ON_PAGE, figure_problems

LESSONS = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))
SCREENSHOTS = REPO_ROOT / "browser-screenshots"

PLOTLY_FIGURES = {  # lesson: how many plotly figures it shows after Run All (a figure that never draws is missed);
    # 07 and 08 show one more each once a GPU run is saved in benchmarks/results/ (./course gpu-report)
    "00_setup": 0, "00_start_here": 0, "01_paging": 0, "02_batching": 1, "03_scheduler": 2, "04_roofline": 4,
    "05_collectives": 0, "06_ring_vs_tree": 1, "07_nccl_topology": 4, "08_fused_tp": 2, "09_serving_tradeoffs": 2,
    "10_review": 0,
}
WIDGET_PICTURES = ".jp-OutputArea .jupyter-widgets img"


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


def _figures_once_drawn(page, expected: int, seconds: float = 60) -> list[dict]:
    """The page's plotly figures, once ``expected`` of them are drawn with data (or after ``seconds``:
    a figure may still be drawing when the kernel goes idle, and more so on a loaded machine)."""
    figures = []
    for _ in range(int(seconds * 2)):
        figures = page.evaluate(FIGURES_ON_PAGE)
        if len(figures) >= expected and all(f.get("drawn") and (f.get("static") or f["tracesWithPoints"] and f["marks"])
                                            for f in figures):
            break
        page.wait_for_timeout(500)
    return figures


WIDGET_ERRORS = """() => [...document.querySelectorAll('.jp-OutputArea-output')]
    .map(el => el.innerText).filter(t => /Error displaying widget|model not found|Failed to/.test(t))"""


def _check_figures(lesson: str, figures: list[dict], when: str, page=None) -> None:
    expected = PLOTLY_FIGURES[lesson]
    titles = [f.get("title", "")[:60] for f in figures]
    if len(figures) != expected and page is not None:  # say what the page shows in their place
        titles.append(f"{page.locator('.jp-OutputArea .jupyter-widgets').count()} widget views; "
                      f"widget errors: {page.evaluate(WIDGET_ERRORS)[:3]}")
    assert len(figures) == expected, f"{lesson} {when}: {len(figures)} plotly figures, expected {expected}: {titles}"
    problems = [problem for figure in figures for problem in figure_problems(figure)]
    assert not problems, f"{lesson} {when}: " + "; ".join(problems)


def _reload_with_live_kernel(page) -> None:
    """Save (so the reloaded page holds this run's outputs), reload, wait for the kernel to reconnect."""
    save(page)
    page.wait_for_function("() => !document.querySelector('.jp-mod-dirty')", timeout=60_000)
    page.on("dialog", lambda dialog: dialog.accept())  # a "leave this page?" prompt, if one comes
    page.reload()
    page.wait_for_selector(".jp-NotebookPanel", timeout=120_000)
    page.wait_for_selector(".jp-StatusBar-Widget:has-text('Idle')", timeout=120_000)


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
    _check_figures(lesson.stem, _figures_once_drawn(page, PLOTLY_FIGURES[lesson.stem]), "after Run All", page)
    if page.locator(".jp-OutputArea .widget-slider .noUi-handle").count():
        assert _move_first_slider(page), f"{lesson.name}: moving the first slider changed nothing"
    if "show_quiz" in source:
        assert "✓" in answer_first_quiz_question(page) or "✗" in page.content()
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{lesson.stem}.png"), full_page=True)

    pictures = page.locator(WIDGET_PICTURES).count()
    _reload_with_live_kernel(page)
    # after a reload every widget's model is fetched again from the kernel, one request each: in one
    # CI run on a loaded 2-core machine lesson 09's second figure was not back within 60 s
    _check_figures(lesson.stem, _figures_once_drawn(page, PLOTLY_FIGURES[lesson.stem], seconds=150),
                   "after a page reload", page)
    # the widgets' pictures come back the same way, after the figures (07's, on a 2-core CI machine: not within 60 s)
    page.wait_for_function(f"n => document.querySelectorAll('{WIDGET_PICTURES}').length >= n", arg=pictures,
                           timeout=150_000)
    page.screenshot(path=str(SCREENSHOTS / f"{lesson.stem}-reloaded.png"), full_page=True)
