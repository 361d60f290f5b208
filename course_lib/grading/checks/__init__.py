"""The graded tasks of every exercise, by exercise name (the notebook's stem)."""

from __future__ import annotations

import importlib

from course_lib.grading.task import Task

MODULES = {"01_paging": "paging", "02_batching": "batching", "03_scheduler": "scheduler", "04_roofline": "roofline",
           "05_collectives": "collectives", "06_ring_vs_tree": "ring_vs_tree", "07_nccl_topology": "nccl_topology",
           "08_fused_tp": "fused_tp", "09_serving_tradeoffs": "serving_tradeoffs"}


def exercise_tasks(exercise: str) -> tuple[Task, ...]:
    """The tasks of ``exercise`` (e.g. "01_paging"), in order."""
    if exercise not in MODULES:
        raise KeyError(f"No graded exercise named {exercise!r}; the exercises are {', '.join(MODULES)}.")
    return importlib.import_module(f"course_lib.grading.checks.{MODULES[exercise]}").TASKS
