"""The speculation QPS sweep, run ahead for every setting of module 04's sweep explorer.

One sweep (``speculation_qps_sweep`` at seven request rates, twice per rate) takes several
seconds of CPU; the explorer must answer a slider within a second. So this module runs the
sweep once for every combination the explorer offers (acceptance rate 0.30 to 0.95 in steps of
0.05, k = 1 to 8, a Llama-3.2-1B draft model or free n-gram drafts) and ships the results in
``assets/speculation_sweep_grid.json``; the explorer only looks them up. Recompute the file with

    python -m course_lib.engine.speculation_grid          # about 12 minutes on 2 CPU cores

Invariants: the file holds exactly the settings of ``grid_keys()`` at the rates ``QPS_VALUES``,
with the sweep's own defaults (``SWEEP_DEFAULTS``); each stored point equals what
``speculation_qps_sweep`` computes for it live, to the six significant digits stored.
"""

from __future__ import annotations

import functools
import inspect
import json
from pathlib import Path

from course_lib.engine.precomputed_grid import recompute_main, rounded, setting_of
from course_lib.engine.simulated_speculation import SimulatedSpeculation
from course_lib.engine.speculation_sweep import SweepPoint, speculation_qps_sweep
from course_lib.perf.models import get_model

ACCEPTANCE_RATES = tuple(round(0.30 + 0.05 * i, 2) for i in range(14))  # 0.30, 0.35, ..., 0.95
DRAFT_COUNTS = tuple(range(1, 9))
DRAFTERS = ("Llama-3.2-1B", None)  # a draft model, or free drafts (n-gram prompt lookup)
QPS_VALUES = (1, 2, 4, 8, 16, 32, 64)
GRID_PATH = Path(__file__).parent / "assets" / "speculation_sweep_grid.json"
FIELDS = ("qps", "tpot_off_ms", "tpot_on_ms", "tokens_per_step", "num_requests", "batch_off", "compute_bound_on")
SWEEP_DEFAULTS = {name: parameter.default for name, parameter in
                  inspect.signature(speculation_qps_sweep).parameters.items()
                  if parameter.kind is parameter.KEYWORD_ONLY and name not in ("on_point", "baselines")}
"""The sweep's model, GPUs, traffic and seed: every grid point uses these."""


def grid_key(acceptance_rate: float, num_speculative_tokens: int, drafter: str | None) -> str:
    """The grid's name for one setting, e.g. 'Llama-3.2-1B, k=4, a=0.70' or 'n-gram, k=2, a=0.95'."""
    return f"{drafter or 'n-gram'}, k={num_speculative_tokens}, a={acceptance_rate:.2f}"


def grid_keys() -> list[str]:
    """Every setting the explorer offers, in the order the file stores them."""
    return [grid_key(a, k, d) for d in DRAFTERS for k in DRAFT_COUNTS for a in ACCEPTANCE_RATES]


def grid_speculation(acceptance_rate: float, num_speculative_tokens: int, drafter: str | None) -> SimulatedSpeculation:
    """The ``SimulatedSpeculation`` a grid point is computed with."""
    return SimulatedSpeculation(num_speculative_tokens, round(acceptance_rate, 2), drafter and get_model(drafter))


def compute_grid(on_setting=None) -> dict:
    """Run the sweep for every setting of ``grid_keys()``, each rate's run without speculation
    once; ``on_setting(i, total)`` reports progress. Answers the file's content."""
    baselines, points, total = {}, {}, len(grid_keys())
    for drafter in DRAFTERS:
        for k in DRAFT_COUNTS:
            for a in ACCEPTANCE_RATES:
                sweep = speculation_qps_sweep(list(QPS_VALUES), grid_speculation(a, k, drafter), baselines=baselines)
                points[grid_key(a, k, drafter)] = [[rounded(getattr(p, f)) for f in FIELDS] for p in sweep]
                if on_setting is not None:
                    on_setting(len(points), total)
    return {"about": "python -m course_lib.engine.speculation_grid: speculation_qps_sweep for every setting of "
                     "module 04's SpeculationSweepExplorer", "sweep": SWEEP_DEFAULTS, "qps": list(QPS_VALUES),
            "fields": list(FIELDS), "points": points}


@functools.cache
def load_grid(path: Path = GRID_PATH) -> dict[str, list[SweepPoint]]:
    """The shipped grid: setting name -> its sweep points, one per rate of ``QPS_VALUES``."""
    stored = json.loads(Path(path).read_text())
    return {key: [SweepPoint(**dict(zip(stored["fields"], row))) for row in rows] for key, rows in stored["points"].items()}


def lookup(acceptance_rate: float, num_speculative_tokens: int, drafter: str | None) -> list[SweepPoint]:
    """The precomputed sweep of one setting; a setting off the grid is refused with the grid's values."""
    offered = (f"acceptance rates {ACCEPTANCE_RATES[0]:.2f} to {ACCEPTANCE_RATES[-1]:.2f} in steps of 0.05, k from "
               f"{DRAFT_COUNTS[0]} to {DRAFT_COUNTS[-1]} and the drafters {[d or 'n-gram' for d in DRAFTERS]}")
    return setting_of(load_grid(), grid_key(acceptance_rate, num_speculative_tokens, drafter), "sweep", offered,
                      "speculation_qps_sweep")


def main(argv: list[str] | None = None) -> None:
    recompute_main("Precompute module 04's speculation sweep for every explorer setting.", GRID_PATH, compute_grid,
                   "points", argv)


if __name__ == "__main__":
    main()
