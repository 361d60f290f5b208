"""The hub's state (course_lib/hub_state.py): a private folder outside the course checkout, an old
``.hub/`` state moved there once, and ``./course hub`` and the hub's config agreeing on the place."""

from __future__ import annotations

import os
import runpy
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from traitlets.config import Config

from course_lib.hub_state import StateError, default_state, prepare, state_folder
from course_lib.paths import REPO_ROOT


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def box(tmp_path):
    """A checkout with an old-style .hub/ state, and a home for the hub's user."""
    checkout, home = tmp_path / "course", tmp_path / "root"
    old = checkout / ".hub"
    (old / "node" / "node_modules").mkdir(parents=True)
    (old / "jupyterhub.sqlite").write_text("every account's password hash")
    (old / "jupyterhub_cookie_secret").write_text("forges any login")
    (old / "homes" / "alice" / "course").mkdir(parents=True)
    (old / "homes" / "alice" / "course" / "work.ipynb").write_text("{}")
    home.mkdir()
    return checkout, home, {"HOME": str(home)}


def test_the_default_is_a_private_folder_outside_the_checkout(tmp_path):
    assert default_state({"HOME": "/home/hubowner"}) == Path("/home/hubowner/.local/state/llm-serving-course/hub")
    assert default_state({"HOME": "/h", "XDG_STATE_HOME": "/srv/state"}) == Path("/srv/state/llm-serving-course/hub")
    assert default_state({"HOME": "/h", "XDG_STATE_HOME": "relative"}) == Path("/h/.local/state/llm-serving-course/hub")
    assert state_folder({"HOME": "/h", "COURSE_HUB_STATE": str(tmp_path / "mine")}) == tmp_path / "mine"
    state = prepare(tmp_path / "course", {"HOME": str(tmp_path / "home")}, say=lambda text: None)
    assert state == tmp_path / "home" / ".local" / "state" / "llm-serving-course" / "hub"
    assert mode(state) == 0o700 and mode(state.parent) == 0o700  # made with umask 077
    assert not state.is_relative_to(tmp_path / "course")


def test_an_old_state_in_the_checkout_is_moved_out_and_node_stays(box):
    checkout, home, environ = box
    said = []
    state = prepare(checkout, environ, say=said.append)
    assert (state / "jupyterhub.sqlite").read_text() == "every account's password hash"
    assert (state / "jupyterhub_cookie_secret").read_text() == "forges any login"
    assert (state / "homes" / "alice" / "course" / "work.ipynb").exists()
    assert sorted(p.name for p in (checkout / ".hub").iterdir()) == ["node"]  # the proxy's program stays
    assert len(said) == 1 and str(checkout / ".hub") in said[0] and str(state) in said[0]
    assert prepare(checkout, environ, say=said.append) == state and len(said) == 1  # once only


def test_state_in_both_places_stops_and_says_what_to_do(box):
    checkout, home, environ = box
    state = default_state(environ)
    state.mkdir(parents=True)
    (state / "jupyterhub.sqlite").write_text("the new one")
    with pytest.raises(StateError, match="both") as error:
        prepare(checkout, environ, say=lambda text: None)
    assert "COURSE_HUB_STATE=" in str(error.value)
    assert (checkout / ".hub" / "jupyterhub.sqlite").exists()
    assert (state / "jupyterhub.sqlite").read_text() == "the new one"


def test_a_hub_still_running_from_the_old_place_is_not_moved(box):
    checkout, home, environ = box
    (checkout / ".hub" / "proxy.pid").write_text(str(os.getpid()))
    with pytest.raises(StateError, match="stop that hub first"):
        prepare(checkout, environ, say=lambda text: None)
    assert (checkout / ".hub" / "jupyterhub.sqlite").exists()


def test_an_override_is_used_as_it_is_and_warned_about_inside_the_checkout(box):
    checkout, home, environ = box
    said = []
    state = prepare(checkout, {**environ, "COURSE_HUB_STATE": str(checkout / ".hub")}, say=said.append)
    assert state == checkout / ".hub" and (state / "jupyterhub.sqlite").exists()
    assert len(said) == 1 and "inside the course checkout" in said[0]
    elsewhere = home / "hub-b"
    assert prepare(checkout, {**environ, "COURSE_HUB_STATE": str(elsewhere)}, say=said.append) == elsewhere
    assert mode(elsewhere) == 0o700 and len(said) == 1 and (checkout / ".hub" / "jupyterhub.sqlite").exists()


def test_the_command_prints_the_folder_or_fails_with_the_reason(box):
    checkout, home, environ = box
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **environ}
    done = subprocess.run([sys.executable, "-m", "course_lib.hub_state", "--checkout", str(checkout)],
                          capture_output=True, text=True, env=env, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(default_state(environ)) and "Moved the hub's state" in done.stderr
    (checkout / ".hub" / "jupyterhub_cookie_secret").write_text("again")
    done = subprocess.run([sys.executable, "-m", "course_lib.hub_state", "--checkout", str(checkout)],
                          capture_output=True, text=True, env=env, cwd=REPO_ROOT)
    assert done.returncode == 1 and done.stdout == "" and "both" in done.stderr


def test_course_hub_and_the_hubs_config_agree_on_the_place(monkeypatch, tmp_path):
    pytest.importorskip("jupyterhub")
    script = (REPO_ROOT / "course").read_text()
    assert "course_lib.hub_state --checkout" in script and "$PWD/.hub}" not in script
    monkeypatch.delenv("COURSE_HUB_STATE", raising=False)
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr("os.umask", lambda mask: 0o022)  # the config's umask would outlive the test
    config = Config()
    runpy.run_path(str(REPO_ROOT / "deploy" / "jupyterhub" / "jupyterhub_config.py"),
                   init_globals={"get_config": lambda: config})
    state = default_state({"HOME": str(tmp_path)})
    assert config.JupyterHub.db_url == f"sqlite:///{state / 'jupyterhub.sqlite'}"
    assert config.JupyterHub.cookie_secret_file == str(state / "jupyterhub_cookie_secret")
    assert not state.is_relative_to(REPO_ROOT) and mode(state) == 0o700
