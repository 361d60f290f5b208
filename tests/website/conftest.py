"""What the website's checks share: the built site (``./course book``), served over HTTP on
127.0.0.1, and headless Chromium through Playwright, as in ``tests/browser``.

These checks run after the suite (``./course test`` runs them second, with
``COURSE_SITE_CHECKS=1``; the root conftest leaves them out of a plain run), because the site is
built from the lessons the suite ran. Without Chromium or Playwright they skip on a learner's
machine and fail under ``CI=true``. The run ends with what was checked: pages, links, figures.
"""

from __future__ import annotations

import functools
import http.server
import threading
from collections import Counter

import pytest

from browser.conftest import CHROMIUM, CHROMIUM_FLAGS, require_browser, sync_api
from course_lib.book.site import SITE_DIR, SOURCE_DIR, build

@pytest.fixture
def checked(request):
    """A test's own tally of what it looked at (pages, links, anchors, figures, images); it reaches
    the summary through the test's report, from whichever pytest-xdist worker ran it."""
    tally = Counter()
    yield tally
    request.node.user_properties.append(("checked", dict(tally)))


@pytest.fixture(scope="session")
def site():
    """The built site's folder: the one ./course book or ./course test built, else built now."""
    if not (SITE_DIR / "index.html").exists():
        build(SOURCE_DIR, SITE_DIR)
    return SITE_DIR


@pytest.fixture(scope="session")
def served(site):
    """The site over HTTP on a free port of 127.0.0.1: its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="session")
def chromium():
    require_browser()
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield browser
        browser.close()


def pytest_terminal_summary(terminalreporter) -> None:
    total = Counter()
    for reports in terminalreporter.stats.values():
        for report in reports:
            for name, tally in getattr(report, "user_properties", ()):
                if name == "checked":
                    total.update(tally)
    if total:
        terminalreporter.section("The website, checked in Chromium", sep="=")
        terminalreporter.line(", ".join(f"{count:,} {what}" for what, count in total.items()))
