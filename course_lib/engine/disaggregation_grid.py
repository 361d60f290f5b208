"""Module 04's colocated-against-disaggregated comparison, run ahead for every explorer setting.

One ``compare_disaggregation`` run (the real scheduler and KV cache manager on every simulated
GPU) takes about a second of CPU on a slow 2-core machine, more than a slider may take to
answer. So this module runs it once for every setting the explorer offers (document length
``DOCUMENT_TOKENS``, 1 to 4 prefill GPUs, 1 to 4 decode GPUs, KV sent layer by layer or after
each prefill: 320 settings) and ships what the explorer shows of each run, a
``DisaggregationSummary``, in ``assets/disaggregation_grid.json``. Recompute the file with

    python -m course_lib.engine.disaggregation_grid      # 262 s on one core of a slow 2-core machine

Invariants: the file holds exactly the settings of ``grid_settings()``; each stored summary
equals ``DisaggregationSummary.of(compare_disaggregation(...), GRID_TAG)`` computed live for that
setting, to the six significant digits stored.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from course_lib.engine.disaggregated import ClusterReport, DisaggregationComparison, compare_disaggregation
from course_lib.engine.precomputed_grid import recompute_main, rounded, setting_of

DOCUMENT_TOKENS = (1000, 2000, 4000, 8000, 12000, 16000, 20000, 24000, 28000, 32000)
POOL_SIZES = (1, 2, 3, 4)  # GPUs in the prefill pool, and in the decode pool
PIPELINED = (True, False)  # KV sent layer by layer, or after each prefill
GRID_TAG = "chat"  # whose latency the summaries keep: the chat users'
GRID_PATH = Path(__file__).parent / "assets" / "disaggregation_grid.json"


@dataclass(frozen=True)
class LayoutFinish:
    """One layout's whole workload: its size, when it was done, and the stream that finished last."""

    layout: str  # e.g. 'colocated, 4 GPUs'
    requests: int
    output_tokens: int
    duration_s: float  # from the clock's start to the last token delivered
    last_tag: str  # the request whose last token came last: its tag, ...
    last_output_tokens: int
    last_arrival_s: float
    last_first_token_s: float
    last_mean_gap_ms: float | None  # None for a request of one token
    last_token_s: float

    @classmethod
    def of(cls, report: ClusterReport) -> "LayoutFinish":
        last = report.last_to_finish
        gaps = last.itl_s
        return cls(report.layout, len(report.requests), report.output_tokens, report.duration_s, last.tag,
                   len(last.token_times), last.arrival_s, last.token_times[0],
                   1e3 * sum(gaps) / len(gaps) if gaps else None, last.token_times[-1])


@dataclass(frozen=True)
class DisaggregationSummary:
    """What module 04's explorer shows of one ``DisaggregationComparison``: the summary rows of
    the requests tagged ``tag`` (latency of those requests, the rest the whole workload's) as
    (colocated, disaggregated) pairs, and each layout's ``LayoutFinish``."""

    tag: str
    tagged_requests: int
    rows: dict[str, tuple[float, float]]
    colocated: LayoutFinish
    disaggregated: LayoutFinish

    @classmethod
    def of(cls, comparison: DisaggregationComparison, tag: str = GRID_TAG) -> "DisaggregationSummary":
        return cls(tag, len(comparison.colocated.ttft(tag)), comparison.table(tag),
                   LayoutFinish.of(comparison.colocated), LayoutFinish.of(comparison.disaggregated))

    def table(self, tag: str | None = None) -> dict[str, tuple[float, float]]:
        """The rows, as ``DisaggregationComparison.table``; only for the tag this summary kept."""
        if tag != self.tag:
            raise ValueError(f"This summary kept the rows of the {self.tag!r} requests only; for {tag!r}, run "
                             "compare_disaggregation and call its table().")
        return self.rows

    def rounded(self) -> "DisaggregationSummary":
        """The summary as the grid stores it: every float to six significant digits."""
        rows = {name: tuple(rounded(v) for v in pair) for name, pair in self.rows.items()}
        layouts = [LayoutFinish(**{k: rounded(v) for k, v in asdict(f).items()}) for f in (self.colocated, self.disaggregated)]
        return DisaggregationSummary(self.tag, self.tagged_requests, rows, *layouts)

    def to_json(self) -> dict:
        return {"tag": self.tag, "tagged_requests": self.tagged_requests, "rows": {k: list(v) for k, v in self.rows.items()},
                "colocated": asdict(self.colocated), "disaggregated": asdict(self.disaggregated)}

    @classmethod
    def from_json(cls, data: dict) -> "DisaggregationSummary":
        return cls(data["tag"], data["tagged_requests"], {k: tuple(v) for k, v in data["rows"].items()},
                   LayoutFinish(**data["colocated"]), LayoutFinish(**data["disaggregated"]))


def grid_key(document_tokens: int, num_prefill: int, num_decode: int, pipelined: bool) -> str:
    """The grid's name for one setting, e.g. '16000 tokens, 2 prefill + 2 decode, layer by layer'."""
    return (f"{document_tokens} tokens, {num_prefill} prefill + {num_decode} decode, "
            f"{'layer by layer' if pipelined else 'after each prefill'}")


def grid_settings() -> list[tuple[int, int, int, bool]]:
    """Every (document_tokens, num_prefill, num_decode, pipelined) the explorer offers, in file order."""
    return [(d, p, n, s) for d in DOCUMENT_TOKENS for p in POOL_SIZES for n in POOL_SIZES for s in PIPELINED]


def run_setting(document_tokens: int, num_prefill: int, num_decode: int, pipelined: bool) -> DisaggregationSummary:
    """One grid point computed live: compare_disaggregation's defaults (Llama-3.1-8B on H100-80GB,
    ``long_prompts_among_chats(document_tokens)``) at this setting, summarized for the chat users."""
    comparison = compare_disaggregation(document_tokens=document_tokens, num_prefill=num_prefill,
                                        num_decode=num_decode, pipelined=pipelined)
    return DisaggregationSummary.of(comparison, GRID_TAG)


def compute_grid(on_setting=None) -> dict:
    """Run every setting of ``grid_settings()``; ``on_setting(i, total)`` reports progress.
    Answers the file's content."""
    settings, summaries = grid_settings(), {}
    for setting in settings:
        summaries[grid_key(*setting)] = run_setting(*setting).rounded().to_json()
        if on_setting is not None:
            on_setting(len(summaries), len(settings))
    return {"about": "python -m course_lib.engine.disaggregation_grid: compare_disaggregation (Llama-3.1-8B on "
                     "H100-80GB, long_prompts_among_chats) for every setting of module 04's DisaggregationExplorer",
            "summaries": summaries}


@functools.cache
def load_grid(path: Path = GRID_PATH) -> dict[str, DisaggregationSummary]:
    """The shipped grid: setting name -> its summary."""
    stored = json.loads(Path(path).read_text())
    return {key: DisaggregationSummary.from_json(value) for key, value in stored["summaries"].items()}


def lookup(document_tokens: int, num_prefill: int, num_decode: int, pipelined: bool) -> DisaggregationSummary:
    """The precomputed summary of one setting; a setting off the grid is refused with the grid's values."""
    offered = (f"documents of {', '.join(f'{d:,}' for d in DOCUMENT_TOKENS)} tokens and {POOL_SIZES[0]} to "
               f"{POOL_SIZES[-1]} GPUs in each pool")
    return setting_of(load_grid(), grid_key(document_tokens, num_prefill, num_decode, pipelined), "comparison",
                      offered, "compare_disaggregation")


def main(argv: list[str] | None = None) -> None:
    recompute_main("Precompute module 04's disaggregation comparison for every explorer setting.", GRID_PATH,
                   compute_grid, "summaries", argv)


if __name__ == "__main__":
    main()
