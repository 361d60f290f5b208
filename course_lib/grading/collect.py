"""Collect a cohort's work from JupyterHub homes: ``python -m course_lib.grading.collect HUB_HOMES --out SUBMISSIONS``.

A learner is each direct sub-folder of HUB_HOMES holding a working copy ``course/`` (with a
``.course-manifest.json`` or an ``exercises/`` folder, see workspace.py); the folder's name is the
learner's name in SUBMISSIONS. ``--learners a,b`` names learners expected as well, so one who never
logged in is reported too. Into ``SUBMISSIONS/<learner>/`` go, as ``./course grade-cohort`` reads them:

* ``course/exercises/NN_name_exercise.ipynb`` for each exercise of the course's ``exercises/``, and the
  exercise's old name ``NN_name.ipynb`` that working copies made before the rename may hold (both when
  both are there: grade-cohort grades the new name, and the old only when the new is absent); other
  files are ignored;
* every exported scorecard under ``course/`` (a regular ``*.json`` file that reads as a scorecard of a
  course quiz), as ``<quiz>-1-<its path, / as __>-<hash>.json`` (see ``_flat``);
* for a quiz with no exported scorecard, each auto-saved one (``.course-quizzes/<id>/<quiz>.json``),
  as ``<quiz>-2-saved-<id>-<hash>.json``. The grader counts the first card per quiz by name, so an exported
  card always counts before an auto-saved one, and exported cards count in path order.

Everything in a home is the learner's, so it is read as data and never followed: a link (the learner
folder, ``course/``, a sub-folder or a file), a pipe or a device is refused and named in that learner's
line; every open is relative to the already opened folder with ``O_NOFOLLOW | O_NONBLOCK`` and checked
on the opened descriptor; files are size-capped, and at most ``MAX_ENTRIES`` names, ``MAX_DEPTH`` folders
deep, are looked at per learner. Folders named with a dot (``.ipynb_checkpoints``, ``.git``) are not
searched for scorecards.

SUBMISSIONS is collect's own: it must be empty, missing, or written by collect before (it then holds
``.course-collect``), unless ``--force``. Each learner folder is built aside and renamed into place, and
the folders of an earlier run's learners not in this run are removed (as are ``.collect-*`` folders an
interrupted run left; the grader skips dot folders), so a rerun on unchanged homes gives
the same files. Nothing is written outside SUBMISSIONS, and nothing in it is followed either.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from course_lib.exercise_files import exercise_file, exercise_modules, old_exercise_file
from course_lib.grading.cohort import MAX_NOTEBOOK_BYTES
from course_lib.grading.quizzes import (DIR_FLAGS, MAX_CARD_BYTES, READ_FLAGS, Refused, load_banks, parse_card,
                                        refusal_reason, require_regular, scorecard_answers, shown_name)
from course_lib.paths import REPO_ROOT
from course_lib.quiz.bank import QuizBank
from course_lib.quiz.learner import ANSWERS_FOLDER
from course_lib.workspace import MANIFEST

MAX_ENTRIES = 2000  # names looked at per learner (exercises, scorecard search, auto-saved answers together)
MAX_DEPTH = 4  # folder levels below course/ searched for exported scorecards
MARKER = ".course-collect"  # in SUBMISSIONS: the learner folders collect wrote there, one JSON list
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,99}")
_NOFOLLOW_DIR = DIR_FLAGS | os.O_NOFOLLOW
_LINK = "a symbolic link; not followed (the learner must replace it with the real file or folder)"


class CollectError(Exception):
    """SUBMISSIONS cannot be written as asked; the message says what to change."""


@dataclass
class Collected:
    """One learner's result: the files for their SUBMISSIONS folder (name -> bytes) and what was refused."""

    learner: str
    files: dict[str, bytes] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)  # "path: reason"
    old_names: dict[str, str] = field(default_factory=dict)  # exercises collected under their old name -> new name
    home: bool = True  # False: a --learners name with no home folder
    seen: int = 0  # names looked at, against MAX_ENTRIES

    def refuse(self, path: str, reason: str) -> None:
        self.refused.append(f"{shown_name(path)}: {reason}")

    def line(self) -> str:
        """The learner's summary line."""
        if not self.home:
            return f"{self.learner}: no home folder: never logged in"
        notebooks = sum(name.endswith(".ipynb") for name in self.files)
        exercises = notebooks - sum(new in self.files for new in self.old_names.values())  # modules handed in
        cards = len(self.files) - notebooks
        got = (f"{exercises} exercise{'s' * (exercises != 1)}, {cards} scorecard{'s' * (cards != 1)}"
               if self.files else "submitted nothing")
        old = [f"{name} (the exercise's old name; {new}, beside it, is graded)" if new in self.files
               else f"{name} (the exercise's old name; graded)" for name, new in sorted(self.old_names.items())]
        return (f"{self.learner}: {got}" + (f"; {'; '.join(old)}" if old else "")
                + (f"; refused: {'; '.join(self.refused)}" if self.refused else ""))


def wanted_exercises(root: Path = REPO_ROOT) -> dict[str, str]:
    """The exercise file names collected -> each one's name now: every exercise of the course's
    ``exercises/`` (``01_paging_exercise.ipynb``) and its old name (``01_paging.ipynb``)."""
    return {name: exercise_file(module) for module in exercise_modules(root)
            for name in (exercise_file(module), old_exercise_file(module))}


def _listing(folder: int, collected: Collected, shown: str) -> list[os.DirEntry]:
    """The entries of the open folder in name order, counted against MAX_ENTRIES (the rest dropped, reported)."""
    left = MAX_ENTRIES - collected.seen
    with os.scandir(folder) as entries:
        listed = sorted(entries, key=lambda entry: entry.name)
    if len(listed) > left:
        collected.refuse(shown, f"more than {MAX_ENTRIES} files in all; only the first {max(left, 0)} were looked at "
                         "(the learner should delete what is not course work)")
        listed = listed[:max(left, 0)]
    collected.seen += len(listed)
    return listed


def _open_folder(parent: int, entry: os.DirEntry, collected: Collected, shown: str) -> int | None:
    """The entry opened as a folder without following it; None (and the reason recorded) otherwise."""
    if entry.is_symlink():
        collected.refuse(shown, _LINK)
        return None
    try:
        return os.open(entry.name, _NOFOLLOW_DIR, dir_fd=parent)
    except OSError as error:  # ELOOP or ENOTDIR: replaced by a link or a file since the listing
        reason = _LINK if error.errno in (errno.ELOOP, errno.ENOTDIR) else f"could not be read ({refusal_reason(error)})"
        collected.refuse(shown, reason)
        return None


def _read_regular(folder: int, entry: os.DirEntry, cap: int) -> bytes:
    """The bytes of a regular file of the open folder, at most ``cap``; or Refused. The listing's type
    is checked before opening (a pipe or device is never opened), the opened descriptor's after."""
    if entry.is_symlink():
        raise Refused(_LINK)
    if not entry.is_file(follow_symlinks=False):
        require_regular(entry.stat(follow_symlinks=False).st_mode)
    try:
        descriptor = os.open(entry.name, READ_FLAGS, dir_fd=folder)
    except OSError as error:
        raise Refused(_LINK if error.errno == errno.ELOOP else f"could not be read ({refusal_reason(error)})") from None
    with os.fdopen(descriptor, "rb") as handle:
        info = os.fstat(handle.fileno())
        require_regular(info.st_mode)
        if info.st_nlink > 1:  # a hard link may name a file outside the home (O_NOFOLLOW stops only symlinks)
            raise Refused("a hard link to a file elsewhere; not collected (hand in a copy of the file itself)")
        data = handle.read(cap + 1)
    if len(data) > cap:
        raise Refused(f"larger than {cap // 2**20} MiB; not collected")
    return data


def _card(folder: int, entry: os.DirEntry, shown: str, collected: Collected,
          banks: Mapping[str, QuizBank]) -> tuple[str, bytes] | None:
    """The quiz and bytes of a scorecard file; None (the reason recorded) when it is not one of a course quiz."""
    try:
        data = _read_regular(folder, entry, MAX_CARD_BYTES)
        return scorecard_answers(parse_card(data), banks)[0], data
    except Refused as refusal:
        collected.refuse(shown, str(refusal))
        return None


def _flat(path: str) -> str:
    """A relative path as one safe, short file-name part, ASCII only (so never over the file system's
    255-byte limit, whatever script the learner names folders in) and unique by a hash of the whole
    path: ``notebooks/quiz 1.json`` -> ``notebooks__quiz_1-<8 hex>``."""
    readable = re.sub(r"[^A-Za-z0-9.-]", "_", path.removesuffix(".json").replace("/", "__"))[:80]
    return f"{readable}-{hashlib.sha256(path.encode()).hexdigest()[:8]}"


def _entry(folder: int, name: str) -> os.DirEntry | None:
    """The entry ``name`` of the open folder, or None."""
    with os.scandir(folder) as entries:
        return next((entry for entry in entries if entry.name == name), None)


def _exercises(course: int, collected: Collected, wanted: Mapping[str, str]) -> None:
    entry = _entry(course, "exercises")
    if entry is None:
        return
    folder = _open_folder(course, entry, collected, "course/exercises/")
    if folder is None:
        return
    try:
        for notebook in _listing(folder, collected, "course/exercises/"):
            if notebook.name in wanted:
                try:
                    collected.files[notebook.name] = _read_regular(folder, notebook, MAX_NOTEBOOK_BYTES)
                    if wanted[notebook.name] != notebook.name:
                        collected.old_names[notebook.name] = wanted[notebook.name]
                except Refused as refusal:
                    collected.refuse(f"course/exercises/{notebook.name}", str(refusal))
    finally:
        os.close(folder)


def _exported(folder: int, path: str, depth: int, collected: Collected, banks: Mapping[str, QuizBank],
              cards: dict[str, list[tuple[str, bytes]]]) -> None:
    """Search the open folder ``course/<path>`` for exported scorecards: quiz -> [(relative path, bytes)]."""
    for entry in _listing(folder, collected, f"course/{path}"):
        relative = f"{path}{entry.name}"
        if entry.name.startswith("."):  # .course-manifest.json, .ipynb_checkpoints, ...
            continue
        if entry.is_symlink():
            if not entry.name.endswith(".ipynb"):  # exercise links are _exercises' to report; other notebooks not collected
                collected.refuse(f"course/{relative}", _LINK)
        elif entry.is_dir(follow_symlinks=False):
            if depth >= MAX_DEPTH:
                collected.refuse(f"course/{relative}/", f"more than {MAX_DEPTH} folders deep; not searched")
                continue
            sub = _open_folder(folder, entry, collected, f"course/{relative}/")
            if sub is not None:
                try:
                    _exported(sub, f"{relative}/", depth + 1, collected, banks, cards)
                finally:
                    os.close(sub)
        elif entry.name.endswith(".json") and (found := _card(folder, entry, f"course/{relative}", collected, banks)):
            cards.setdefault(found[0], []).append((relative, found[1]))


def _saved(home: int, collected: Collected, banks: Mapping[str, QuizBank]) -> dict[str, list[tuple[str, bytes]]]:
    """The auto-saved scorecards of ``.course-quizzes/<id>/``: quiz -> [(id, bytes)], ids in name order."""
    saved: dict[str, list[tuple[str, bytes]]] = {}
    entry = _entry(home, ANSWERS_FOLDER)
    if entry is None:
        return saved
    answers = _open_folder(home, entry, collected, f"{ANSWERS_FOLDER}/")
    if answers is None:
        return saved
    try:
        for ident in _listing(answers, collected, f"{ANSWERS_FOLDER}/"):
            shown = f"{ANSWERS_FOLDER}/{ident.name}/"
            if not (ident.is_dir(follow_symlinks=False) or ident.is_symlink()):
                continue
            folder = _open_folder(answers, ident, collected, shown)
            if folder is None:
                continue
            try:
                for file in _listing(folder, collected, shown):
                    if file.name.endswith(".json") and (found := _card(folder, file, shown + file.name, collected, banks)):
                        saved.setdefault(found[0], []).append((_flat(ident.name), found[1]))
            finally:
                os.close(folder)
    finally:
        os.close(answers)
    return saved


def collect_learner(homes: int, entry: os.DirEntry, banks: Mapping[str, QuizBank],
                    wanted: Mapping[str, str]) -> Collected | None:
    """One home folder's collection; None when the entry is not a learner (no working copy)."""
    collected = Collected(entry.name)
    if entry.is_symlink():
        collected.refuse(f"{entry.name}/", "the home folder is " + _LINK)
        return collected
    home = _open_folder(homes, entry, collected, f"{entry.name}/")
    if home is None:
        return collected
    try:
        course_entry = _entry(home, "course")
        if course_entry is None:
            return None
        if course_entry.is_symlink():
            collected.refuse("course/", _LINK)
            return collected
        course = _open_folder(home, course_entry, collected, "course/")
        if course is None:
            return collected
        try:
            if _entry(course, MANIFEST) is None and _entry(course, "exercises") is None:
                return None
            _exercises(course, collected, wanted)
            exported: dict[str, list[tuple[str, bytes]]] = {}
            _exported(course, "", 1, collected, banks, exported)
        finally:
            os.close(course)
        for quiz, found in exported.items():
            for path, data in found:
                collected.files[f"{quiz}-1-{_flat(path)}.json"] = data
        for quiz, found in _saved(home, collected, banks).items():
            if quiz not in exported:
                for ident, data in found:
                    collected.files[f"{quiz}-2-saved-{ident}.json"] = data
    except OSError as error:
        collected.refuse(f"{entry.name}/", f"could not be read ({refusal_reason(error)})")
    finally:
        os.close(home)
    return collected


def collect_homes(hub_homes: Path, expected: list[str] = (), banks: Mapping[str, QuizBank] | None = None,
                  ) -> tuple[list[Collected], list[str]]:
    """Every learner of ``hub_homes`` plus the ``expected`` names, in name order; and notes on what was
    skipped (unsafe names, folders with no working copy). Reads only; nothing a home holds makes it raise."""
    banks = load_banks() if banks is None else banks
    wanted = wanted_exercises()
    learners: dict[str, Collected] = {}
    notes: list[str] = []
    skipped = 0
    homes = os.open(hub_homes, DIR_FLAGS)
    try:
        with os.scandir(homes) as entries:
            listed = sorted(entries, key=lambda entry: entry.name)
        for entry in listed:
            if entry.name.startswith("."):
                continue
            if not SAFE_NAME.fullmatch(entry.name):
                notes.append(f"{shown_name(entry.name)}: not collected: not a safe folder name (letters, digits and "
                             ". _ @ + - only, not starting with . _ @ + -); rename the home folder to collect it")
                continue
            if not (entry.is_dir(follow_symlinks=False) or entry.is_symlink()):
                continue
            collected = collect_learner(homes, entry, banks, wanted)
            if collected is None:
                skipped += 1
            else:
                learners[entry.name] = collected
    finally:
        os.close(homes)
    for name in expected:
        if name not in learners:
            learners[name] = Collected(name, home=os.path.lexists(hub_homes / name))
    if skipped:
        notes.append(f"{skipped} folder(s) without a course/ working copy skipped (not learners)")
    return [learners[name] for name in sorted(learners)], notes


def _remove(parent: int, name: str) -> None:
    """Remove ``name`` from the open folder, never following a link."""
    if stat.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
        shutil.rmtree(name, dir_fd=parent)
    else:
        os.unlink(name, dir_fd=parent)


def write_submissions(out: Path, learners: list[Collected], force: bool = False) -> list[str]:
    """Write each learner's files into ``out/<learner>/`` (built aside, then renamed into place; an empty
    folder for a learner with nothing, so the gradebook lists them as missing); remove the
    folders of an earlier collect's learners not in ``learners``; return lines about what was removed
    or left alone. Raises CollectError when ``out`` holds files collect did not write, unless ``force``."""
    out.mkdir(parents=True, exist_ok=True)
    root = os.open(out, DIR_FLAGS)
    try:
        names = set(os.listdir(root))
        earlier: set[str] = set()
        if MARKER in names:
            try:
                earlier = set(json.loads(_read_marker(root)))
            except (OSError, ValueError, TypeError) as error:
                raise CollectError(f"{out / MARKER} is unreadable ({error}); delete it or use an empty --out") from None
        foreign = sorted(names - earlier - {MARKER} - {n for n in names if n.startswith(".collect-")})
        if foreign and not force:
            raise CollectError(f"{out} holds files collect did not write ({', '.join(map(shown_name, foreign[:5]))}"
                               f"{', ...' if len(foreign) > 5 else ''}); use an empty --out folder, or pass --force "
                               "to write there anyway (those files are left alone)")
        lines = [f"left alone (not written by collect): {shown_name(name)}" for name in foreign]
        for name in sorted(n for n in names if n.startswith(".collect-")):  # an interrupted run's leftovers
            _remove(root, name)
        written = [c.learner for c in learners]
        for collected in learners:
            _replace(root, out, collected)
        for name in sorted(earlier - set(written)):
            if name in names and SAFE_NAME.fullmatch(name):
                _remove(root, name)
                lines.append(f"removed {name}/ (collected by an earlier run; no longer in HUB_HOMES)")
        _write_marker(root, out, sorted(written))
    finally:
        os.close(root)
    return lines


def _read_marker(root: int) -> str:
    descriptor = os.open(MARKER, READ_FLAGS, dir_fd=root)
    with os.fdopen(descriptor, "rb") as handle:
        require_regular(os.fstat(handle.fileno()).st_mode)
        return handle.read(MAX_CARD_BYTES).decode("utf-8")


def _write_marker(root: int, out: Path, written: list[str]) -> None:
    descriptor, staged = tempfile.mkstemp(dir=out, prefix=".collect-marker-")
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(written, indent=1) + "\n")
    os.rename(Path(staged).name, MARKER, src_dir_fd=root, dst_dir_fd=root)


def _replace(root: int, out: Path, collected: Collected) -> None:
    """Build ``out/<learner>/`` aside and rename it into place; an old one is moved aside, then removed."""
    staged = Path(tempfile.mkdtemp(dir=out, prefix=f".collect-{collected.learner}-")).name
    folder = os.open(staged, _NOFOLLOW_DIR, dir_fd=root)
    try:
        for name, data in sorted(collected.files.items()):
            with os.fdopen(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=folder),
                           "wb") as handle:
                handle.write(data)
    finally:
        os.close(folder)
    try:
        os.stat(collected.learner, dir_fd=root, follow_symlinks=False)
    except FileNotFoundError:
        os.rename(staged, collected.learner, src_dir_fd=root, dst_dir_fd=root)
        return
    old = f"{staged}-old"
    os.rename(collected.learner, old, src_dir_fd=root, dst_dir_fd=root)
    os.rename(staged, collected.learner, src_dir_fd=root, dst_dir_fd=root)
    _remove(root, old)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="course collect", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("hub_homes", type=Path, help="folder with one home folder per learner")
    parser.add_argument("--out", type=Path, required=True, help="SUBMISSIONS folder to write (grade it with "
                        "./course grade-cohort SUBMISSIONS)")
    parser.add_argument("--learners", default="", help="comma-separated learner names expected (reported even "
                        "when they never logged in)")
    parser.add_argument("--force", action="store_true", help="write into an --out that holds other files")
    args = parser.parse_args(argv)
    expected = [name.strip() for name in args.learners.split(",") if name.strip()]
    unsafe = [name for name in expected if not SAFE_NAME.fullmatch(name)]
    if unsafe:
        parser.error(f"--learners: {', '.join(map(repr, unsafe))} not a safe folder name "
                     "(letters, digits and . _ @ + - only, not starting with . _ @ + -)")
    if not args.hub_homes.is_dir():
        parser.error(f"{args.hub_homes} is not a folder; pass the folder holding the learners' home folders")
    learners, notes = collect_homes(args.hub_homes, expected)
    try:
        notes += write_submissions(args.out, learners, force=args.force)
    except CollectError as error:
        parser.exit(2, f"course collect: {error}\n")
    for collected in learners:
        print(collected.line())
    for note in notes:
        print(note)
    print(f"wrote {len(learners)} learner folder(s) in {args.out}; grade them with "
          f"./course grade-cohort {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
