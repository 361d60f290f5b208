"""Where the course's files live, wherever the notebook or test runs from."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
QUIZ_DIR = REPO_ROOT / "quizzes"
NOTEBOOK_DIR = REPO_ROOT / "notebooks"
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"  # GPU runs, committed so CPU-only learners can replay them
