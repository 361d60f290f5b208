"""One cohort of hostile learners, graded as the course grades (``grade_cohort``, sandboxed,
two at a time), and what each attack achieved: nothing. The same cohort graded one at a time gets
the same verdicts, and a learner watching its sandbox while another is graded beside it sees
nothing of that other run: grading concurrently holds each learner as grading alone does.

Each learner folder is one attack, and each attacker's code is otherwise wrong or the starter,
so any credit would mean the attack worked. Where an attack can report what it saw from
inside, its function returns that as a string, which comes back in its feedback ("got '...'"):
proof that the attack ran, and of how it was stopped. Two honest learners in the same cohort
(one solved, one correct in its own way, the solved one also on exercise 06's real ranks) must
get full marks, so the sandbox is shown not to break honest code either.

The submissions and the gradebook live outside /tmp (under /var/tmp when it is writable): the
sandbox gives the learner's code a fresh /tmp, so a cohort under /tmp would be out of its sight
whatever the sandbox shows; outside it, only the sandbox's allow-list keeps them out of sight.

These tests skip on a learner's machine without a working bubblewrap, but fail under CI
(``CI=true``): CI must run them.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shutil
import stat
import sysconfig
import tempfile
import threading
import time
import uuid
from pathlib import Path

import nbformat
import pytest

from course_lib.exercise_files import course_exercise, exercise_file, solution_file
from course_lib.grading.cohort import grade_cohort, grade_submission
from course_lib.grading.grade import REVEAL, prepare_exercise
from course_lib.grading.gradebook import write_gradebook
from course_lib.grading.quizzes import collect_quizzes, load_banks
from course_lib.grading.sandbox import Limits, python_paths
from course_lib.paths import REPO_ROOT
from needs_sandbox import require_sandbox
from course_lib.quiz.bank import load_bank

PAGING = "01_paging"
RING = "06_ring_vs_tree"
TOKEN = f"hostile{uuid.uuid4().hex[:12]}"  # in every file an attack writes and every process it leaves
LIMITS = Limits(time_s=60, memory_bytes=4 * 2**30)
DAEMON_GRACE_S = 5.0  # how long after the run the daemon's writes are waited for


@pytest.fixture(scope="module", autouse=True)
def _needs_sandbox():
    require_sandbox()


def student_cells(book):
    return [cell for cell in book.cells if "student" in cell.metadata.get("tags", [])]


def starter(exercise: str = PAGING):
    return nbformat.read(course_exercise(exercise), as_version=4)


def solved(exercise: str = PAGING):
    book = starter(exercise)
    answers = student_cells(nbformat.read(REPO_ROOT / "solutions" / solution_file(exercise), as_version=4))
    for mine, answer in zip(student_cells(book), answers):
        mine.source = answer.source
    return book


def with_first_cell(source: str):
    """The paging starter with task 1's *Your code* cell replaced by ``source``."""
    book = starter()
    student_cells(book)[0].source = source
    return book


def fill(template: str, **values: str) -> str:
    for name, value in values.items():
        template = template.replace(f"@{name}@", repr(value))
    assert "@" not in template, template
    return template


# --- the attacks ----------------------------------------------------------------------------------

REBINDER = '''# Your code
import course_lib.grading.task
import course_lib.grading.values
import course_lib.perf.kv


def kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes):
    """KV-cache bytes for one token across all layers."""
    return num_layers * num_kv_heads * head_dim * dtype_bytes  # keys only: half of it


def always(*args, **kwargs):
    return True


model_kv_bytes_per_token = kv_bytes_per_token  # the name the old check cells compared against
course_lib.perf.kv.kv_bytes_per_token = always
course_lib.grading.task.same_value = always
course_lib.grading.values.same_value = always
'''

TRANSFORMER = '''# Your code
import builtins
import sys

REWRITTEN = []


def pass_everything(lines):
    return ["REWRITTEN.append(1)\\n", "print('Task 1 · Bytes per token: PASS')\\n"]


get_ipython().input_transformers_post.append(pass_everything)
builtins.print = lambda *args, **kwargs: sys.__stdout__.write("PASS\\n")


def kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes):
    return f"{len(REWRITTEN)} later cells rewritten"
'''

DAEMON = '''# Your code
import os
import sys

PROGRAM = r"""
import sys, time
token, targets = sys.argv[1], sys.argv[2:]
time.sleep(3)
end = time.time() + 15
while time.time() < end:
    for target in targets:
        try:
            with open(target, "w") as handle:
                handle.write("written by a daemon that outlived its run " + token + "\\n")
        except OSError:
            pass
    time.sleep(0.25)
"""
TARGETS = [os.path.join(@OUT@, "grades.csv"), os.path.join(@ROOT@, "d_daemon", "marker-" + @TOKEN@),
           "/tmp/marker-" + @TOKEN@, os.path.join(@REPO@, "marker-" + @TOKEN@)]

read_end, write_end = os.pipe()
if os.fork() == 0:  # the classic double fork: a new session, then a grandchild that init adopts
    os.setsid()
    if os.fork() == 0:
        os.write(write_end, str(os.getpid()).encode())
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.execv(sys.executable, [sys.executable, "-c", PROGRAM, @TOKEN@, *TARGETS])
    os._exit(0)
os.close(write_end)
os.wait()
DAEMON_PID = int(os.read(read_end, 32))


def kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes):
    return f"daemon {DAEMON_PID} {'running' if os.path.exists(f'/proc/{DAEMON_PID}') else 'gone'}"
'''

VANDAL = '''# Your code
import errno
import os
import sysconfig

STARTER = '{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}'  # the exercises are out of sight
ATTEMPTS = {  # harmless if they landed (a trailing newline, a comment), but each one shows
    "exercise": (os.path.join(@REPO@, "exercises", "01_paging_exercise.ipynb"), "a", "\\n"),
    "checks": (os.path.join(@REPO@, "course_lib", "grading", "checks", "paging.py"), "a", "\\n# " + @TOKEN@ + "\\n"),
    "module": (os.path.join(@REPO@, "course_lib", "grading", "checks", @TOKEN@ + ".py"), "w", "# " + @TOKEN@ + "\\n"),
    "pth": (os.path.join(sysconfig.get_paths()["purelib"], @TOKEN@ + ".pth"), "w", "# " + @TOKEN@ + "\\n"),
    "honest": (os.path.join(@ROOT@, "y_honest", "01_paging_exercise.ipynb"), "w", STARTER),
    "other": (os.path.join(@ROOT@, "z_different", @TOKEN@ + ".txt"), "w", @TOKEN@),
}
SEEN = []
for name, (path, mode, text) in ATTEMPTS.items():
    try:
        with open(path, mode) as handle:
            handle.write(text)
        SEEN.append(f"{name}=WRITTEN")
    except OSError as error:
        SEEN.append(f"{name}={errno.errorcode.get(error.errno, error.errno)}")
try:
    os.mkdir(os.path.join(@ROOT@, "zz_" + @TOKEN@))
    SEEN.append("learner=WRITTEN")
except OSError as error:
    SEEN.append(f"learner={errno.errorcode.get(error.errno, error.errno)}")


def kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes):
    return " ".join(SEEN)
'''

KILLER = '''# Your code
import errno
import os
import signal


def attempt(action):
    try:
        action()
        return "sent"
    except OSError as error:
        return errno.errorcode.get(error.errno, str(error.errno))


attempt(lambda: os.kill(os.getppid(), signal.SIGKILL))
attempt(lambda: os.kill(-1, signal.SIGKILL))
for entry in os.listdir("/proc"):
    if entry.isdigit() and int(entry) != os.getpid():
        attempt(lambda: os.kill(int(entry), signal.SIGKILL))
os.killpg(0, signal.SIGKILL)
'''

SNOOP = '''# Your code
import errno
import os


def look(path):
    try:
        return sorted(os.listdir(path))
    except OSError as error:
        return errno.errorcode.get(error.errno, error.errno)


def peek(path):
    try:
        with open(path, "rb") as handle:
            return f"{len(handle.read())} bytes"
    except OSError as error:
        return errno.errorcode.get(error.errno, error.errno)


def kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes):
    workdirs = [name for name in os.listdir("/tmp") if name.startswith("grade-")]
    pids = sum(name.isdigit() for name in os.listdir("/proc"))
    honest = peek(os.path.join(@ROOT@, 'y_honest', '01_paging_exercise.ipynb'))
    return (f"root={look(@ROOT@)} out={look(@OUT@)} honest={honest} "
            f"workdirs={len(workdirs)} pids={pids}")
'''

WATCHER = '''# Your code
import os
import time

START, PIDS, TMP = time.time(), 0, set()
while time.time() < START + @SECONDS@:  # graded two at a time, another learner's run goes on meanwhile
    PIDS = max(PIDS, sum(name.isdigit() for name in os.listdir("/proc")))
    for folder, subfolders, files in os.walk("/tmp"):  # another learner's program folder would show here
        if folder != "/tmp/work" and not folder.startswith(@SHOWN@):  # (a checkout under /tmp is shown)
            TMP.update(os.path.join(folder, name) for name in subfolders + files)
        else:
            subfolders.clear()
    time.sleep(0.1)
END = time.time()


def kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes):
    return f"pids={PIDS} tmp={sorted(TMP)} window={START:.3f}-{END:.3f}"
'''
WATCH_S = 6.0
SHOWN = tuple(str(path) for path in (*python_paths(), *REVEAL))  # what every sandbox shows, read-only

DIFFERENT = '''# Your code
import math
from fractions import Fraction


def kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes):
    per_layer = {"keys": num_kv_heads * head_dim * dtype_bytes, "values": num_kv_heads * head_dim * dtype_bytes}
    return float(sum(per_layer.values()) * num_layers)  # a float that holds the whole number
'''

DIFFERENT_REST = [
    '''# Your code
def kv_blocks_available(gpu_memory_bytes, gpu_memory_utilization, weight_bytes, activation_bytes, block_bytes):
    usable = gpu_memory_utilization * gpu_memory_bytes - weight_bytes - activation_bytes
    return math.floor(usable / block_bytes) if usable > 0 else 0
''',
    '''# Your code
def paged_waste_fraction(lengths, block_size):
    held = sum(math.ceil(n / block_size) for n in lengths) * block_size
    return Fraction(held - sum(lengths), held)
''',
    '''# Your code
def blocks_after_parallel_sampling(prompt_len, num_samples, output_len, block_size):
    tail = prompt_len % block_size + output_len  # what each sample writes beyond the shared full blocks
    return prompt_len // block_size + num_samples * math.ceil(tail / block_size)
''']


def _write_quiz_files(folder: Path) -> dict:
    """g: a deeply nested JSON, a folder named like a scorecard, a dangling link, and a real-looking
    card for 01_paging whose wrong first answers are flagged correct. Returns question id -> the
    card's first answer, right or wrong by the bank."""
    (folder / "deep.json").write_text("[" * 200_000 + "]" * 200_000)
    (folder / "quiz_01.json").mkdir()
    os.symlink(f"/nonexistent/{TOKEN}.json", folder / "dangling.json")
    bank = load_bank(PAGING)
    right = {}
    answers = []
    for question in bank.questions:
        if type(question).__name__ != "SingleChoice":
            continue
        honest = question.id == "inside-a-block"  # one answered right, to show not everything counts as missed
        index = next(i for i, option in enumerate(question.options) if option.correct is honest)
        answers.append({"question_id": question.id, "first_correct": True, "attempts": 1, "solved": True,
                        "tries": [{"answer": index, "correct": True}]})
        right[question.id] = honest
    (folder / "scorecard_01.json").write_text(json.dumps(
        {"quiz": "quizzes/01_paging.yaml", "learner": "g_quizzer", "score": 100, "answers": answers}))
    return right


def _tree_digest(*folders: Path) -> dict[str, str]:
    digest = {}
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest[str(path.relative_to(REPO_ROOT))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digest


def _files_naming_token(*folders: Path) -> list[str]:
    """Files under ``folders`` whose name or contents hold TOKEN."""
    found = []
    for folder in folders:
        for path in folder.rglob("*"):
            try:
                if TOKEN in path.name or (path.is_file() and path.stat().st_size < 2**20
                                          and TOKEN.encode() in path.read_bytes()):
                    found.append(str(path))
            except OSError:
                continue
    return found


def _processes_with_token() -> list[int]:
    pids = []
    for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(cmdline, "rb") as handle:
                if TOKEN.encode() in handle.read():
                    pids.append(int(cmdline.split("/")[2]))
        except OSError:
            continue
    return [pid for pid in pids if pid != os.getpid()]


def _outside_tmp(tmp_path_factory) -> Path:
    base = Path("/var/tmp")
    if base.is_dir() and os.access(base, os.W_OK) and not base.resolve().is_relative_to("/tmp"):
        return Path(tempfile.mkdtemp(prefix="hostile-cohort-", dir=base))
    return tmp_path_factory.mktemp("hostile-cohort")  # under /tmp: hidden by the sandbox's fresh /tmp anyway


def _hostile_cohort(tmp_path_factory, jobs: int):
    base = _outside_tmp(tmp_path_factory)
    try:
        root, out = base / "submissions", base / "gradebook"
        out.mkdir(parents=True)
        (out / "grades.csv").write_text("the previous run's gradebook\n")  # it exists, so it is hidden too
        values = {"ROOT": str(root), "OUT": str(out), "REPO": str(REPO_ROOT), "TOKEN": TOKEN}

        def hand_in(learner: str, book, exercise: str = PAGING) -> Path:
            (root / learner).mkdir(parents=True, exist_ok=True)
            nbformat.write(book, root / learner / exercise_file(exercise))
            return root / learner

        hand_in("a_rebinder", with_first_cell(REBINDER))
        hand_in("b_transformer", with_first_cell(TRANSFORMER))
        (root / "c_linked_notebook").mkdir(parents=True)
        os.symlink(REPO_ROOT / "solutions" / solution_file(PAGING),
                   root / "c_linked_notebook" / exercise_file(PAGING))
        os.symlink(root / "y_honest", root / "c_linked_folder")
        hand_in("d_daemon", with_first_cell(fill(DAEMON, **values)))
        hand_in("e_vandal", with_first_cell(fill(VANDAL, **values)))
        hand_in("f_killer", with_first_cell(KILLER))
        quiz_truth = _write_quiz_files(hand_in("g_quizzer", starter()))
        hand_in("h_snoop", with_first_cell(fill(SNOOP, **values)))
        hand_in("i_watcher", with_first_cell(WATCHER.replace("@SECONDS@", repr(WATCH_S)).replace("@SHOWN@", repr(SHOWN))))
        hand_in("y_honest", solved())
        hand_in("y_honest", solved(RING), RING)
        different = starter()
        for cell, source in zip(student_cells(different), [DIFFERENT, *DIFFERENT_REST]):
            cell.source = source
        hand_in("z_different", different)

        watched = [REPO_ROOT / "exercises", REPO_ROOT / "solutions", REPO_ROOT / "course_lib" / "grading" / "checks"]
        before = _tree_digest(*watched)
        exercises = [prepare_exercise(course_exercise(name)) for name in (PAGING, RING)]
        progress, finished_at = [], {}

        def on_progress(done, total, grade):
            progress.append(grade.learner)
            finished_at[(grade.learner, grade.exercise)] = time.time()
        started = time.monotonic()
        grades = grade_cohort(root, exercises, on_progress, jobs=jobs,
                              out=out, limits=LIMITS, isolate=True, cell_timeout_s=30)
        graded_s = time.monotonic() - started
        written = write_gradebook(grades, collect_quizzes(root, load_banks()), out)
        gradebook = {p.relative_to(out).as_posix(): p.read_bytes() for p in written}
        finished = time.monotonic()
        yield {"root": root, "out": out, "grades": {(g.learner, g.exercise): g for g in grades}, "progress": progress,
               "finished_at": finished_at, "jobs": jobs, "base": base,
               "gradebook": gradebook, "finished": finished, "graded_s": graded_s, "before": before, "watched": watched,
               "quiz_truth": quiz_truth}
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    """The hostile cohort graded two at a time, as ``grade-cohort --jobs 2`` does."""
    yield from _hostile_cohort(tmp_path_factory, jobs=2)


@pytest.fixture(scope="module")
def cohort_alone(tmp_path_factory):
    """The same cohort graded one notebook at a time."""
    yield from _hostile_cohort(tmp_path_factory, jobs=1)


def grade_of(cohort, learner: str, exercise: str = PAGING):
    return cohort["grades"][(learner, exercise)]


def report(grade) -> str:
    """Everything the learner's feedback says about a grade."""
    return "\n".join([check.message for check in grade.checks] + [line for check in grade.checks
                                                                   for line in check.details] + list(grade.notes))


def feedback(cohort, learner: str) -> str:
    return cohort["gradebook"][f"feedback/{learner}.md"].decode()


LEARNERS = ["a_rebinder", "b_transformer", "c_linked_folder", "c_linked_notebook", "d_daemon", "e_vandal", "f_killer",
            "g_quizzer", "h_snoop", "i_watcher", "y_honest", "z_different"]


# --- the cohort as a whole ------------------------------------------------------------------------

def test_the_run_finishes_with_every_learner_graded_and_the_gradebook_written(cohort):
    assert sorted(cohort["progress"]) == sorted(LEARNERS * 2)
    assert sorted(cohort["grades"]) == sorted((learner, exercise) for learner in LEARNERS
                                              for exercise in (PAGING, RING))
    rows = cohort["gradebook"]["grades.csv"].decode().splitlines()
    assert len(rows) == 1 + len(LEARNERS) * (4 + 3)
    assert sorted(cohort["gradebook"]) == sorted(["grades.csv", "summary.html"]
                                                 + [f"feedback/{learner}.md" for learner in LEARNERS])
    assert cohort["graded_s"] < 60, f"grading took {cohort['graded_s']:.1f} s"


def test_honest_learners_get_full_marks_even_on_real_ranks(cohort):
    for learner in ("y_honest", "z_different"):
        grade = grade_of(cohort, learner)
        assert (grade.status, grade.score, len(grade.checks)) == ("graded", 4, 4), report(grade)
    ranks = grade_of(cohort, "y_honest", RING)  # gloo over the sandbox's loopback
    assert (ranks.status, ranks.score, len(ranks.checks)) == ("graded", 3, 3), report(ranks)


def test_no_attacker_gets_any_credit(cohort):
    for learner in LEARNERS:
        if learner not in ("y_honest", "z_different"):
            assert grade_of(cohort, learner).score == 0, (learner, report(grade_of(cohort, learner)))


# --- one test per attack --------------------------------------------------------------------------

def test_a_rebinding_names_and_patching_the_comparison_changes_nothing(cohort):
    grade = grade_of(cohort, "a_rebinder")
    assert grade.status == "graded" and not grade.checks[0].passed
    assert "that is half" in grade.checks[0].message  # its own wrong value was judged, by the grader's code


def test_b_an_input_transformer_and_a_patched_print_change_nothing(cohort):
    grade = grade_of(cohort, "b_transformer")
    assert grade.status == "graded" and grade.score == 0
    assert "'3 later cells rewritten'" in grade.checks[0].message  # the transformer did rewrite the later cells
    assert all("is not defined" in check.message for check in grade.checks[1:])


def test_c_symbolic_links_are_refused(cohort):
    notebook, folder = grade_of(cohort, "c_linked_notebook"), grade_of(cohort, "c_linked_folder")
    assert (notebook.status, notebook.score) == ("refused", 0) and "symbolic link" in notebook.checks[0].message
    assert (folder.status, folder.score) == ("refused", 0) and "learner folder" in folder.checks[0].message
    assert grade_of(cohort, "c_linked_folder", RING).status == "refused"
    assert grade_of(cohort, "c_linked_notebook", RING).status == "missing"


def test_d_a_daemon_dies_with_its_run(cohort):
    grade = grade_of(cohort, "d_daemon")
    assert grade.score == 0 and "running'" in grade.checks[0].message, report(grade)  # it did start, inside
    time.sleep(max(0.0, cohort["finished"] + DAEMON_GRACE_S - time.monotonic()))
    assert (cohort["out"] / "grades.csv").read_bytes() == cohort["gradebook"]["grades.csv"]
    for marker in (cohort["root"] / "d_daemon" / f"marker-{TOKEN}", Path(f"/tmp/marker-{TOKEN}"),
                   REPO_ROOT / f"marker-{TOKEN}"):
        assert not os.path.lexists(marker), marker
    assert _processes_with_token() == []


def test_e_the_checkout_and_other_learners_cannot_be_written(cohort):
    grade = grade_of(cohort, "e_vandal")
    seen = grade.checks[0].message
    assert grade.score == 0 and "WRITTEN" not in seen, report(grade)
    assert "exercise=ENOENT" in seen and "checks=EROFS" in seen, seen  # exercises/ is not there, course_lib read-only
    assert _tree_digest(*cohort["watched"]) == cohort["before"]
    assert _files_naming_token(REPO_ROOT / "course_lib", REPO_ROOT / "exercises", REPO_ROOT / "solutions") == []
    assert list(Path(sysconfig.get_paths()["purelib"]).glob(f"*{TOKEN}*")) == []
    root = cohort["root"]
    assert sorted(p.name for p in root.iterdir()) == sorted(LEARNERS)
    assert sorted(p.name for p in (root / "y_honest").iterdir()) == [exercise_file(PAGING), exercise_file(RING)]
    assert sorted(p.name for p in (root / "z_different").iterdir()) == [exercise_file(PAGING)]
    honest = nbformat.read(root / "y_honest" / exercise_file(PAGING), as_version=4)
    assert [c.source for c in student_cells(honest)] == [c.source for c in student_cells(solved())]
    assert grade_of(cohort, "y_honest").score == 4 and grade_of(cohort, "z_different").score == 4


def test_f_killing_the_grader_only_kills_the_learners_own_run(cohort):
    grade = grade_of(cohort, "f_killer")
    assert (grade.status, grade.score) == ("crashed", 0), report(grade)
    later = [learner for learner in LEARNERS if learner > "f_killer"]
    assert all(grade_of(cohort, learner).status in ("graded", "refused") for learner in later)
    assert "f_killer" in cohort["gradebook"]["grades.csv"].decode()


def test_g_hostile_quiz_files_are_reported_and_hand_edited_verdicts_ignored(cohort):
    text = feedback(cohort, "g_quizzer")
    quiz_section = text.split("## Quiz files", 1)[1]
    assert "deep.json: nested too deeply" in quiz_section
    assert "quiz_01.json: not a regular file (a folder)" in quiz_section
    assert "dangling.json: a symbolic link" in quiz_section
    assert "scorecard_01.json" not in quiz_section  # well-formed: it counts, judged by the bank
    misses = {q.question_id: (q.missed, q.handed_in) for q in collect_quizzes(cohort["root"], load_banks()).misses
              if q.quiz == PAGING}
    for question_id, honest in cohort["quiz_truth"].items():
        assert misses[question_id] == (0 if honest else 1, 1), question_id
    assert grade_of(cohort, "g_quizzer").score == 0


def test_h_other_learners_and_the_gradebook_are_out_of_sight(cohort):
    grade = grade_of(cohort, "h_snoop")
    seen = grade.checks[0].message
    assert grade.score == 0
    assert "root=ENOENT out=ENOENT honest=ENOENT workdirs=0 " in seen, seen  # not on the allow-list: not there


# --- graded two at a time, each learner is held as when graded alone ---------------------------

def _masked(text: str, run) -> str:
    """``text`` without what differs between two runs by nature: their folders (random names), process
    ids, a watcher's clock."""
    text = re.sub(r"(course-grading-|grade-)[a-z0-9_]{8}", r"\1<random>", text.replace(str(run["base"]), "<base>"))
    return re.sub(r"\d+", "#", text)


def _verdicts(run) -> dict:
    """Per learner and exercise: status, each task's pass, its message and the notes, masked."""
    return {key: (grade.status, [(check.passed, _masked(check.message, run)) for check in grade.checks],
                  [_masked(note, run) for note in grade.notes])
            for key, grade in run["grades"].items()}


def test_two_at_a_time_every_verdict_is_the_one_given_alone(cohort, cohort_alone):
    assert (cohort["jobs"], cohort_alone["jobs"]) == (2, 1)
    two, alone = _verdicts(cohort), _verdicts(cohort_alone)
    assert sorted(two) == sorted(alone)
    assert {key: two[key] for key in two if two[key] != alone[key]} == {}, \
        {key: (two[key], alone[key]) for key in two if two[key] != alone[key]}
    assert cohort["gradebook"]["grades.csv"].count(b"\n") == cohort_alone["gradebook"]["grades.csv"].count(b"\n")


def test_a_learner_watching_while_another_is_graded_beside_it_sees_nothing_of_it(cohort, cohort_alone):
    seen = grade_of(cohort, "i_watcher").checks[0].message
    window = re.search(r"window=([\d.]+)-([\d.]+)", seen)
    assert window, seen
    start, end = map(float, window.groups())
    beside = [key for key, at in cohort["finished_at"].items() if start < at < end and key[0] != "i_watcher"]
    assert beside, f"nothing else was graded during the watcher's {WATCH_S:g} s: the test proves nothing"
    alone = grade_of(cohort_alone, "i_watcher").checks[0].message
    assert _masked(seen, cohort) == _masked(alone, cohort_alone), (seen, alone)  # its /proc and /tmp as alone
    assert len(re.findall(r"/tmp/course-grading-\w+/grade-\w+'", seen)) <= 1, seen  # its own program's folder


def test_graded_alone_too_nothing_is_left_running_or_written(cohort_alone):
    time.sleep(max(0.0, cohort_alone["finished"] + DAEMON_GRACE_S - time.monotonic()))
    assert (cohort_alone["out"] / "grades.csv").read_bytes() == cohort_alone["gradebook"]["grades.csv"]
    for marker in (cohort_alone["root"] / "d_daemon" / f"marker-{TOKEN}", Path(f"/tmp/marker-{TOKEN}"),
                   REPO_ROOT / f"marker-{TOKEN}"):
        assert not os.path.lexists(marker), marker
    assert _processes_with_token() == []
    assert _tree_digest(*cohort_alone["watched"]) == cohort_alone["before"]
    for learner in LEARNERS:
        if learner not in ("y_honest", "z_different"):
            assert grade_of(cohort_alone, learner).score == 0, learner


# --- what a learner's process leaves in its workdir -----------------------------------------------

LEFTOVERS = {  # attacks on the way results come back: the channel, and the scratch space
    "close-channel": "import os\nos.close(int(os.environ['COURSE_CHANNEL_FD']))",
    "flood-channel": "import os\nos.write(int(os.environ['COURSE_CHANNEL_FD']), b'x' * (17 * 2**20))\nos._exit(0)",
    "fill-scratch": ("import os\ntry:\n    with open('big.bin', 'wb') as f:\n        while True:\n"
                     "            f.write(b'x' * 2**20)\nexcept OSError:\n    pass\nos._exit(0)"),
}
LEFTOVER_WAIT_S = 20.0


@pytest.fixture(scope="module")
def leftovers(tmp_path_factory):
    """Each submission leaves something other than a file where the grader reads after the run,
    and exits. Graded at once, each in a thread; whatever is still blocked after LEFTOVER_WAIT_S
    is released (its pipe opened for writing) so the test run itself cannot hang."""
    root = tmp_path_factory.mktemp("leftovers")
    exercise = prepare_exercise(course_exercise(PAGING))
    results, threads = {}, {}
    for name, source in LEFTOVERS.items():
        (root / name).mkdir()
        nbformat.write(with_first_cell(f"# {TOKEN}\n{source}"), root / name / exercise_file(PAGING))

        def grade(name=name):
            results[name] = grade_submission(root / name, exercise, limits=Limits(time_s=30), isolate=True,
                                             hide=[root], cell_timeout_s=30)
        threads[name] = threading.Thread(target=grade, daemon=True)
        threads[name].start()
    deadline = time.monotonic() + LEFTOVER_WAIT_S
    for thread in threads.values():
        thread.join(max(0.0, deadline - time.monotonic()))
    hung = sorted(name for name, thread in threads.items() if thread.is_alive())
    for program in glob.glob(os.path.join(tempfile.gettempdir(), "grade-*", "program.json")):  # ours hold TOKEN
        try:
            if TOKEN not in Path(program).read_text():
                continue
            for leftover in Path(program).parent.iterdir():
                if stat.S_ISFIFO(leftover.lstat().st_mode):
                    os.close(os.open(leftover, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            continue
    for thread in threads.values():
        thread.join(10)
    return results, hung


@pytest.mark.parametrize("name", sorted(LEFTOVERS))
def test_what_a_run_leaves_behind_never_hangs_the_grader_or_passes_for_a_grader_error(leftovers, name):
    results, hung = leftovers
    assert name not in hung, f"the grader blocked on {name} until the test released it"
    grade = results[name]
    assert (grade.status, grade.score) == ("crashed", 0), (grade.status, grade.checks[0].message)
