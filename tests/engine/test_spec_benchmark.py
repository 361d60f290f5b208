"""The speculative-decoding benchmark runs end to end (tiny), and speculation changes no output."""

from course_lib.engine import spec_benchmark


def test_quick_benchmark_prints_every_configuration_with_identical_outputs(capsys):
    spec_benchmark.main(["--quick"])
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines if line.strip()[:1].isdigit()]
    assert [(row[0], " ".join(row[1:3]) if row[1] != "off" else "off") for row in rows] == [
        (c, name) for c in ("1", "4") for name in ("off", "ngram k=2", "draft k=2")]
    assert all(row[-1] == "yes" for row in rows)


def test_the_benchmark_can_leave_a_proposer_out_and_counts_its_runs():
    seen = []
    rows = spec_benchmark.benchmark([1], ks=[2], repeats=1, max_tokens=4, prompt_len=16, methods=("draft_model",),
                                    warm_up=False, on_run=seen.append)
    assert [row.config for row in rows] == ["off", "draft k=2"]
    assert len(seen) == spec_benchmark.num_runs([1], ks=[2], repeats=1, methods=("draft_model",)) == 2
    assert "draft k=2" in spec_benchmark.format_rows(rows)


def test_the_verdicts_word_each_ratio_by_its_side_of_one():
    """Lesson 04 once said 'at one request the run is faster' while its run measured 0.75x: the
    cell prints these words, computed from the medians, instead."""
    rows = [spec_benchmark.BenchmarkRow(1, "off", 400.0, 1.0, None, True),
            spec_benchmark.BenchmarkRow(1, "draft k=4", 452.0, 1.13, None, True),
            spec_benchmark.BenchmarkRow(16, "off", 2000.0, 1.0, None, True),
            spec_benchmark.BenchmarkRow(16, "draft k=4", 1600.0, 0.8, None, True)]
    assert spec_benchmark.verdicts(rows) == ("Tokens per second against no drafts: at 1 request, draft k=4 1.13x "
                                             "faster; at 16 requests, draft k=4 1.25x slower")


def test_each_run_is_timed_as_one_cores_cpu_time(monkeypatch):
    """Wall-clock time with two threads moved 0.75x / 1.22x / 0.94x between reruns on a loaded
    machine; every run is now the CPU time of one thread, PyTorch on that thread."""
    import torch

    threads_seen, timed = [], []

    def fake_cpu_seconds(run):
        threads_seen.append(torch.get_num_threads())
        run()
        timed.append(1)
        return 0.5

    monkeypatch.setattr(spec_benchmark, "cpu_seconds", fake_cpu_seconds)
    rows = spec_benchmark.benchmark([1], ks=[2], repeats=1, max_tokens=4, prompt_len=16, methods=("draft_model",),
                                    warm_up=False)
    assert threads_seen == [1, 1] and len(timed) == 2
    assert [row.tokens_per_s for row in rows] == [4 / 0.5, 4 / 0.5]
