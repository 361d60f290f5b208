"""Where ``./course hub`` keeps its state: a private folder outside the course checkout.

The hub's state is its sqlite database (every account's password hash), its cookie secret (who
holds it can forge any learner's or admin's login), the proxy's pid file and, with the ``simple``
spawner, the learners' homes. It lives in ``$XDG_STATE_HOME/llm-serving-course/hub`` (by default
``~/.local/state/llm-serving-course/hub``; ``/root/...`` for ``sudo ./course hub``), made mode 700
with umask 077, so that nothing which shows the course checkout shows it: not the learners'
servers (they run the checkout's ``.venv`` and can read the whole checkout), not a graded
notebook, not a backup or copy of the checkout handed to someone. ``COURSE_HUB_STATE`` overrides
the place (one folder per hub when one box runs two).

Before this, the state's default was ``.hub/`` inside the checkout. ``prepare`` moves such an old
state (database, cookie secret, proxy pid, homes) into the new folder the first time the hub
starts, unless the hub looks like it is still running from there or the new folder already holds
a state; then it stops and says what to do. ``.hub/node`` (configurable-http-proxy, installed by
npm) stays in the checkout: it is a program, not a secret.

``python -m course_lib.hub_state --checkout DIR`` prepares the folder and prints its path
(``./course hub`` runs it); ``deploy/jupyterhub/jupyterhub_config.py`` uses ``state_folder``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import Mapping

OLD_STATE = ".hub"  # inside the checkout: the old default
STATE_FILES = ("jupyterhub.sqlite", "jupyterhub_cookie_secret")  # what makes a folder a hub's state
MOVED = ("jupyterhub.sqlite", "jupyterhub.sqlite-journal", "jupyterhub.sqlite-wal", "jupyterhub.sqlite-shm",
         "jupyterhub_cookie_secret", "proxy.pid", "homes")


class StateError(RuntimeError):
    """The state cannot be prepared without a person's decision; the message says what to do."""


def default_state(environ: Mapping[str, str] = os.environ) -> Path:
    """``$XDG_STATE_HOME/llm-serving-course/hub``, else ``~/.local/state/llm-serving-course/hub``."""
    base = environ.get("XDG_STATE_HOME") or ""
    root = Path(base) if os.path.isabs(base) else Path(environ.get("HOME") or Path.home()) / ".local" / "state"
    return root / "llm-serving-course" / "hub"


def state_folder(environ: Mapping[str, str] = os.environ) -> Path:
    """The hub's state folder: ``COURSE_HUB_STATE`` when set, else ``default_state``."""
    return Path(environ.get("COURSE_HUB_STATE") or default_state(environ)).resolve()


def has_state(folder: Path) -> bool:
    return any((folder / name).exists() for name in STATE_FILES)


def _running(old: Path) -> int | None:
    """The pid in ``old/proxy.pid`` when that process is alive (a hub may be running from there)."""
    try:
        pid = int((old / "proxy.pid").read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def prepare(checkout: Path, environ: Mapping[str, str] = os.environ, say=print) -> Path:
    """Make the state folder (mode 700, umask 077), move an old ``checkout/.hub`` state into it
    when the default place is used, and return it. Raises ``StateError`` when a person must choose."""
    state = state_folder(environ)
    old = Path(checkout).resolve() / OLD_STATE
    overridden = bool(environ.get("COURSE_HUB_STATE"))
    if overridden and state.is_relative_to(Path(checkout).resolve()):
        say(f"warning: COURSE_HUB_STATE={state} is inside the course checkout, which every learner's server "
            f"and anyone given a copy of the checkout can read; a folder outside it (the default is "
            f"{default_state(environ)}) keeps the password hashes and the cookie secret private.")
    previous = os.umask(0o077)
    try:
        state.mkdir(parents=True, exist_ok=True)
    finally:
        os.umask(previous)
    state.chmod(0o700)
    if overridden or state == old or not has_state(old):
        return state
    pid = _running(old)
    if pid is not None:
        raise StateError(f"the hub's state is still in {old} (inside the course checkout) and process {pid} named "
                         f"in its proxy.pid is running: stop that hub first, then start ./course hub again to move "
                         f"the state to {state}.")
    if has_state(state):
        raise StateError(f"there is hub state in both {old} (the old place, inside the course checkout) and {state} "
                         f"(the new one). Keep the one you use: move the other away (or run with "
                         f"COURSE_HUB_STATE={old} to keep using the old one for now), then start ./course hub again.")
    moved = []
    for name in MOVED:
        if os.path.lexists(old / name):
            shutil.move(str(old / name), str(state / name))
            moved.append(name)
    say(f"Moved the hub's state ({', '.join(moved)}) out of the course checkout: {old} -> {state} (mode 700). "
        f"Back up {state}; {old} keeps only node/ (the proxy's program).")
    return state


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.hub_state", description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", type=Path, required=True, help="the course checkout ./course hub runs from")
    args = parser.parse_args(argv)
    try:
        state = prepare(args.checkout, say=lambda text: print(text, file=sys.stderr))
    except StateError as error:
        print(f"./course hub: {error}", file=sys.stderr)
        return 1
    print(state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
