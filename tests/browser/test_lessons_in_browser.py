"""Every lesson in a real browser: JupyterLab on 127.0.0.1, headless Chromium through Playwright.

For each notebook: open it, run all cells, and check that no cell raised, that widgets
rendered, that moving a slider changes what is shown, and that answering a quiz question
gives feedback. A screenshot of each notebook lands in ``browser-screenshots/``.
Run just these with ``./course test tests/browser``.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from course_lib.paths import REPO_ROOT

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (a test extra)")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium package (apt install chromium)")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]
LESSONS = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))
SCREENSHOTS = REPO_ROOT / "browser-screenshots"
TOKEN = "course-browser-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(base: str, path: str, method: str = "GET"):
    request = urllib.request.Request(f"{base}{path}?token={TOKEN}", method=method)
    with urllib.request.urlopen(request, timeout=10) as response:
        body = response.read()
    return json.loads(body) if body else None


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab serving a copy of notebooks/ (so autosave never touches the course), fresh workspace."""
    root = tmp_path_factory.mktemp("lab")
    shutil.copytree(REPO_ROOT / "notebooks", root / "notebooks")
    port = _free_port()
    log = open(root / "lab.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1",
         f"--IdentityProvider.token={TOKEN}", f"--notebook-dir={root}", "--allow-root",
         f"--LabApp.workspaces_dir={root / 'workspaces'}", f"--LabApp.user_settings_dir={root / 'settings'}"],
        stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                _api(base, "/api/status")
                break
            except OSError:
                time.sleep(0.5)
        else:
            raise RuntimeError(f"JupyterLab did not start; see {root / 'lab.log'}")
        yield base
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield chromium
        chromium.close()


def _outputs_text(page) -> str:
    return "\n".join(page.locator(".jp-OutputArea").all_inner_texts())


def _run_all(page) -> None:
    page.wait_for_selector(".jp-StatusBar-Widget:has-text('Idle')", timeout=120_000)
    page.click("li.lm-MenuBar-item:has-text('Run')")
    page.click("li.lm-Menu-item:has-text('Run All Cells')")
    page.wait_for_timeout(1000)
    page.wait_for_function(
        "() => ![...document.querySelectorAll('.jp-InputPrompt')].some(e => e.textContent.includes('*'))",
        timeout=600_000)
    page.wait_for_selector(".jp-StatusBar-Widget:has-text('Idle')", timeout=120_000)


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


def _answer_first_quiz_question(page) -> str:
    """Pick the first option of the first single-choice question, press Check, return the feedback."""
    radio = page.locator(".jp-OutputArea .widget-radio-box input[type=radio]").first
    radio.scroll_into_view_if_needed()
    radio.check()
    card = radio.locator("xpath=ancestor::div[contains(@class, 'widget-vbox')][1]")
    card.locator("button:has-text('Check')").click()
    page.wait_for_function(
        "el => /[✓✗]/.test(el.textContent)", arg=card.element_handle(), timeout=10_000)
    return card.inner_text()


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_lesson_runs_and_responds_in_a_browser(lab, browser, lesson):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(f"{lab}/lab/tree/notebooks/{lesson.name}?token={TOKEN}&reset")
        page.wait_for_selector(".jp-NotebookPanel", timeout=120_000)
        _run_all(page)
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
            assert "✓" in _answer_first_quiz_question(page) or "✗" in page.content()
        SCREENSHOTS.mkdir(exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"{lesson.stem}.png"), full_page=True)
    finally:
        page.close()
        for session in _api(lab, "/api/sessions") or []:
            _api(lab, f"/api/sessions/{session['id']}", method="DELETE")
