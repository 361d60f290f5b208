"""``./course book``: the course as a static website, built with Sphinx, MyST-NB and the book theme.

The site mirrors the repository's folders, so the links the lessons already hold resolve as
they are: ``notebooks/NN_name`` is each lesson as the test suite ran it (``executed.py``: real
outputs, widgets as they first showed), ``exercises/NN_name_exercise`` its exercise to read
(``exercise_page.py``: no outputs, no solution) and ``quizzes/NN_name`` its quiz's questions
(``quiz_page.py``: no answers). The course home, ``notebooks/00_start_here``, is the root page;
the sidebar follows ``outline.OUTLINE``: set-up, then per module its lesson, exercise and quiz.

Invariants: ``site_pages()`` is the outline's page list and the only pages built; a lesson is
built only from an executed copy made from the lesson file as it is now (``executed.fresh``),
never from an older run; nothing from ``solutions/`` is read.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

from course_lib.book.executed import EXECUTED_DIR, fresh
from course_lib.book.exercise_page import exercise_notebook
from course_lib.book.quiz_page import quiz_markdown
from course_lib.outline import HOME, OUTLINE, Lesson
from course_lib.paths import NOTEBOOK_DIR, QUIZ_DIR, REPO_ROOT

SOURCE_DIR = REPO_ROOT / "build" / "site-source"
SITE_DIR = REPO_ROOT / "build" / "site"
TITLE = "LLM inference serving and distributed communication"
STYLE = """/* widgets as they first showed: controls that cannot move */
.course-widget { border: 1px solid #d0d7de; border-radius: 6px; padding: 8px 12px; margin: 8px 0; }
.course-widget-note { font-size: 0.9em; color: #57606a; margin: 0 0 6px 0; }
.course-control { display: flex; gap: 8px; align-items: baseline; }
.course-control-label { min-width: 14em; color: #57606a; }
.course-control-value { font-weight: 600; }
.course-choice { border: 1px solid #d0d7de; padding: 1px 8px; margin-right: 2px; border-radius: 3px; }
.course-chosen { background: #ddf4ff; border-color: #54aeff; }
"""
FAVICON = ("<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 16 16'><rect width='16' height='16' rx='3' "
           "fill='#1f6feb'/><path d='M3 12V4h2v6h3v2zm6 0V4h4v2h-2v1h2v2h-2v3z' fill='white'/></svg>\n")


@dataclass(frozen=True)
class Page:
    """One page: its document name (the repository path without ``.ipynb``/``.md``), its kind
    (home, lesson, exercise or quiz) and the module it belongs to."""

    docname: str
    kind: str
    module: str


def site_pages() -> list[Page]:
    """Every page, in the sidebar's order: the home, then each module's lesson, exercise and quiz."""
    pages = [Page(f"notebooks/{Path(HOME).stem}", "home", "")]
    for entry in OUTLINE:
        pages.append(Page(f"notebooks/{entry.module_id}", "lesson", entry.module))
        if entry.exercise:
            pages.append(Page(f"exercises/{Path(entry.exercise).stem}", "exercise", entry.module))
        if (QUIZ_DIR / f"{entry.module_id}.yaml").exists():
            pages.append(Page(f"quizzes/{entry.module_id}", "quiz", entry.module))
    return pages


def _sidebar_cell(pages: list[Page]) -> nbformat.NotebookNode:
    """A hidden toctree per module, captioned with the module's name: the sidebar."""
    blocks = []
    for entry in OUTLINE:
        docs = [page.docname for page in pages if page.module == entry.module]
        blocks.append("```{toctree}\n:hidden:\n:caption: " + entry.name + "\n\n"
                      + "\n".join(f"/{doc}" for doc in docs) + "\n```")
    return nbformat.v4.new_markdown_cell("\n\n".join(blocks))


def _run_it_cell(entry: Lesson) -> nbformat.NotebookNode:
    return nbformat.v4.new_markdown_cell(
        f"```{{note}}\nThis page is the lesson as the course's test suite last ran it: its outputs and figures are "
        f"real, and each widget shows its first state. To run it and move the controls, start the course with "
        f"`./course lab` and open `notebooks/{entry.file}` in your working copy.\n```")


NOTEBOOK_LINK = re.compile(r"""(\]\(|href=["'])([^)"'#:]+)\.ipynb""")
"""A relative link to a notebook in Markdown or HTML: ``](01_paging.ipynb``, ``href="../exercises/x.ipynb``."""


def _outputs_link_pages(notebook: nbformat.NotebookNode) -> None:
    """Point the notebook links that outputs hold (a rendered table, a widget's readout) at their
    pages: Sphinx resolves the links of a page's own Markdown, not those inside outputs."""
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            for kind in ("text/markdown", "text/html"):
                if kind in output.get("data", {}):
                    output.data[kind] = NOTEBOOK_LINK.sub(r"\1\2.html", output.data[kind])


def _lesson_notebook(entry: Lesson, executed: Path) -> nbformat.NotebookNode:
    lesson_file = NOTEBOOK_DIR / entry.file
    if not fresh(lesson_file, executed):
        raise RuntimeError(f"No executed copy of {lesson_file.name} made from the file as it is now in {executed}: "
                           "run the lessons first (./course book does, or ./course test).")
    notebook = nbformat.read(executed / entry.file, as_version=4)
    notebook.cells.insert(1, _run_it_cell(entry))
    _outputs_link_pages(notebook)
    return notebook


def write_source(source: Path = SOURCE_DIR, executed: Path = EXECUTED_DIR) -> list[Page]:
    """Write the Sphinx project (conf.py, static files, every page) into ``source``, emptied first."""
    if source.exists():
        shutil.rmtree(source)
    pages = site_pages()
    for page in pages:
        target = source / page.docname
        target.parent.mkdir(parents=True, exist_ok=True)
        entry = next((e for e in OUTLINE if e.module == page.module), None)
        if page.kind == "home":
            home = nbformat.read(executed / HOME, as_version=4) if fresh(NOTEBOOK_DIR / HOME, executed) \
                else nbformat.read(NOTEBOOK_DIR / HOME, as_version=4)
            home.cells.append(_sidebar_cell(pages))
            _outputs_link_pages(home)
            nbformat.write(home, target.with_suffix(".ipynb"))
        elif page.kind == "lesson":
            nbformat.write(_lesson_notebook(entry, executed), target.with_suffix(".ipynb"))
        elif page.kind == "exercise":
            nbformat.write(exercise_notebook(entry.module_id), target.with_suffix(".ipynb"))
        else:
            target.with_suffix(".md").write_text(quiz_markdown(entry.module_id), encoding="utf-8")
    static = source / "_static"
    static.mkdir()
    shutil.copy(_plotly_js(), static / "plotly.min.js")
    (static / "course.css").write_text(STYLE, encoding="utf-8")
    (static / "favicon.svg").write_text(FAVICON, encoding="utf-8")
    (source / "conf.py").write_text(_conf(pages[0].docname), encoding="utf-8")
    return pages


def _plotly_js() -> Path:
    """plotly.js as the plotly package ships it (no download)."""
    spec = importlib.util.find_spec("plotly")
    return Path(spec.submodule_search_locations[0]) / "package_data" / "plotly.min.js"


def _conf(root_doc: str) -> str:
    return f'''# Written by course_lib/book/site.py: edit that, not this.
project = {TITLE!r}
author = "the course"
copyright = "the course's authors"
extensions = ["myst_nb", "course_lib.book.mathml"]
html_math_renderer = "mathml"  # formulas as MathML written at build time: no MathJax from a CDN
root_doc = {root_doc!r}
exclude_patterns = ["_build"]
nb_execution_mode = "off"
myst_enable_extensions = ["dollarmath"]
myst_heading_anchors = 3
smartquotes = False  # text as typed, as JupyterLab shows it: policy="priority" keeps straight quotes
suppress_warnings = ["myst.header"]  # the home page's "###" under its "#" title is fine to read
html_theme = "sphinx_book_theme"
html_title = {TITLE!r}
html_static_path = ["_static"]
html_css_files = ["course.css"]
html_favicon = "_static/favicon.svg"
html_context = {{"default_mode": "light"}}  # a first visit has no stored mode: the theme logs an error without one
html_theme_options = {{"show_toc_level": 2, "use_download_button": False, "use_fullscreen_button": False,
                      "home_page_in_toc": True}}
html_show_sourcelink = False
html_copy_source = False


def _plotly_where_drawn(app, pagename, templatename, context, doctree):
    """plotly.js (4.6 MB) only on the pages that draw a figure."""
    if "Plotly.newPlot" in context.get("body", ""):
        app.add_js_file("plotly.min.js")


def setup(app):
    app.connect("html-page-context", _plotly_where_drawn)
'''


def build(source: Path = SOURCE_DIR, site: Path = SITE_DIR, executed: Path = EXECUTED_DIR) -> dict:
    """Write the source, run Sphinx (warnings are errors: a broken link or anchor fails the build),
    and answer what was built: pages, seconds, bytes, and the page to open."""
    started = time.perf_counter()
    pages = write_source(source, executed)
    if site.exists():
        shutil.rmtree(site)
    command = [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-W", "--keep-going", "-n", str(source), str(site)]
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"Sphinx failed to build the site ({' '.join(command)}):\n{run.stdout}{run.stderr}")
    (site / "index.html").write_text(_redirect(pages[0].docname), encoding="utf-8")
    size = sum(path.stat().st_size for path in site.rglob("*") if path.is_file())
    return {"pages": len(pages), "seconds": time.perf_counter() - started, "bytes": size, "index": site / "index.html"}


def _redirect(root_doc: str) -> str:
    """The site's index.html: Sphinx writes the root page under its own name."""
    return (f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{TITLE}</title>'
            f'<meta http-equiv="refresh" content="0; url={root_doc}.html"></head>'
            f'<body><a href="{root_doc}.html">{TITLE}</a></body></html>\n')
