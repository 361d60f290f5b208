"""A learner's own working copy of the course notebooks, so JupyterLab never writes into the checkout.

``./course lab`` opens the working copy (``my-work/`` in the course folder, or ``$COURSE_WORKDIR``),
creating it on first use from ``notebooks/`` and ``exercises/`` and adding any notebook the
course gained since. ``./course refresh`` brings course updates into it:

* a copy whose cells' *sources* are as they were copied is replaced by the course's new
  version (running a lesson only changes outputs, so lessons follow the course);
* a copy whose sources the learner edited (an exercise being worked on) is kept, and the new
  version is written beside it as ``NAME.updated.ipynb``;
* files the learner created are never touched;
* a file that is not a readable notebook counts as edited;
* the new version beside an edited copy is written once per course version, and never over a
  ``NAME.updated.ipynb`` the learner has edited since.

Every sync (``./course lab``, ``./course refresh`` and the hub's start-up copy) first moves exercises
made under their old name (``exercises/04_roofline.ipynb``, see ``exercise_files``) to their name
now (``exercises/04_roofline_exercise.ipynb``): an unedited one is removed, and the course's exercise
is copied under the new name; an edited one is renamed, keeping the learner's edits, unless a file of
the new name is there already: then both are kept, and the report says which one is graded.

The working copy also holds its own ``./course`` (``write_command``): a two-line script that runs the
course's ``course`` command for *this* copy, so in JupyterLab's Terminal, which opens in the working
copy, ``./course grade exercises/01_paging_exercise.ipynb`` grades the learner's notebook. It is rewritten at
every start (a file of that name the learner wrote themselves is left alone, with a warning).

The manifest ``.course-manifest.json`` records, per file, a hash of the cell sources as copied
(``copied``) and as last offered beside an edited copy (``offered``); it is saved after every
change, so an interrupted refresh never misreports a lesson as edited.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import sys
from pathlib import Path

from course_lib.exercise_files import exercise_file, exercise_modules, old_exercise_file
from course_lib.paths import REPO_ROOT

CONTENT_FOLDERS = ("notebooks", "exercises")
MANIFEST = ".course-manifest.json"
COMMAND = "course"
COMMAND_MARK = "# This working copy's ./course, written by course_lib/workspace.py"


def default_workdir() -> Path:
    return Path(os.environ.get("COURSE_WORKDIR", REPO_ROOT / "my-work"))


def sources_hash(notebook: Path) -> str | None:
    """A hash of the notebook's cell types and sources (outputs, counts and metadata do not
    count); None when the file is not a readable notebook."""
    try:
        cells = json.loads(notebook.read_text(encoding="utf-8")).get("cells", [])
        text = json.dumps([(c.get("cell_type"), "".join(c.get("source", ""))) for c in cells])
    except (OSError, UnicodeDecodeError, ValueError, AttributeError, TypeError):
        return None
    return hashlib.sha256(text.encode()).hexdigest()


def _load_manifest(path: Path) -> dict[str, dict[str, str]]:
    try:
        manifest = json.loads(path.read_text())
        return {"copied": dict(manifest["copied"]), "offered": dict(manifest["offered"])}
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError):
        print(f"warning: {path} is unreadable; treating every notebook there as possibly edited.", file=sys.stderr)
    return {"copied": {}, "offered": {}}


def _save_manifest(path: Path, manifest: dict[str, dict[str, str]]) -> None:
    path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def _rename_old_exercise(workdir: Path, module: str, manifest: dict[str, dict[str, str]]) -> str | None:
    """Move ``module``'s exercise from its old name to its new one (rules in the module docstring);
    a report line, or None when there is no old-name copy."""
    old_name, new_name = f"exercises/{old_exercise_file(module)}", f"exercises/{exercise_file(module)}"
    old, new = workdir / old_name, workdir / new_name
    if not old.is_file():
        return None
    copied = manifest["copied"].get(old_name)
    edited = copied is None or sources_hash(old) != copied
    if edited and new.exists():
        return (f"kept     {old_name} (you edited it) beside {new_name}, the exercise's new name: {new_name} is "
                "the one graded and collected, so move your work into it")
    beside = old.with_suffix(".updated.ipynb")  # the course's version offered beside the old copy
    if beside.is_file() and sources_hash(beside) == manifest["offered"].get(old_name):
        beside.unlink()
    if edited:
        old.rename(new)
        if copied is not None:
            manifest["copied"][new_name] = copied
        line = f"renamed  {old_name} -> {new_name} (the exercise's new name), with your edits"
    else:
        old.unlink()
        line = f"replaced {old_name} (unedited) by {new_name}, the exercise's new name"
    manifest["copied"].pop(old_name, None)
    manifest["offered"].pop(old_name, None)
    return line + "; if JupyterLab has it open, close that tab and open the new name"


def _refresh_one(source: Path, copy: Path, name: str, manifest: dict[str, dict[str, str]]) -> str | None:
    """Bring one existing copy up to date (rules in the module docstring); a report line or None."""
    course_hash, copied = sources_hash(source), manifest["copied"].get(name)
    if course_hash == copied:
        return None
    mine = sources_hash(copy)
    if mine == course_hash:  # the learner's copy already reads like the new version
        manifest["copied"][name] = course_hash
        return None
    if mine is not None and mine == copied:
        shutil.copyfile(source, copy)
        manifest["copied"][name] = course_hash
        return f"updated  {name}"
    beside = copy.with_suffix(".updated.ipynb")
    offered = manifest["offered"].get(name)
    if offered == course_hash and beside.exists():
        return None  # already offered
    why = "not a readable notebook" if mine is None else "you edited it"
    if beside.exists() and sources_hash(beside) != offered:
        return f"kept     {name} ({why}); {beside.name} has your edits too, so the new version was not written"
    shutil.copyfile(source, beside)
    manifest["offered"][name] = course_hash
    return f"kept     {name} ({why}); the course's new version is {beside.parent.name}/{beside.name}"


def sync(workdir: Path, course_root: Path = REPO_ROOT, refresh: bool = False) -> list[str]:
    """Copy course notebooks missing from ``workdir``; with ``refresh``, also update existing
    copies by the rules in the module docstring. Returns one line per file changed."""
    workdir.mkdir(parents=True, exist_ok=True)
    manifest_path = workdir / MANIFEST
    manifest = _load_manifest(manifest_path)
    report = []
    for module in exercise_modules(course_root):
        line = _rename_old_exercise(workdir, module, manifest)
        if line:
            report.append(line)
            _save_manifest(manifest_path, manifest)
    for folder in CONTENT_FOLDERS:
        for source in sorted((course_root / folder).glob("*.ipynb")):
            name = f"{folder}/{source.name}"
            copy = workdir / name
            before = json.dumps(manifest, sort_keys=True)
            if not copy.exists():
                copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, copy)
                manifest["copied"][name] = sources_hash(source)
                line = f"added    {name}"
            elif refresh:
                line = _refresh_one(source, copy, name, manifest)
            else:
                continue
            if line:
                report.append(line)
            if json.dumps(manifest, sort_keys=True) != before:  # saved file by file: see the module docstring
                _save_manifest(manifest_path, manifest)
    return report


def command_script(workdir: Path, course_root: Path = REPO_ROOT) -> str:
    """The working copy's ``./course``: the course's command with ``COURSE_WORKDIR`` set to this copy
    and ``COURSE_VENV``, unless set, to the virtual environment running this (when it is one), so that
    grading, ``refresh`` and ``check`` all act on this copy with the course's environment."""
    venv = f"COURSE_VENV=${{COURSE_VENV:-{shlex.quote(sys.prefix)}}} " if sys.prefix != sys.base_prefix else ""
    return (f"#!/bin/sh\n{COMMAND_MARK} at every start; your edits here are replaced.\n"
            f"# It runs the course's own command for this copy: ./course grade exercises/{exercise_file('01_paging')}\n"
            f"COURSE_WORKDIR={shlex.quote(str(workdir.resolve()))} {venv}"
            f"exec {shlex.quote(str(course_root.resolve() / COMMAND))} \"$@\"\n")


def write_command(workdir: Path, course_root: Path = REPO_ROOT) -> None:
    """Write ``command_script`` to ``workdir/course`` (executable), unless a ``course`` the learner
    made is there: that one is kept, with a warning."""
    path = workdir / COMMAND
    try:
        mine = path.exists() and COMMAND_MARK not in path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        mine = True
    if mine:
        print(f"warning: {path} is not the course's; kept it. From the course folder, ./course grade "
              f"{workdir}/exercises/{exercise_file('NN_name')} grades your work.", file=sys.stderr)
        return
    text = command_script(workdir, course_root)
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")
    path.chmod(0o755)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="course refresh", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--refresh", action="store_true", help="bring course updates into the working copy")
    parser.add_argument("--workdir", type=Path, default=None, help="the working copy (default: my-work/)")
    args = parser.parse_args(argv)
    workdir = args.workdir or default_workdir()
    first = not workdir.exists()
    lines = sync(workdir, refresh=args.refresh)
    write_command(workdir)
    if first:
        print(f"Created your working copy of the course in {workdir}; your notebooks and answers live there.")
    elif lines or args.refresh:
        print("\n".join(lines) or "Your working copy is up to date.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
