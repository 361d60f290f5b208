"""The website as a reader meets it: the outline's pages and no others, in the outline's order;
no solution, quiz answer or staff answer anywhere in it (search index included); and, in
Chromium, every page loads without console errors, every internal link and anchor resolves,
every plotly figure draws traces and every image has pixels."""

from __future__ import annotations

import functools
import html
import re
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

import nbformat
import pytest
import yaml

from course_lib.book.site import site_pages
from course_lib.exercise_files import exercise_file, solution_file
from course_lib.paths import QUIZ_DIR, REPO_ROOT
from course_lib.review import STAFF_QUESTIONS

PAGES = site_pages()
MADE_BY_SPHINX = {"genindex.html", "search.html", "index.html"}  # index.html: the redirect to the home page
TEXT_SUFFIXES = {".html", ".js", ".json", ".txt", ".css", ".inv"}
PLOTLY_CALL = re.compile(r"Plotly\.newPlot\(.*?\)\s*\};?", re.DOTALL)
SHORTEST_SECRET = 25  # characters: shorter lines ('return total') occur in any Python page


def _site_text(site: Path) -> str:
    """Every text file the site serves, outside the theme's own ``_static``; in the pages, the
    plotly figures' drawing calls are left out (numbers and axis titles, megabytes of them)."""
    texts = [path.read_text(encoding="utf-8", errors="replace") for path in site.rglob("*")
             if path.suffix in TEXT_SUFFIXES and "_static" not in path.parts[len(site.parts):-1]]
    return "\n".join(PLOTLY_CALL.sub("", text) for text in texts)


def _solution_lines() -> set[str]:
    """Each line of a solution's answer cells, long enough to be telling, that its exercise's text
    (a task may name an API call in its prose) and the lessons' text do not already hold."""
    lessons = "\n".join(cell.source for path in sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))
                        for cell in nbformat.read(path, as_version=4).cells)
    secrets = set()
    for solution in sorted((REPO_ROOT / "solutions").glob("*.ipynb")):
        module = solution.name.removesuffix(solution_file(""))
        exercise = nbformat.read(REPO_ROOT / "exercises" / exercise_file(module), as_version=4)
        given = "\n".join(cell.source for cell in exercise.cells) + lessons
        for cell in nbformat.read(solution, as_version=4).cells:
            if cell.cell_type == "code" and "student" in cell.metadata.get("tags", []):
                secrets |= {line.strip() for line in cell.source.splitlines()
                            if len(line.strip()) >= SHORTEST_SECRET and line.strip() not in given}
    return secrets


def _quiz_answers() -> set[str]:
    """Every text a quiz shows only after an answer: each option's and wrong value's ``why``, each explanation."""
    found = set()

    def walk(value, key=None):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, k)
        elif isinstance(value, list):
            for v in value:
                walk(v, key)
        elif isinstance(value, str) and key in ("why", "explanation", "fix") and len(value) >= SHORTEST_SECRET:
            found.add(value.strip())

    for bank in sorted(QUIZ_DIR.glob("*.yaml")):
        walk(yaml.safe_load(bank.read_text(encoding="utf-8")))
    return found


@functools.cache
def _ids(page: Path) -> frozenset[str]:
    """The element ids of one built page: the anchors a link may point at."""
    return frozenset(re.findall(r"""\sid=["']([^"']+)["']""", page.read_text(encoding="utf-8")))


def _html_texts(text: str) -> str:
    """The site's text as a browser shows it: tags dropped, entities and whitespace as typed."""
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", text)))


def test_the_site_holds_the_outlines_pages_and_no_others(site):
    built = {str(path.relative_to(site).with_suffix("")) for path in site.rglob("*.html")
             if path.name not in MADE_BY_SPHINX and not path.relative_to(site).parts[0].startswith("_")}
    assert built == {page.docname for page in PAGES}
    assert [page.kind for page in PAGES].count("lesson") == 11 and PAGES[0].docname == "notebooks/00_start_here"


def test_no_solution_quiz_answer_or_staff_answer_is_anywhere_in_the_site(site, checked):
    raw = _site_text(site)
    shown = _html_texts(raw)
    secrets = {"solution code": _solution_lines(), "quiz answer": _quiz_answers(),
               "staff answer": {text for q in STAFF_QUESTIONS for text in (q.answer, q.compare)}}
    assert all(secrets.values()), "nothing to look for: the checks below would pass vacuously"
    leaks = [f"{kind}: {secret[:90]!r}" for kind, texts in secrets.items() for secret in sorted(texts)
             if secret in raw or re.sub(r"\s+", " ", secret) in shown]
    assert not leaks, "the site shows what only learners who answered may see:\n" + "\n".join(leaks)
    assert (site / "searchindex.js").exists()  # the search index was among the files read
    checked["answers looked for"] += sum(len(texts) for texts in secrets.values())


def test_the_sidebar_lists_the_pages_in_the_outlines_order(site, served, chromium):
    page = chromium.new_page()
    page.goto(f"{served}/{PAGES[0].docname}.html")
    hrefs = page.eval_on_selector_all("nav.bd-docs-nav a.reference.internal", "links => links.map(a => a.href)")
    docs = [urlparse(href).path.lstrip("/").removesuffix(".html") for href in hrefs]
    assert [doc for doc in docs if doc != PAGES[0].docname] == [p.docname for p in PAGES[1:]]
    page.close()


@pytest.mark.parametrize("docname", [page.docname for page in PAGES])
def test_each_page_loads_cleanly_with_working_links_and_drawn_figures(site, served, chromium, checked, docname):
    page = chromium.new_page()
    problems = []
    page.on("console", lambda message: message.type == "error" and problems.append(f"console: {message.text}"))
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.on("requestfailed", lambda request: problems.append(f"request failed: {request.url}"))
    url = f"{served}/{docname}.html"
    page.goto(url, wait_until="load")
    page.wait_for_function("() => [...document.querySelectorAll('.js-plotly-plot')].every(p => p._fullLayout)")
    checked["pages"] += 1

    for href in page.eval_on_selector_all("a[href]", "links => links.map(a => a.getAttribute('href'))"):
        target = urlparse(urljoin(url, href))
        if target.scheme not in ("http", "https") or target.netloc != urlparse(served).netloc:
            continue
        path = site / unquote(target.path).lstrip("/")
        if path.is_dir():
            path = path / "index.html"
        if not path.is_file():
            problems.append(f"link to a missing page: {href}")
            continue
        checked["links"] += 1
        if target.fragment and path.suffix == ".html":
            if unquote(target.fragment) not in _ids(path):
                problems.append(f"link to a missing anchor: {href}")
            checked["anchors"] += 1

    figures = page.eval_on_selector_all(".js-plotly-plot", """plots => plots.map(p => ({
        traces: (p.data || []).length, drawn: p.querySelectorAll('.main-svg').length,
        width: p.getBoundingClientRect().width}))""")
    problems += [f"plotly figure {i} not drawn: {figure}" for i, figure in enumerate(figures)
                 if not (figure["traces"] and figure["drawn"] and figure["width"] > 100)]
    checked["plotly figures"] += len(figures)
    images = page.eval_on_selector_all("article img", "images => images.map(i => i.complete && i.naturalWidth)")
    problems += [f"image {i} has no pixels" for i, width in enumerate(images) if not width]
    checked["images"] += len(images)
    if docname.startswith("notebooks/") and docname != PAGES[0].docname:
        assert "./course lab" in page.inner_text("article"), "a lesson page says how to run it"
    page.close()
    assert not problems, f"{docname}:\n" + "\n".join(problems)
