"""A cohort end to end: ``deploy/jupyterhub/jupyterhub_config.py`` serving two learners on
127.0.0.1, each driven through Chromium (log in, open module 01 and run it, answer a quiz
question, export the scorecard, run a cell of exercise 01, save), then ``./course collect`` and
``./course grade-cohort`` making a gradebook with both.

The hub runs as it would for a class, except for two test-only settings: the dummy authenticator
(one shared password for the two listed learners) and the simple spawner (every learner as this
OS user, homes under a temporary folder). configurable-http-proxy comes from PATH or from
``.hub/node`` (``./course hub --install-only`` puts it there; ``.ci/run`` runs that).
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from course_lib.exercise_files import exercise_file
from course_lib.grading.quizzes import collect_quizzes
from course_lib.paths import REPO_ROOT

from .conftest import IN_CI, answer_first_quiz_question, free_port, run_all, save, sync_api

LEARNERS = ("alice", "bob")
PASSWORD = "cohort-test-password"
PROXY = REPO_ROOT / ".hub" / "node" / "node_modules" / ".bin" / "configurable-http-proxy"
MODULE = "01_paging"
EXERCISE = exercise_file(MODULE)  # its tab reads 01_paging_exercise.ipynb, the lesson's 01_paging.ipynb
RAN = re.compile(r'"execution_count": \d')  # a saved notebook with a cell that ran


def proxy_problem() -> str | None:
    if PROXY.exists() or shutil.which("configurable-http-proxy"):
        return None
    return "needs configurable-http-proxy (./course hub --install-only installs it from npm)"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """The course's hub on a free port; yields (base URL, learners' homes, state folder)."""
    problem = proxy_problem()
    if problem and IN_CI:
        pytest.fail(f"CI=true but the hub test cannot run: {problem}", pytrace=False)
    if problem:
        pytest.skip(problem)
    root = tmp_path_factory.mktemp("hub")
    homes, state = root / "homes", root / "state"
    for name in LEARNERS:  # no "get notified about Jupyter news?" toast over the lessons
        news = (homes / name / ".jupyter" / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
                / "notification.jupyterlab-settings")
        news.parent.mkdir(parents=True)
        news.write_text('{"fetchNews": "false"}')
    port = free_port()
    env = {**os.environ, "COURSE_HUB_AUTH": "dummy", "COURSE_HUB_DUMMY_PASSWORD": PASSWORD,
           "COURSE_HUB_LEARNERS": ",".join(LEARNERS), "COURSE_HUB_SPAWNER": "simple",
           "COURSE_HUB_HOMES": str(homes), "COURSE_HUB_STATE": str(state), "COURSE_HUB_PORT": str(port),
           "COURSE_HUB_GPU": "none"}
    log = open(root / "hub.log", "w")
    process = subprocess.Popen([str(Path(sys.executable).parent / "jupyterhub"), "-f",
                                str(REPO_ROOT / "deploy" / "jupyterhub" / "jupyterhub_config.py")],
                               cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                with urllib.request.urlopen(f"{base}/hub/health", timeout=5):
                    break
            except OSError:
                if process.poll() is not None:
                    break
                time.sleep(0.5)
        else:
            raise RuntimeError(f"the hub did not start; see {root / 'hub.log'}")
        assert process.poll() is None, (root / "hub.log").read_text()[-3000:]
        yield base, homes, state
    finally:
        process.send_signal(signal.SIGINT)  # the hub stops the learners' servers and the proxy
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        log.close()


def learner_usage(home: Path) -> dict:
    """What one learner's processes (those started with ``home`` as HOME) hold: resident memory of
    their kernels and of their JupyterLab server in MiB, and the kernels' CPU seconds so far."""
    usage = {"kernel_rss_mib": 0.0, "server_rss_mib": 0.0, "kernel_cpu_s": 0.0}
    ticks = os.sysconf("SC_CLK_TCK")
    for status in Path("/proc").glob("[0-9]*/status"):
        pid = status.parent
        try:
            if f"HOME={home}\0".encode() not in (pid / "environ").read_bytes():
                continue
            command = (pid / "cmdline").read_bytes()
            rss = int(re.search(r"VmRSS:\s+(\d+) kB", status.read_text()).group(1)) / 1024
            utime, stime = (pid / "stat").read_text().rsplit(")", 1)[1].split()[11:13]
        except (OSError, AttributeError):  # ended while we looked, or a kernel thread
            continue
        if b"ipykernel" in command:
            usage["kernel_rss_mib"] += rss
            usage["kernel_cpu_s"] += (int(utime) + int(stime)) / ticks
        elif b"jupyterhub-singleuser" in command:
            usage["server_rss_mib"] += rss
    return usage


def work_as(browser, base: str, name: str, homes: Path) -> dict:
    """One learner's session through Chromium; what it measured."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    try:
        started = time.monotonic()
        page.goto(f"{base}/hub/login")
        page.fill("#username_input", name)
        page.fill("#password_input", PASSWORD)
        page.click("#login_submit")
        page.wait_for_url(re.compile(rf"/user/{name}/lab/tree/notebooks/00_start_here\.ipynb"),
                          timeout=180_000)  # spawned, at the course's start page in the private copy
        page.wait_for_selector(".jp-NotebookPanel", timeout=120_000)
        login_s = time.monotonic() - started
        assert (homes / name / "course" / "notebooks" / f"{MODULE}.ipynb").exists()  # the private copy
        page.goto(f"{base}/user/{name}/lab/tree/notebooks/{MODULE}.ipynb")
        page.wait_for_selector(".jp-NotebookPanel", timeout=120_000)
        run_all(page)
        feedback = answer_first_quiz_question(page)
        assert "✓" in feedback or "✗" in feedback
        page.keyboard.press("Escape")  # command mode on the last cell, then a new cell below it
        page.keyboard.press("b")
        page.keyboard.press("Enter")
        page.keyboard.type(f'quiz.scorecard.export("quiz_{MODULE[:2]}.json")')
        page.keyboard.press("Shift+Enter")
        exported = homes / name / "course" / "notebooks" / f"quiz_{MODULE[:2]}.json"
        for _ in range(60):
            if exported.exists():
                break
            page.wait_for_timeout(500)
        assert exported.exists(), "the scorecard was not exported"
        usage = learner_usage(homes / name)
        save(page)
        # ?reset: a fresh workspace with only the exercise open
        page.goto(f"{base}/user/{name}/lab/tree/exercises/{EXERCISE}?reset")
        exercise = ".jp-NotebookPanel:visible"
        page.wait_for_selector(f"{exercise} .jp-CodeCell", timeout=120_000)
        tab = page.locator("#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel")
        assert tab.inner_text(timeout=30_000) == EXERCISE  # not the lesson's title
        page.wait_for_selector(f"{exercise} .jp-Spinner", state="detached", timeout=120_000)  # loaded
        page.wait_for_selector(".jp-StatusBar-Widget:has-text('Idle')", timeout=120_000)
        ran = f"{exercise} .jp-CodeCell .jp-InputPrompt >> text=/\\[\\d+\\]/"
        for attempt in range(4):  # a Shift+Enter sent while the new kernel still starts can be lost
            page.locator(f"{exercise} .jp-CodeCell .jp-InputArea-editor").first.click()
            page.keyboard.press("Shift+Enter")
            try:
                page.wait_for_selector(ran, timeout=30_000)
                break
            except sync_api.TimeoutError:
                assert attempt < 3, "the exercise's first cell never ran"
        saved = homes / name / "course" / "exercises" / EXERCISE
        for attempt in range(180):  # File > Save Notebook, until the file on disk holds the run
            if attempt % 20 == 0:
                save(page)
            page.wait_for_timeout(500)
            if RAN.search(saved.read_text()):
                break
        return {"login_and_spawn_s": round(login_s, 1), **{k: round(v, 1) for k, v in usage.items()}}
    finally:
        context.close()


# Stand-ins tests/grading/test_sandbox_allow_list.py puts in the checkout for a few seconds (a hub's
# state at its old place, an earlier cohort's folders), perhaps while this test runs beside it.
PLANTED_BY_OTHER_TESTS = (".hub/jupyterhub_cookie_secret", ".hub/jupyterhub.sqlite", "gradebook-week1/",
                          "submissions-week1/")


def checkout_state() -> str:
    """What git sees in the course checkout, untracked and ignored files included (Python's own
    bytecode caches aside: any import may refresh them; and the sandbox test's stand-ins)."""
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--ignored"], cwd=REPO_ROOT,
                            capture_output=True, text=True, check=True).stdout
    return "\n".join(line for line in status.splitlines()
                     if "__pycache__" not in line and not line[3:].startswith(PLANTED_BY_OTHER_TESTS))


def test_a_cohort_logs_in_works_and_is_collected_and_graded(hub, browser, tmp_path):
    base, homes, state = hub
    started, before = time.monotonic(), checkout_state()
    measured = {name: work_as(browser, base, name, homes) for name in LEARNERS}
    assert checkout_state() == before  # learners wrote only into their own homes
    for name in LEARNERS:
        saved = homes / name / "course" / "exercises" / EXERCISE
        assert RAN.search(saved.read_text()), f"{name}'s exercise was not saved after the run"
        used = measured[name]
        assert used["kernel_cpu_s"] > 1 and used["server_rss_mib"] > 20  # the learner's own processes, found
        assert 100 < used["kernel_rss_mib"] + used["server_rss_mib"] < 4096  # within the hub's default 4G
    browser_s = time.monotonic() - started
    submissions, gradebook = tmp_path / "submissions", tmp_path / "gradebook"
    collect = subprocess.run([sys.executable, "-m", "course_lib.grading.collect", str(homes), "--out", str(submissions)],
                             capture_output=True, text=True, timeout=120)
    assert collect.returncode == 0, collect.stdout + collect.stderr
    for name in LEARNERS:
        assert (submissions / name / EXERCISE).exists(), collect.stdout
        assert any(submissions.joinpath(name).glob("*.json")), collect.stdout
    grade = subprocess.run([sys.executable, "-m", "course_lib.grading.cohort", str(submissions), "--out", str(gradebook),
                            "--exercise", MODULE, "--jobs", "2"], capture_output=True, text=True, timeout=900)
    assert grade.returncode == 0, grade.stdout + grade.stderr
    rows = list(csv.DictReader((gradebook / "grades.csv").open()))
    assert {row["learner"] for row in rows} == set(LEARNERS)
    assert {row["status"] for row in rows} == {"graded"}  # both notebooks ran in the sandbox
    summary = (gradebook / "summary.html").read_text()
    assert all(name in summary for name in LEARNERS)
    asked = [q for q in collect_quizzes(submissions).misses if q.quiz == MODULE]
    assert asked and all(q.handed_in == len(LEARNERS) for q in asked)  # both learners' scorecards counted
    print(f"\nhub cohort: browser sessions {browser_s:.0f} s, then collect and grade; per learner {measured}")
