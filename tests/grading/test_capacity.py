"""The cohort grader's jobs and per-notebook memory, chosen from the machine (``capacity.py``):
``--jobs N`` can never ask for more memory than is available, and a choice that would is refused
with a message that says what fits."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from course_lib.grading import cohort
from course_lib.grading.capacity import (GIB, MAX_NOTEBOOK_BYTES, MIN_NOTEBOOK_BYTES, RESERVE_BYTES, SCRATCH_BYTES,
                                         Oversubscribed, choose_capacity, memory_available_bytes)

HERE = 22 * GIB  # what a 24 GiB machine has available with nothing else running


def test_a_24_gib_two_core_machine_grades_two_at_a_time_with_8_gib_each():
    capacity = choose_capacity(HERE, cpus=2)
    assert (capacity.jobs, capacity.memory_bytes) == (2, MAX_NOTEBOOK_BYTES)


def test_more_jobs_share_the_memory_instead_of_multiplying_it():
    capacity = choose_capacity(HERE, cpus=2, jobs=4)
    assert capacity.jobs == 4
    assert capacity.memory_bytes == (HERE - RESERVE_BYTES) // 4 - 2 * SCRATCH_BYTES == 4.25 * GIB


def test_the_default_jobs_follow_the_cores_and_stop_where_the_memory_does():
    assert choose_capacity(HERE, cpus=1).jobs == 1
    assert choose_capacity(16 * GIB, cpus=64).jobs == (16 - 1) // 3  # 3 GiB each: 2 GiB cap + 1 GiB of tmpfs
    assert choose_capacity(256 * GIB, cpus=8).memory_bytes == MAX_NOTEBOOK_BYTES


def test_too_many_jobs_for_the_memory_are_refused_with_the_number_that_fits():
    with pytest.raises(Oversubscribed) as refused:
        choose_capacity(HERE, cpus=2, jobs=8)
    message = str(refused.value)
    assert "--jobs 8 leaves 1.6 GiB per notebook" in message
    assert "22 GiB available" in message and "Use --jobs 7 or fewer." in message


def test_jobs_times_an_explicit_memory_limit_above_the_machine_is_refused_with_what_fits():
    with pytest.raises(Oversubscribed) as refused:
        choose_capacity(HERE, cpus=2, jobs=4, memory_bytes=8 * GIB)
    message = str(refused.value)
    assert "--jobs 4 x --memory-limit-gb 8 could take 36 GiB" in message
    assert "21 GiB is what the jobs may share" in message
    assert "Use --jobs 2 or --memory-limit-gb 4.2 " in message


def test_a_machine_without_room_for_one_notebook_is_refused():
    with pytest.raises(Oversubscribed, match="not enough memory to grade even one notebook"):
        choose_capacity(3 * GIB, cpus=4)


def test_an_explicit_small_limit_is_the_instructors_choice():
    capacity = choose_capacity(HERE, cpus=2, jobs=2, memory_bytes=GIB)
    assert (capacity.jobs, capacity.memory_bytes) == (2, GIB)


@pytest.mark.parametrize("available_gib", [3, 5, 8, 12, 22, 48, 120, 500])
def test_no_accepted_choice_oversubscribes(available_gib):
    available = available_gib * GIB
    for cpus, jobs, memory_gib in itertools.product([1, 2, 4, 16, 128], [None, 1, 2, 3, 8, 32],
                                                    [None, 0.5, 1, 2, 4, 8, 16]):
        memory = None if memory_gib is None else int(memory_gib * GIB)
        try:
            capacity = choose_capacity(available, cpus, jobs, memory)
        except Oversubscribed:
            continue
        assert capacity.jobs * (capacity.memory_bytes + 2 * SCRATCH_BYTES) <= available - RESERVE_BYTES
        assert capacity.jobs >= 1 and (jobs is None or capacity.jobs == jobs)
        if memory is None:
            assert MIN_NOTEBOOK_BYTES <= capacity.memory_bytes <= MAX_NOTEBOOK_BYTES


def test_available_memory_is_memavailable_or_less_under_a_cgroup(tmp_path: Path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683584 kB\nMemFree:  100 kB\nMemAvailable:   23068672 kB\n")
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    (v1 / "memory" / "box").mkdir(parents=True)
    (v1 / "memory" / "box" / "memory.limit_in_bytes").write_text(f"{2**63 - 4096}\n")  # v1's "no limit"
    (v1 / "memory" / "box" / "memory.usage_in_bytes").write_text(f"{GIB}\n")
    (tmp_path / "cgroup1").write_text("4:memory:/box\n1:cpu:/\n")
    assert memory_available_bytes(meminfo, v1, tmp_path / "cgroup1") == 22 * GIB
    (v1 / "memory" / "box" / "memory.limit_in_bytes").write_text(f"{8 * GIB}\n")
    assert memory_available_bytes(meminfo, v1, tmp_path / "cgroup1") == 7 * GIB
    (v2 / "pod").mkdir(parents=True)
    (v2 / "pod" / "memory.max").write_text(f"{12 * GIB}\n")
    (v2 / "pod" / "memory.current").write_text(f"{2 * GIB}\n")
    (tmp_path / "cgroup2").write_text("0::/pod\n")
    assert memory_available_bytes(meminfo, v2, tmp_path / "cgroup2") == 10 * GIB
    (v2 / "pod" / "memory.max").write_text("max\n")
    assert memory_available_bytes(meminfo, v2, tmp_path / "cgroup2") == 22 * GIB


def test_this_machine_reports_some_memory():
    assert memory_available_bytes() > 0


@pytest.fixture
def machine_of_24_gib(monkeypatch):
    monkeypatch.setattr(cohort, "memory_available_bytes", lambda: HERE)
    monkeypatch.setattr(cohort, "cpu_count", lambda: 2)


def test_grade_cohort_refuses_an_oversubscribing_command_before_grading(machine_of_24_gib, tmp_path, capsys,
                                                                         monkeypatch):
    monkeypatch.setattr(cohort, "prepare_exercise", lambda path: pytest.fail("graded after all"))
    with pytest.raises(SystemExit) as stopped:
        cohort.main([str(tmp_path), "--out", str(tmp_path / "gradebook"), "--jobs", "4", "--memory-limit-gb", "8",
                     "--no-sandbox"])
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert "course grade-cohort: --jobs 4 x --memory-limit-gb 8 could take 36 GiB" in error
    assert "Use --jobs 2 or --memory-limit-gb 4.2 " in error


def test_grade_cohort_without_limits_grades_with_the_chosen_ones(machine_of_24_gib, tmp_path, capsys, monkeypatch):
    used = {}

    def grade_cohort(submissions, exercises, on_progress, **kwargs):
        used.update(kwargs)
        return []

    monkeypatch.setattr(cohort, "grade_cohort", grade_cohort)
    monkeypatch.setattr(cohort, "write_gradebook", lambda *args, **kwargs: [None, None])
    assert cohort.main([str(tmp_path), "--exercise", "01_paging", "--jobs", "4", "--no-sandbox"]) == 0
    assert used["jobs"] == 4 and used["limits"].memory_bytes == 4.25 * GIB
    assert "Grading 4 job(s) at once, 4.2 GiB per notebook (22.0 GiB available" in capsys.readouterr().out


def test_grade_cohort_on_a_missing_folder_says_what_to_pass(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cohort, "prepare_exercise", lambda path: pytest.fail("graded after all"))
    with pytest.raises(SystemExit) as stopped:
        cohort.main([str(tmp_path / "submisions"), "--out", str(tmp_path / "gradebook"), "--no-sandbox"])
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert "submisions is not a folder; pass the folder holding one sub-folder per learner" in error
    assert "Traceback" not in error
