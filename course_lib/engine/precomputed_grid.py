"""What the explorers' precomputed grids share: six-digit rounding, one JSON line per setting,
and the command line that recomputes a grid file (``speculation_grid``, ``disaggregation_grid``).

Invariant: a grid file is a JSON object whose ``rows_key`` entry maps setting names to rows, one
line of the file per setting, so a diff of a recomputed file reads by setting.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path


def rounded(value):
    """Six significant digits for a float; whole numbers and text as they are."""
    return float(f"{value:.6g}") if isinstance(value, float) else value


def grid_json(grid: dict, rows_key: str) -> str:
    """The grid as JSON: its other entries first, then ``grid[rows_key]`` one line per setting."""
    head = {key: value for key, value in grid.items() if key != rows_key}
    lines = [f"  {json.dumps(key)}: {json.dumps(value)}," for key, value in head.items()]
    rows = [f"    {json.dumps(key)}: {json.dumps(value)}" for key, value in grid[rows_key].items()]
    return "{\n" + "\n".join(lines) + f"\n  {json.dumps(rows_key)}: {{\n" + ",\n".join(rows) + "\n  }\n}\n"


def setting_of(grid: dict, key: str, what: str, offered: str, live: str):
    """``grid[key]``; a key off the grid is refused: 'No precomputed {what} for {key}: the grid has
    {offered}; pick one of those, or run {live} yourself.'"""
    if key not in grid:
        raise ValueError(f"No precomputed {what} for {key}: the grid has {offered}; pick one of those, or run "
                         f"{live} yourself.")
    return grid[key]


def recompute_main(description: str, default_path: Path, compute_grid: Callable, rows_key: str,
                   argv: list[str] | None = None) -> None:
    """``python -m`` entry point: run ``compute_grid(on_setting)`` with progress lines, then write the file."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--output", type=Path, default=default_path, help="where to write the grid (JSON)")
    args = parser.parse_args(argv)
    started = time.perf_counter()

    def report(done: int, total: int) -> None:
        print(f"{done}/{total} settings, {time.perf_counter() - started:.0f} s", flush=True)

    grid = compute_grid(report)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(grid_json(grid, rows_key))
    print(f"wrote {args.output} ({len(grid[rows_key])} settings) in {time.perf_counter() - started:.0f} s")
