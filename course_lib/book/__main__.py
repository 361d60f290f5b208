"""``./course book``: run the lessons whose executed copy is missing or older than the lesson file
(as the test suite runs them, with their checks), then build the website and say where it is.

    ./course book              run what is stale, then build build/site/
    ./course book --no-run     build only; a stale lesson is an error that names it
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from course_lib.book.executed import EXECUTED_DIR, fresh
from course_lib.book.site import SITE_DIR, SOURCE_DIR, build
from course_lib.outline import OUTLINE
from course_lib.paths import NOTEBOOK_DIR, REPO_ROOT


def stale_lessons() -> list[str]:
    """The lesson files (``notebooks/NN.ipynb``, repository-relative) with no executed copy of the file as it is."""
    return [f"notebooks/{entry.file}" for entry in OUTLINE if not fresh(NOTEBOOK_DIR / entry.file, EXECUTED_DIR)]


def run_lessons(lessons: list[str], workers: int) -> None:
    """Run ``lessons`` whole under pytest, as ``./course test`` does: nbval, the Run All and widget
    checks, and the executed copies those checks write."""
    command = [sys.executable, "-m", "pytest", "-q", "-n", str(workers), "--dist", "loadfile", *lessons]
    print(f"Running {len(lessons)} lesson(s) to record their outputs (a few minutes): {' '.join(command)}", flush=True)
    if subprocess.run(command, cwd=REPO_ROOT).returncode != 0:
        raise SystemExit("A lesson failed its run (above), so the site was not built: fix it, then run ./course book.")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build the course's website into build/site/.")
    parser.add_argument("--no-run", action="store_true", help="do not run stale lessons; fail on one instead")
    parser.add_argument("--workers", type=int, default=int(os.environ.get("COURSE_TEST_WORKERS", "2")),
                        help="pytest workers for running lessons (default 2)")
    args = parser.parse_args(argv)
    stale = stale_lessons()
    if stale and args.no_run:
        raise SystemExit(f"No executed copy of the lessons as they are now: {', '.join(stale)}. Run ./course book "
                         "(it runs them) or ./course test first.")
    if stale:
        run_lessons(stale, args.workers)
    print(f"Building the site from {EXECUTED_DIR.relative_to(REPO_ROOT)}/ (Sphinx, MyST-NB)...", flush=True)
    built = build(SOURCE_DIR, SITE_DIR, EXECUTED_DIR)
    print(f"Built {built['pages']} pages in {built['seconds']:.0f} s, {built['bytes'] / 2**20:.1f} MiB: "
          f"open {built['index']}")


if __name__ == "__main__":
    main()
