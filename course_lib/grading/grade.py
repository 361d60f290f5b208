"""Grade a notebook: run it in a fresh kernel under nbval's strict mode.

Every code cell is one test. Check cells pass when they run without error and print
exactly what the solution printed; a learner's own cells (tagged ``nbval-ignore-output``)
only need to run. The result is pytest's, ending in "N passed, M failed".
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from course_lib.paths import REPO_ROOT


def grade_command(notebook: str | Path, cell_timeout_s: int = 300) -> list[str]:
    """The pytest command that grades ``notebook`` strictly (ignoring the suite's lax default)."""
    return [
        sys.executable, "-m", "pytest", str(Path(notebook).resolve()),
        "--nbval", "--nbval-current-env", f"--nbval-cell-timeout={cell_timeout_s}",
        "-o", "addopts=", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "--rootdir", str(REPO_ROOT),
    ]


def grade(notebook: str | Path, capture: bool = False) -> subprocess.CompletedProcess:
    """Run the grader on ``notebook``; its return code is 0 only if every cell passes."""
    path = Path(notebook)
    if not path.is_file() or path.suffix != ".ipynb":
        raise FileNotFoundError(f"{notebook} is not a notebook file; pass a path like exercises/01_paging.ipynb.")
    return subprocess.run(grade_command(path), cwd=REPO_ROOT, capture_output=capture, text=True)
