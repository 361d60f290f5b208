"""deploy/jupyterhub/jupyterhub_config.py under every authenticator x spawner x GPU setting: it loads,
sets only traits that exist on the classes it configures (a misspelt one would only be a warning
at hub start), keeps its state private, and hands MIG slices out by user id. The cohort test
(tests/browser/test_hub_cohort.py) runs one setting for real."""

from __future__ import annotations

import importlib
import itertools
import os
import runpy
import stat
import subprocess
from types import SimpleNamespace

import pytest
from traitlets.config import Config

from course_lib.paths import REPO_ROOT

pytest.importorskip("jupyterhub")
CONFIG = REPO_ROOT / "deploy" / "jupyterhub" / "jupyterhub_config.py"
CLASSES = {  # the configurable classes the config may set, where they live
    "JupyterHub": "jupyterhub.app", "ConfigurableHTTPProxy": "jupyterhub.proxy", "Authenticator": "jupyterhub.auth",
    "DummyAuthenticator": "jupyterhub.auth", "NativeAuthenticator": "nativeauthenticator",
    "Spawner": "jupyterhub.spawner", "SimpleLocalProcessSpawner": "jupyterhub.spawner",
    "SystemdSpawner": "systemdspawner", "LTI13Authenticator": "ltiauthenticator.lti13.auth",
}
AUTH_ENV = {"native": {}, "dummy": {"COURSE_HUB_DUMMY_PASSWORD": "x"},
            "lti": {f"COURSE_HUB_LTI_{key}": "https://lms.example.org/x"
                    for key in ("ISSUER", "CLIENT_ID", "AUTHORIZE_URL", "JWKS_URL")}}


def load(monkeypatch, tmp_path, **env) -> Config:
    monkeypatch.setenv("COURSE_HUB_STATE", str(tmp_path / "state"))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    config = Config()
    monkeypatch.setattr("os.umask", lambda mask: 0o022)  # the config's umask would outlive the test
    runpy.run_path(str(CONFIG), init_globals={"get_config": lambda: config})
    return config


@pytest.mark.parametrize("auth, spawner, gpu", list(itertools.product(
    ["native", "dummy", "lti"], ["system", "systemd", "simple"], ["shared", "none", "MIG-a,MIG-b"])))
def test_every_setting_loads_and_names_only_real_traits(monkeypatch, tmp_path, auth, spawner, gpu):
    config = load(monkeypatch, tmp_path, COURSE_HUB_AUTH=auth, COURSE_HUB_SPAWNER=spawner, COURSE_HUB_GPU=gpu,
                  **AUTH_ENV[auth])
    for section, traits in config.items():
        try:
            cls = getattr(importlib.import_module(CLASSES[section]), section)
        except ImportError:  # an optional package (systemdspawner, ltiauthenticator) not installed here
            continue
        unknown = sorted(set(traits) - set(cls.class_trait_names(config=True)))
        assert not unknown, f"{section} has no traits {unknown}"
    assert stat.S_IMODE((tmp_path / "state").stat().st_mode) == 0o700  # the password hashes' folder
    assert "root" in config.Authenticator.blocked_users
    if auth == "native":
        assert not config.Authenticator.get("allowed_users")  # listing a name would skip the admin's approval
    environment = config.Spawner.environment
    assert environment["COURSE_LEARNER"](SimpleNamespace(user=SimpleNamespace(name="alice", id=3))) == "alice"
    if gpu.startswith("MIG"):
        devices = [environment["CUDA_VISIBLE_DEVICES"](SimpleNamespace(user=SimpleNamespace(id=n))) for n in range(4)]
        assert devices == ["MIG-a", "MIG-b", "MIG-a", "MIG-b"]
    else:
        assert environment.get("CUDA_VISIBLE_DEVICES", "unset") == ("" if gpu == "none" else "unset")


def test_a_wrong_setting_says_what_to_use(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="use system, systemd or simple"):
        load(monkeypatch, tmp_path, COURSE_HUB_SPAWNER="docker")
    with pytest.raises(ValueError, match="use native, dummy"):
        load(monkeypatch, tmp_path, COURSE_HUB_AUTH="github")


def test_a_learners_server_starts_in_the_working_copy_with_its_course_command(monkeypatch, tmp_path):
    """The server runs in ~/course (the file browser's root, where a Terminal opens), knows it as
    COURSE_WORKDIR, and the copy's own ./course is there to grade with."""
    fake_bin, home = tmp_path / "bin", tmp_path / "home"
    fake_bin.mkdir()
    home.mkdir()
    python = fake_bin / "python"  # the course's venv Python, reached through the bin folder the hub sees
    python.write_text(f"#!/bin/sh\nexec {REPO_ROOT / '.venv' / 'bin' / 'python'} \"$@\"\n")
    singleuser = fake_bin / "jupyterhub-singleuser"  # stands in for the server: reports where it runs
    singleuser.write_text('#!/bin/sh\necho "cwd=$PWD workdir=$COURSE_WORKDIR args=$*"\n')
    for script in (python, singleuser):
        script.chmod(0o755)
    monkeypatch.setattr("sys.executable", str(python))
    config = load(monkeypatch, tmp_path, COURSE_HUB_SPAWNER="simple")
    assert "notebook_dir" not in config.Spawner and config.Spawner.default_url.startswith("/lab/tree/notebooks/")
    started = subprocess.run([*config.Spawner.cmd, "--port=1"], env={"HOME": str(home), "PATH": os.environ["PATH"]},
                             cwd=home, capture_output=True, text=True, timeout=120)
    copy = home / "course"
    assert started.returncode == 0, started.stderr
    assert started.stdout.splitlines()[-1] == f"cwd={copy} workdir={copy} args=--port=1"
    assert (copy / "notebooks" / "00_start_here.ipynb").is_file() and os.access(copy / "course", os.X_OK)
