"""The course outline as data: every lesson's file, its one title, and its numbered sections.

A lesson notebook opens with ``# Module NN · <title>`` (``: <subtitle>`` may follow), its ``##``
headings are ``## 1 · <section>``, ``## 2 · ...`` in the order of ``sections``, and its last cell
is the unnumbered ``## What next`` (the final review's is ``## After the course``), which links to
the next lesson, the course home and the lesson's exercise. The home page, the README, the final
review's resource map and every hand-off between lessons use these titles; the tests hold each
of them to this file, so a section that disappears from a lesson, or a title spelled two ways,
fails CI.
"""

from __future__ import annotations

from dataclasses import dataclass

from course_lib.exercise_files import exercise_file

HOME = "00_start_here.ipynb"
CHECK_YOURSELF, STAFF_ANSWERS = "Check yourself", "Staff answers"
WHAT_NEXT, AFTER_THE_COURSE = "What next", "After the course"


@dataclass(frozen=True)
class Lesson:
    """One lesson: ``file`` in ``notebooks/``, whether its module has an exercise, and the section
    names that its ``## N · name`` headings carry, in order, numbered from 1."""

    module: str
    file: str
    title: str
    sections: tuple[str, ...]
    has_exercise: bool = False
    subtitle: str = ""
    last_section: str = WHAT_NEXT

    @property
    def module_id(self) -> str:
        """The module's id, its lesson's file name without ``.ipynb`` (``04_roofline``): the name that
        its quiz bank, its exercise's file and the graders' tables are built on."""
        return self.file.removesuffix(".ipynb")

    @property
    def exercise(self) -> str | None:
        """The exercise's file name in ``exercises/`` (``04_roofline_exercise.ipynb``), or None."""
        return exercise_file(self.module_id) if self.has_exercise else None

    @property
    def heading(self) -> str:
        """The lesson's first line without the ``# ``: ``Module NN · title[: subtitle]``."""
        return f"Module {self.module} · {self.title}" + (f": {self.subtitle}" if self.subtitle else "")

    @property
    def name(self) -> str:
        """How a link to the lesson reads: ``Module NN · title``."""
        return f"Module {self.module} · {self.title}"


OUTLINE: tuple[Lesson, ...] = (
    Lesson("00", "00_setup.ipynb", "Set-up check", ("Is this machine ready?", "Do widgets work in this browser?")),
    Lesson("01", "01_paging.ipynb", "PagedAttention and the KV cache", (
        "Why KV memory, not FLOPs, bounds serving", "The formula: know it cold",
        "Where the memory goes: reserve-for-max versus paging", "PagedAttention is virtual memory",
        "Copy-on-write: sharing a prompt between samples", "Spot the bug: the server that will not start",
        "Inside the kernel", CHECK_YOURSELF, STAFF_ANSWERS), has_exercise=True),
    Lesson("02", "02_batching.ipynb", "Continuous batching", (
        "Two policies on the real engine",
        "The classic picture at scale: 7 requests stop at token 50, one runs to 2,000",
        "Against a real baseline", "The knobs and the follow-ups", CHECK_YOURSELF, STAFF_ANSWERS),
        has_exercise=True),
    Lesson("03", "03_scheduler.ipynb", "The V1 scheduler", (
        "One step is a token budget", "The token budget is a latency dial",
        "When the KV cache runs out: preemption", "Prefix caching", CHECK_YOURSELF, STAFF_ANSWERS),
        has_exercise=True, subtitle="token budgets, preemption and prefix caching"),
    Lesson("04", "04_roofline.ipynb", "Throughput versus latency", (
        "Two phases, two metrics", "The roofline", "Designing for latency: a checklist",
        "Disaggregated prefill and decode", "Speculative decoding", CHECK_YOURSELF, STAFF_ANSWERS),
        has_exercise=True, subtitle="the roofline, disaggregation and speculative decoding"),
    Lesson("05", "05_collectives.ipynb", "Collective communication primitives", (
        "Ranks from a notebook cell", "The six primitives", "Two identities",
        "Which parallelism uses which collective", "Symmetric calls, or a hang", "The PyTorch API",
        CHECK_YOURSELF, STAFF_ANSWERS), has_exercise=True),
    Lesson("06", "06_ring_vs_tree.ipynb", "Ring versus tree all-reduce", (
        "Ring all-reduce, two phases", "The formula, and the bytes actually sent", "Trees: logarithmic latency",
        "The alpha-beta model and the crossover", "Measured: the hand-written ring against gloo's own",
        CHECK_YOURSELF, STAFF_ANSWERS), has_exercise=True),
    Lesson("07", "07_nccl_topology.ipynb", "NCCL, topology and overlap", (
        "Bus bandwidth versus algorithm bandwidth", "The interconnect hierarchy",
        "Hierarchical all-reduce: keep the bulk on NVLink", "DDP: buckets and overlap",
        "Overlap needs independent compute", "The communication roofline",
        "Spot the bug: `tensor_parallel_size=16` across two nodes", CHECK_YOURSELF, STAFF_ANSWERS),
        has_exercise=True),
    Lesson("08", "08_fused_tp.ipynb", "Fused tensor-parallel kernels and MoE serving", (
        "Column, then row: one all-reduce per block", "Attention's version, and the engine at `tensor_parallel_size=2`",
        "Why NCCL's ring is not enough for TP", "One-shot and two-shot all-reduce over symmetric memory",
        "Fusing the reduction into the kernel", "Mixture of experts: all-to-all, not all-reduce",
        "Design it: serving a DeepSeek-style MoE", "The habit so far", CHECK_YOURSELF, STAFF_ANSWERS),
        has_exercise=True),
    Lesson("09", "09_serving_tradeoffs.ipynb", "Serving trade-offs", (
        "What fits, and which kernel wins?", "Quantizing the real model", "The W4A16 kernel", "The accuracy gate",
        "An FP8 KV cache, tested on its own", "Reload or recompute?", "The engine's own offload tier",
        "Why the copy engines, and when offload pays", CHECK_YOURSELF, STAFF_ANSWERS),
        has_exercise=True, subtitle="fewer bits, and KV that lives elsewhere"),
    Lesson("10", "10_review.ipynb", "Final review", (CHECK_YOURSELF, STAFF_ANSWERS, "The resource that bounds you"),
           last_section=AFTER_THE_COURSE),
)


def lesson(module: str) -> Lesson:
    """The lesson of module ``module`` ("00" to "10"); the error lists the modules."""
    for entry in OUTLINE:
        if entry.module == module:
            return entry
    raise KeyError(f"No module {module!r}; choose one of {[entry.module for entry in OUTLINE]}.")


def next_lesson(entry: Lesson) -> Lesson | None:
    """The lesson after ``entry``, or None after the last."""
    index = OUTLINE.index(entry)
    return OUTLINE[index + 1] if index + 1 < len(OUTLINE) else None
