"""A run time that a lesson or exercise states is a measured figure, and the cell that states it says
what a busy machine does to it: never "a few seconds", never a bare "about 20 seconds"."""

import json
import re
from pathlib import Path

import pytest

from course_lib.paths import REPO_ROOT

NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("*.ipynb")) + sorted((REPO_ROOT / "exercises").glob("*.ipynb"))
RUN_TIME = re.compile(r"(?:about|takes?|took|~)\s*[\d.,–-]+\s?(?:s|seconds|minutes)\b"
                      r"|[\d.,–-]+\s?(?:s|seconds|minutes) here\b"
                      r"|\b(?:one and a half|two|three) (?:to \w+ )?minutes")
VAGUE = re.compile(r"a few (?:seconds|minutes)|seconds or so|a minute or so")
LOAD_CAVEAT = re.compile(r"loaded 2-core machine|depending on its load")


def _markdown(path: Path) -> list[str]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]


def test_the_patterns_tell_a_stated_run_time_from_a_modelled_one():
    assert RUN_TIME.search("Now sweep the spread (about 10 s here, on one core)")
    assert RUN_TIME.search("each change takes 0.2–0.5 s here") and RUN_TIME.search("about 20 seconds")
    assert RUN_TIME.search("one and a half to three minutes on a 2-core machine")
    assert not RUN_TIME.search("about 5 ms on a ring (1,022 hops of 5 µs)")  # a modelled time, in ms
    assert not RUN_TIME.search("20 seconds of arrivals at each rate") and not RUN_TIME.search("raises after 10 s")
    assert VAGUE.search("sweep the spread for three slot counts (a few seconds)")


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_stated_run_time_is_a_figure_with_what_load_does_to_it(notebook):
    for text in _markdown(notebook):
        vague = VAGUE.search(text)
        assert not vague, f"{notebook.name} says {vague.group(0)!r}: measure the cell and state the figure"
        stated = RUN_TIME.search(text)
        assert not stated or LOAD_CAVEAT.search(text), \
            f"{notebook.name} states {stated.group(0)!r} without what load does: add that a loaded 2-core " \
            "machine can take two to three times longer"
