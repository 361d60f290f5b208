"""The ``./course`` command as a learner meets it: help exits 0 and an unknown command 2; ``./course lab``
runs JupyterLab inside the working copy, so a Terminal opens there (or in the file browser's folder
of the copy), and the copy's own ``./course grade exercises/NN_name_exercise.ipynb`` grades the learner's notebook;
its set-up installs JupyterLab's course defaults (no Jupyter-news toast)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from test_gpu_report import launcher_is_set_up
from tornado.websocket import websocket_connect

from course_lib import lab_settings
from course_lib.exercise_files import exercise_file, solution_file
from course_lib.paths import REPO_ROOT

COURSE = str(REPO_ROOT / "course")
TOKEN = "course-command-test"


needs_set_up = pytest.mark.skipif(not launcher_is_set_up(), reason="./course would install the environment first")


def course(*args: str, cwd=REPO_ROOT, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([COURSE, *args], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "COURSE_VENV": sys.prefix, **env})


@pytest.mark.parametrize("spelling", ["help", "--help", "-h"])
def test_help_exits_0_with_the_usage(spelling):
    shown = course(spelling)
    assert shown.returncode == 0, shown.stderr
    assert "./course lab" in shown.stdout and "./course grade" in shown.stdout and not shown.stderr


def test_an_unknown_command_exits_2_naming_it_with_the_usage():
    shown = course("--hepl")
    assert shown.returncode == 2
    assert "unknown command '--hepl'" in shown.stderr and "./course lab" in shown.stderr


def test_set_up_installs_the_course_defaults_where_jupyterlab_reads_them(tmp_path, monkeypatch):
    from jupyterlab.commands import get_app_dir
    from jupyterlab_server.settings_utils import _get_overrides

    assert lab_settings.overrides_file().parent.parent == lab_settings.Path(get_app_dir()) / "settings"
    monkeypatch.setenv("JUPYTERLAB_DIR", str(tmp_path / "lab"))
    path = lab_settings.install()
    overrides, error = _get_overrides(str(tmp_path / "lab" / "settings"))
    assert not error and overrides["@jupyterlab/apputils-extension:notification"]["fetchNews"] == "false"
    written = path.stat().st_mtime_ns
    path.chmod(0o444)  # a read-only environment that already has the file is left alone
    lab_settings.install()
    assert path.stat().st_mtime_ns == written


@needs_set_up
def test_the_working_copy_grades_itself_and_the_checkout_names_it(tmp_path):
    work = tmp_path / "work"
    made = subprocess.run([sys.executable, "-m", "course_lib.workspace",
                           "--workdir", str(work)], capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    exercise = f"exercises/{exercise_file('01_paging')}"
    shutil.copyfile(REPO_ROOT / "solutions" / solution_file("01_paging"), work / exercise)
    mine = course("grade", exercise, cwd=work, COURSE_WORKDIR="elsewhere")
    assert mine.returncode == 0 and "4/4 tasks, PASS" in mine.stdout, mine.stdout + mine.stderr
    pristine = course("grade", exercise, COURSE_WORKDIR=str(work))
    assert pristine.returncode == 1 and "not graded" in pristine.stdout
    assert "the course's own copy" in pristine.stdout and str(work / exercise) in pristine.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(base: str, path: str, body: dict) -> dict:
    request = urllib.request.Request(f"{base}{path}?token={TOKEN}", data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


async def _type(port: int, terminal: str, command: str, until: str, timeout_s: float = 60) -> str:
    """Type ``command`` into a terminal; return its output once ``until`` has appeared in it."""
    socket_ = await websocket_connect(f"ws://127.0.0.1:{port}/terminals/websocket/{terminal}?token={TOKEN}")
    socket_.write_message(json.dumps(["stdin", command + "\r"]))
    seen, deadline = "", time.monotonic() + timeout_s
    while until not in seen and time.monotonic() < deadline:
        message = await asyncio.wait_for(socket_.read_message(), deadline - time.monotonic())
        if message is None:
            break
        kind, *payload = json.loads(message)
        if kind == "stdout":
            seen += payload[0]
    socket_.close()
    return seen


def _run_in_own_thread(coroutine):
    """``asyncio.run`` on a thread of its own: a browser test of the same pytest worker may hold
    Playwright's event loop as this thread's running loop for the rest of the session."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


@needs_set_up
def test_a_terminal_opens_in_the_working_copy_whose_course_command_works(tmp_path):
    work, home, port = tmp_path / "work", tmp_path / "home", _free_port()
    home.mkdir()
    log = open(tmp_path / "lab.log", "w")
    server = subprocess.Popen([COURSE, "lab", "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1",
                               f"--IdentityProvider.token={TOKEN}"], cwd=tmp_path, stdout=log,
                              stderr=subprocess.STDOUT, start_new_session=True,
                              env={**os.environ, "HOME": str(home), "COURSE_WORKDIR": str(work), "SHELL": "/bin/bash",
                                   "COURSE_VENV": sys.prefix})
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(480):
            try:
                urllib.request.urlopen(f"{base}/api/status?token={TOKEN}", timeout=5)
                break
            except OSError:
                assert server.poll() is None, (tmp_path / "lab.log").read_text()
                time.sleep(0.5)
        # The launcher's Terminal item passes the file browser's folder; File > New > Terminal passes none.
        for body, folder in (({}, work), ({"cwd": "exercises"}, work / "exercises")):
            name = _post(base, "/api/terminals", body)["name"]
            # Built from pieces, so the echo of the typed line never matches.
            out = _run_in_own_thread(_type(port, name, "printf 'C%sD=%s\\n' W \"$PWD\"; "
                                           f"{'./' if folder == work else '../'}course help | grep -c 'Terminal opens' "
                                           "&& echo COURSE\"_\"OK", "COURSE_OK"))
            assert f"CWD={folder}" in out and "COURSE_OK" in out, out
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
        log.close()
