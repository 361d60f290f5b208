"""A learner's own working copy of the course notebooks, so JupyterLab never writes into the checkout.

``./course lab`` opens the working copy (``my-work/`` in the course folder, or ``$COURSE_WORKDIR``),
creating it on first use from ``notebooks/`` and ``exercises/`` and adding any notebook the
course gained since. ``./course refresh`` brings course updates into it:

* a copy whose cells' *sources* are as they were copied is replaced by the course's new
  version (running a lesson only changes outputs, so lessons follow the course);
* a copy whose sources the learner edited (an exercise being worked on) is kept, and the new
  version is written beside it as ``NAME.updated.ipynb``;
* files the learner created are never touched.

The manifest ``.course-manifest.json`` records, per file, a hash of the cell sources as copied.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

from course_lib.paths import REPO_ROOT

CONTENT_FOLDERS = ("notebooks", "exercises")
MANIFEST = ".course-manifest.json"


def default_workdir() -> Path:
    return Path(os.environ.get("COURSE_WORKDIR", REPO_ROOT / "my-work"))


def sources_hash(notebook: Path) -> str:
    """A hash of the notebook's cell types and sources: outputs, counts and metadata do not count."""
    cells = json.loads(notebook.read_text(encoding="utf-8")).get("cells", [])
    text = json.dumps([(c.get("cell_type"), "".join(c.get("source", ""))) for c in cells])
    return hashlib.sha256(text.encode()).hexdigest()


def sync(workdir: Path, course_root: Path = REPO_ROOT, refresh: bool = False) -> list[str]:
    """Copy new course notebooks into ``workdir``; with ``refresh``, also update existing copies
    by the rules in the module docstring. Returns one line per file changed."""
    manifest_path = workdir / MANIFEST
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    report = []
    for folder in CONTENT_FOLDERS:
        for source in sorted((course_root / folder).glob("*.ipynb")):
            name = f"{folder}/{source.name}"
            copy = workdir / name
            course_hash = sources_hash(source)
            if not copy.exists():
                copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, copy)
                manifest[name] = course_hash
                report.append(f"added    {name}")
            elif refresh and course_hash != manifest.get(name):
                if sources_hash(copy) == manifest.get(name):
                    shutil.copyfile(source, copy)
                    manifest[name] = course_hash
                    report.append(f"updated  {name}")
                else:
                    beside = copy.with_suffix(".updated.ipynb")
                    shutil.copyfile(source, beside)
                    report.append(f"kept     {name} (you edited it); the course's new version is "
                                  f"{folder}/{beside.name}")
    workdir.mkdir(parents=True, exist_ok=True)
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="course refresh", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--refresh", action="store_true", help="bring course updates into the working copy")
    parser.add_argument("--workdir", type=Path, default=None, help="the working copy (default: my-work/)")
    args = parser.parse_args(argv)
    workdir = args.workdir or default_workdir()
    first = not workdir.exists()
    lines = sync(workdir, refresh=args.refresh)
    if first:
        print(f"Created your working copy of the course in {workdir}; your notebooks and answers live there.")
    elif lines or args.refresh:
        print("\n".join(lines) or "Your working copy is up to date.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
