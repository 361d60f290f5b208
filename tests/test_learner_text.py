"""What learners read states facts and names real sources: never the course's internal word for its
source material ("seeds"), an unfinished module ("is being written"), the authors' own trials ("we
tried") or a test suite they cannot see ("the tests"). Learners read lessons and exercises whole
(Markdown, code, printed output), the Markdown of solutions, the quiz banks, and the text that
widgets, grading hints, errors and staff answers print. They also read the library itself ("a mini
vLLM you can read") and the README, so neither calls the course's source material "seeds", not even
in a docstring or comment."""

import ast
import json
import re
from pathlib import Path

import pytest

from course_lib.paths import REPO_ROOT

# "the seeds", "the seeds' scenario", "seeds say", "seed material": a random seed is fine.
SEEDS = (r"\bseeds'|\bthe seeds\b|\bseeds (?:say|says|said|describe|describes)\b"
         r"|\bseed (?:files?|material|texts?|notes?|documents?)\b")
SOURCE_CALLED_SEEDS = re.compile(SEEDS, re.IGNORECASE)
INTERNAL_WORDS = re.compile(rf"{SEEDS}|\bis being written\b|\bwe tried\b|\bthe tests\b", re.IGNORECASE)
LESSONS_AND_EXERCISES = sorted(p for folder in ("notebooks", "exercises") for p in (REPO_ROOT / folder).glob("*.ipynb"))
SOLUTIONS = sorted((REPO_ROOT / "solutions").glob("*.ipynb"))
BANKS = sorted((REPO_ROOT / "quizzes").glob("*.yaml"))
LIBRARY_SOURCES = sorted(p for pattern in ("*.py", "*.cpp") for p in (REPO_ROOT / "course_lib").rglob(pattern)
                         if "build" not in p.relative_to(REPO_ROOT).parts)
LIBRARY_TEXT = [p for p in LIBRARY_SOURCES if p.suffix == ".py"]


def _cell_texts(cell: dict) -> list[str]:
    """A cell's source and everything it printed or displayed as text."""
    texts = ["".join(cell["source"])]
    for output in cell.get("outputs", []):
        texts.append("".join(output.get("text", "")))
        texts += ["".join(value) for kind, value in output.get("data", {}).items() if kind.startswith("text/")]
    return texts


def _first_hit(texts: list[str], pattern: re.Pattern = INTERNAL_WORDS) -> str | None:
    for text in texts:
        if match := pattern.search(text):
            return f"{match.group(0)!r} in {text[max(0, match.start() - 60):match.end() + 40]!r}"
    return None


def _cells(notebook: Path) -> list[dict]:
    return json.loads(notebook.read_text(encoding="utf-8"))["cells"]


@pytest.mark.parametrize("notebook", LESSONS_AND_EXERCISES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_lessons_and_exercises_never_use_internal_words(notebook):
    """Markdown, code and printed output alike: learners read all three."""
    for index, cell in enumerate(_cells(notebook)):
        hit = _first_hit(_cell_texts(cell))
        assert hit is None, f"{notebook.parent.name}/{notebook.name} cell {index}: {hit}"


@pytest.mark.parametrize("notebook", SOLUTIONS, ids=lambda p: p.name)
def test_solutions_markdown_never_uses_internal_words(notebook):
    """The solution's Markdown is the exercise's text (the build copies it)."""
    for index, cell in enumerate(_cells(notebook)):
        if cell["cell_type"] == "markdown":
            hit = _first_hit(_cell_texts(cell))
            assert hit is None, f"solutions/{notebook.name} cell {index}: {hit}"


@pytest.mark.parametrize("bank", BANKS, ids=lambda p: p.name)
def test_quiz_banks_never_use_internal_words(bank):
    hit = _first_hit([bank.read_text(encoding="utf-8")])
    assert hit is None, f"{bank.name}: {hit}"


def _shown_strings(source: str) -> list[str]:
    """The string literals of a module that can reach a learner: all but docstrings."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


@pytest.mark.parametrize("module", LIBRARY_TEXT, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_widget_readouts_hints_errors_and_staff_answers_never_use_internal_words(module):
    hit = _first_hit(_shown_strings(module.read_text(encoding="utf-8")))
    assert hit is None, f"{module.relative_to(REPO_ROOT)}: {hit}"


@pytest.mark.parametrize("source", [*LIBRARY_SOURCES, REPO_ROOT / "README.md"], ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_library_source_and_readme_never_call_the_source_material_seeds(source):
    """Docstrings and comments included: name the real source (a module, vLLM's docs, a paper) or state the fact."""
    hit = _first_hit([source.read_text(encoding="utf-8")], SOURCE_CALLED_SEEDS)
    assert hit is None, f"{source.relative_to(REPO_ROOT)}: {hit}"


def test_the_library_scan_reads_every_module_and_the_kernel_source():
    scanned = {str(p.relative_to(REPO_ROOT)) for p in LIBRARY_SOURCES}
    assert {"course_lib/perf/workloads.py", "course_lib/review.py", "course_lib/widgets/staff_answer.py",
            "course_lib/kernels/csrc/paged_decode_attention.cpp"} <= scanned
    assert not any("build" in path.split("/") for path in scanned)


@pytest.mark.parametrize("text", ["Module 09 is being written.", "every wrong rule we tried fails",
                                  "7.6e-6 measured in the tests", "the seeds' scenario", "The Seeds say",
                                  "The seeds' batching picture", "as seeds say", "from the seed notes"])
def test_each_internal_phrase_is_caught(text):
    assert _first_hit([text])


@pytest.mark.parametrize("text", ["a random seed of 0", "seed=3", "nccl-tests' columns", "the property tests in "
                                  "`tests/engine/test_kv_offload.py`", "the roofline test", "data (fixed seeds)",
                                  "reproducible from their seed", "then seeded random ones", "the same seed gives"])
def test_ordinary_words_pass(text):
    assert _first_hit([text]) is None
