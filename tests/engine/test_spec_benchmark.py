"""The speculative-decoding benchmark runs end to end (tiny), and speculation changes no output."""

from course_lib.engine import spec_benchmark


def test_quick_benchmark_prints_every_configuration_with_identical_outputs(capsys):
    spec_benchmark.main(["--quick"])
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines if line.strip()[:1].isdigit()]
    assert [(row[0], " ".join(row[1:3]) if row[1] != "off" else "off") for row in rows] == [
        (c, name) for c in ("1", "4") for name in ("off", "ngram k=2", "draft k=2")]
    assert all(row[-1] == "yes" for row in rows)
