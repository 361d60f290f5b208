"""What the browser tests share: JupyterLab on 127.0.0.1 over a copy of notebooks/, headless
Chromium through Playwright, and a page that has opened a lesson and run all its cells.

Without Chromium (Debian's ``chromium`` package) or the ``playwright`` package these tests
skip on a learner's machine, but fail under CI (``CI=true``): CI must run them, and
``.ci/run`` installs Chromium when it is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from course_lib.paths import REPO_ROOT

try:
    from playwright import sync_api
except ImportError:
    sync_api = None

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]
TOKEN = "course-browser-test"
IN_CI = os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def missing_requirement() -> str | None:
    """What this machine lacks to run the browser tests, or None."""
    if sync_api is None:
        return "needs the playwright package (pip install playwright, a test extra; it never downloads a browser)"
    if CHROMIUM is None:
        return "needs Debian's chromium package (apt-get install chromium; .ci/run installs it)"
    return None


def require_browser() -> None:
    """Skip on a learner's machine without a browser; fail under CI, which must run the browser checks."""
    missing = missing_requirement()
    if missing and IN_CI:
        pytest.fail(f"CI=true but the browser checks cannot run: {missing}", pytrace=False)
    if missing:
        pytest.skip(missing)


@pytest.fixture(scope="session", autouse=True)
def _browser_requirements():
    require_browser()


def api(base: str, path: str, method: str = "GET"):
    request = urllib.request.Request(f"{base}{path}?token={TOKEN}", method=method)
    with urllib.request.urlopen(request, timeout=10) as response:
        body = response.read()
    return json.loads(body) if body else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    """JupyterLab serving a copy of notebooks/ (so autosave never touches the course), fresh workspace."""
    root = tmp_path_factory.mktemp("lab")
    shutil.copytree(REPO_ROOT / "notebooks", root / "notebooks")
    port = free_port()
    log = open(root / "lab.log", "w")
    home = root / "home"  # quiz answers and the learner id land here, not in the tester's own home
    home.mkdir()
    news = root / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text('{"fetchNews": "false"}')  # no "get notified about Jupyter news?" toast over the lessons
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1",
         f"--IdentityProvider.token={TOKEN}", f"--notebook-dir={root}", "--allow-root",
         f"--LabApp.workspaces_dir={root / 'workspaces'}", f"--LabApp.user_settings_dir={root / 'settings'}"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HOME": str(home)})
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                api(base, "/api/status")
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


@pytest.fixture(scope="session")
def browser():
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield chromium
        chromium.close()


def run_all(page) -> None:
    """Run > Run All Cells, then wait until no cell is queued or running and the kernel is idle."""
    page.wait_for_selector(".jp-StatusBar-Widget:has-text('Idle')", timeout=120_000)
    page.click("li.lm-MenuBar-item:has-text('Run')")
    page.click("li.lm-Menu-item:has-text('Run All Cells')")
    page.wait_for_timeout(1000)
    page.wait_for_function(
        "() => ![...document.querySelectorAll('.jp-InputPrompt')].some(e => e.textContent.includes('*'))",
        timeout=600_000)
    page.wait_for_selector(".jp-StatusBar-Widget:has-text('Idle')", timeout=120_000)


def save(page) -> None:
    """File > Save Notebook from the menu bar (a menu click is not lost under load as a shortcut can be)."""
    page.keyboard.press("Escape")
    page.click("li.lm-MenuBar-item:has-text('File')")
    page.click("li.lm-Menu-item:has-text('Save Notebook')")


def answer_first_quiz_question(page) -> str:
    """Pick the first option of the first single-choice question, press Check, return the feedback."""
    radio = page.locator(".jp-OutputArea .widget-radio-box input[type=radio]").first
    radio.scroll_into_view_if_needed()
    radio.check()
    card = radio.locator("xpath=ancestor::div[contains(@class, 'widget-vbox')][1]")
    card.locator("button:has-text('Check')").click()
    page.wait_for_function(
        "el => /[✓✗]/.test(el.textContent)", arg=card.element_handle(), timeout=10_000)
    return card.inner_text()


@pytest.fixture
def open_lesson(lab, browser):
    """``open_lesson("06_ring_vs_tree.ipynb")``: a page on that lesson after Run All. The page
    is closed and every kernel shut down afterwards, so each test starts from a fresh kernel."""
    pages = []

    def open_and_run(name: str):
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        pages.append(page)
        page.goto(f"{lab}/lab/tree/notebooks/{name}?token={TOKEN}&reset")
        page.wait_for_selector(".jp-NotebookPanel", timeout=120_000)
        run_all(page)
        return page

    yield open_and_run
    for page in pages:
        page.close()
    for session in api(lab, "/api/sessions") or []:
        api(lab, f"/api/sessions/{session['id']}", method="DELETE")
