"""The shipped speculation sweep grid: it covers exactly the explorer's settings, and its points
are what the simulation computes live."""

import json
import random
from dataclasses import asdict

import pytest

from course_lib.engine.speculation_grid import (ACCEPTANCE_RATES, DRAFT_COUNTS, DRAFTERS, FIELDS, GRID_PATH, QPS_VALUES,
                                                SWEEP_DEFAULTS, grid_keys, grid_speculation, load_grid, lookup)
from course_lib.engine.precomputed_grid import grid_json
from course_lib.engine.speculation_sweep import speculation_qps_sweep
from course_lib.perf.serving import expected_tokens_per_step


def test_the_shipped_file_holds_exactly_the_settings_grid():
    stored = json.loads(GRID_PATH.read_text())
    assert list(stored["points"]) == grid_keys()
    assert len(grid_keys()) == len(ACCEPTANCE_RATES) * len(DRAFT_COUNTS) * len(DRAFTERS) == 224
    assert stored["qps"] == list(QPS_VALUES) and stored["fields"] == list(FIELDS)
    assert stored["sweep"] == SWEEP_DEFAULTS, "speculation_qps_sweep's defaults changed: recompute the grid with " \
                                              "python -m course_lib.engine.speculation_grid"
    assert all([row[0] for row in rows] == list(QPS_VALUES) for rows in stored["points"].values())
    assert ACCEPTANCE_RATES == tuple(round(0.30 + 0.05 * i, 2) for i in range(14)) and DRAFT_COUNTS == tuple(range(1, 9))


def test_the_file_is_written_one_setting_per_line_and_reads_back():
    text = grid_json(json.loads(GRID_PATH.read_text()), "points")
    assert text == GRID_PATH.read_text()
    assert sum(line.startswith('    "') for line in text.splitlines()) == len(grid_keys())


@pytest.mark.parametrize("index", range(3))
def test_sampled_grid_points_equal_the_simulation_run_live(index):
    """Three settings drawn at random (one fixed seed), at two of the rates: recomputed now, they
    equal the stored points to the six significant digits stored."""
    keys = random.Random(29).sample(grid_keys(), 3)
    drafter_name, k, a = (part.split("=")[-1] for part in keys[index].split(", "))
    drafter = None if drafter_name == "n-gram" else drafter_name
    stored = {p.qps: p for p in lookup(float(a), int(k), drafter)}
    rates = [1, random.Random(index).choice(QPS_VALUES[1:5])]
    for live in speculation_qps_sweep(rates, grid_speculation(float(a), int(k), drafter)):
        want = asdict(stored[live.qps])
        assert asdict(live) == pytest.approx(want, rel=1e-5), keys[index]


def test_at_low_load_every_setting_yields_the_formulas_tokens_per_step():
    """(1 - a^(k+1)) / (1 - a) tokens per verification at 1 QPS, within 3%, for every setting: a
    file computed for other settings (or a stale one) fails here."""
    for key, points in load_grid().items():
        drafter, k, a = key.split(", ")
        expected = expected_tokens_per_step(float(a[2:]), int(k[2:]))
        assert points[0].tokens_per_step == pytest.approx(expected, rel=0.03), key


def test_a_setting_off_the_grid_is_refused_with_the_grids_values():
    with pytest.raises(ValueError, match=r"acceptance rates 0.30 to 0.95 in steps of 0.05, k from 1 to 8"):
        lookup(0.42, 4, "Llama-3.2-1B")
    with pytest.raises(ValueError, match="No precomputed sweep for Llama-3.2-1B, k=9"):
        lookup(0.5, 9, "Llama-3.2-1B")
