"""Command line: ``python -m course_lib.grading NOTEBOOK...`` grades notebooks (``./course grade``).

For course authors, ``--build`` re-executes every solution and writes its exercise twin,
and re-executes every lesson, keeping only the outputs the test suite compares."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from course_lib.grading.execute import execute
from course_lib.grading.exercise import write_exercise
from course_lib.grading.grade import grade
from course_lib.paths import REPO_ROOT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="course grade", description=__doc__)
    parser.add_argument("notebooks", nargs="*", help="notebooks to grade, e.g. exercises/01_paging.ipynb")
    parser.add_argument("--build", action="store_true",
                        help="execute solutions/ and notebooks/, and write exercises/ from the solutions; "
                             "with notebooks named, build only those")
    args = parser.parse_args(argv)
    if args.build:
        chosen = {Path(n).stem for n in args.notebooks}
        for solution in sorted((REPO_ROOT / "solutions").glob("*.ipynb")):
            if chosen and solution.stem not in chosen:
                continue
            execute(solution, keep_all_outputs=True)
            exercise = write_exercise(solution, REPO_ROOT / "exercises" / solution.name)
            print("executed", solution.relative_to(REPO_ROOT), "and wrote", exercise.relative_to(REPO_ROOT))
        for lesson in sorted((REPO_ROOT / "notebooks").glob("*.ipynb")):
            if chosen and lesson.stem not in chosen:
                continue
            execute(lesson, keep_all_outputs=False)
            print("executed", lesson.relative_to(REPO_ROOT))
        return 0
    if not args.notebooks:
        parser.error("name at least one notebook to grade, e.g. exercises/01_paging.ipynb")
    failed = 0
    for notebook in args.notebooks:
        print(f"== Grading {notebook}", flush=True)
        result = grade(notebook)
        print(f"== {notebook}: {'PASS' if result.returncode == 0 else 'FAIL'}", flush=True)
        failed += result.returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
