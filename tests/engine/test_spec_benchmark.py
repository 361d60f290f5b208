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
