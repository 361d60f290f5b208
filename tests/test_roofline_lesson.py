"""What lesson 04 says agrees with what its cells compute: the P:D calculator starts on the roofline's
numbers, the measured roofline and the speculation timing print the claims the prose reads off them,
"output tokens / time to finish" is not called capacity, and the reopened-notebook note looks as it
does in every other lesson."""

from __future__ import annotations

import json

from course_lib.engine.disaggregated import compare_disaggregation
from course_lib.paths import REPO_ROOT
from course_lib.perf.workloads import poisson

REOPENED = "> **Reopened this notebook?** Widgets live in the running Python kernel"


def cells(lesson: str = "04_roofline") -> list[dict]:
    return json.loads((REPO_ROOT / "notebooks" / f"{lesson}.ipynb").read_text(encoding="utf-8"))["cells"]


def source(cell: dict) -> str:
    return "".join(cell["source"])


def cell_after(marker: str) -> str:
    """The source of the first cell after the one that contains ``marker``."""
    book = cells()
    index = next(i for i, cell in enumerate(book) if marker in source(cell))
    return source(book[index + 1])


def test_the_reopened_notebook_note_is_the_same_blockquote_as_in_the_other_lessons():
    first = source(cells()[0])
    assert REOPENED in first
    assert REOPENED in source(cells("03_scheduler")[0])


def test_the_pd_calculator_starts_on_the_numbers_the_cell_prints_from_the_roofline():
    """The prose said both inputs can come from the roofline; the cell printed 19.3 ms and 14.4
    requests/s and started the calculator at 40 ms and 10 requests/s."""
    code = cell_after("Both inputs can come from the roofline")
    assert "PDRatioCalculator(num_seqs=256, tpot_ms=tpot * 1e3, output_len=500, prefill_requests_per_s=prefill_rate)" \
        in code


def test_the_measured_roofline_prose_reads_the_summary_the_cell_computes():
    """A loaded run once put the 256-token prefill at 81% of the matmul peak and the 512-token one at
    26%, against 'the longest prefill reaches the largest share'."""
    code = cell_after("### Your own machine")
    assert "measure_engine_roofline(" in code and "print(measured.summary())" in code
    text = "\n".join(source(cell) for cell in cells() if cell["cell_type"] == "markdown")
    assert "the longest prefill reaches the largest share" not in text
    assert "the summary line says how many times" in text


def test_the_speculation_timing_prints_its_verdict_and_the_prose_does_not_assume_one():
    code = cell_after("### Measured on this CPU")
    assert "print(verdicts(rows))" in code
    text = "\n".join(source(cell) for cell in cells() if cell["cell_type"] == "markdown")
    assert "At one request, the draft model's guesses save target steps and the run is faster" not in text
    assert "The last line words each ratio, computed from the medians" in text


def test_time_to_finish_is_not_called_capacity_and_saturation_is_shown_computed():
    """At 32,000-token documents the split finished 1.3 times as fast as colocated while the lesson
    said 'throughput barely moves'. The saturated run the lesson shows serves fewer tokens split."""
    text = "\n".join(source(cell) for cell in cells() if cell["cell_type"] == "markdown")
    assert "Throughput barely moves" not in text and "is not capacity" in text
    assert "about 5% fewer" not in text  # the cell prints the ratio now
    saturated = compare_disaggregation(workload=poisson(400, rate_per_s=300, mean_prompt=300, mean_output=100, seed=4),
                                       num_prefill=2, num_decode=2)
    assert saturated.disaggregated.output_tokens_per_s < saturated.colocated.output_tokens_per_s
    assert "poisson(400, rate_per_s=300, mean_prompt=300, mean_output=100, seed=4)" in cell_after("How to read it:")
