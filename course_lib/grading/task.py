"""A graded task: the learner's function, the cases it is called on, and how results are judged.

Each exercise task names one function the learner writes. Its cases are fixed by the grader:
hand-built ones first (each exercises one rule the task states, and says which in ``why``),
then seeded random ones. The expected value of every case comes from the reference code in
``course_lib``, computed by the grader, never by the learner's process; results are compared
by value (``values.same_value``), so prints, warnings and the learner's choice of ``float``
or ``int``, ``dict`` or ``OrderedDict`` never decide a grade. A decision derived from floats is
judged exactly where its cases are exact in any formulation, else, where the reference's numbers
tie within the tolerance, by the task's rule on the learner's own numbers (``Task.at_a_tie``).
A task whose function draws at random (``Rule(significance=...)``) expects a distribution and
gets counts of many draws, judged by a chi-square test.

What a learner's process sends back per case is plain data: ``{"value": ...}``, or
``{"error": "Type: message"}`` when the call raised, or ``{"timeout": true}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from course_lib.grading.calls import NOT_WRITTEN, shortened
from course_lib.grading.values import PlainDataError, Rule, from_plain, goodness_of_fit, same_value, show, to_plain

# What an error the learner's call raised means, in the learner's words: (text the error holds, hint).
# Beside the starter's own, the messages of torch.distributed's gloo backend (the one every check on
# ranks runs on) that name no mistake a learner would recognise.
ERROR_HINTS = (
    (NOT_WRITTEN, "this task is not done yet: replace the `raise NotImplementedError(...)` line with your code"),
    ("ProcessGroupGloo::allgather: invalid tensor size",
     "all_gather needs every rank's piece to be the same size, and gloo refuses pieces that differ (tensor_split's "
     "may differ by one element): pad every piece to the largest one's size (ceil(n / k) elements for n in k "
     "pieces), gather, then cut the padding off; or send each piece with its own dist.broadcast from its rank"),
    ("ProcessGroupGloo::allgather: invalid output tensor list",
     "all_gather's output list needs one tensor per rank of the group you pass (the group's size, not the world's)"),
    ("Check failed: outputShape[0] * worldSize == inputShape[0]",
     "reduce_scatter_single (reduce_scatter_tensor) needs an input of exactly the group's size times the output's "
     "elements: pad a copy of the input with zeros to that size, or pass dist.reduce_scatter a list of pieces"),
)


@dataclass(frozen=True)
class Case:
    args: tuple
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    why: str = ""  # for a hand-built case, the rule it exercises


@dataclass(frozen=True)
class Task:
    number: int
    title: str
    function: str                          # the name the learner's function must keep
    cases: Callable[[], list[Case]]        # deterministic
    reference: Callable[..., Any]          # the expected value for (*case.args, **case.kwargs)
    rule: Rule = Rule()
    hint: Callable[[Case, Any, Any], str | None] | None = None  # (case, expected, got) -> a hint true for that failure
    call: str = "direct"                   # how the learner's process calls the function (see calls.py)
    describe: Callable[[Case], str] | None = None  # how a case is named in feedback (default: the call itself)
    time_limit_s: float = 60.0             # for all of this task's calls together
    examples: int = 2                      # leading cases the check cell prints as worked examples
    # (expected, got) -> the value got is judged against, both plain: for a decision derived from floats, where
    # the reference's numbers tie within the rule's tolerance, the decision the task's rule gives on the
    # learner's own numbers (a correct formulation may round one ulp the other way); default: expected
    at_a_tie: Callable[[Any, Any], Any] | None = None

    @property
    def heading(self) -> str:
        return f"Task {self.number} · {self.title}"

    def call_text(self, case: Case) -> str:
        if self.describe is not None:
            return self.describe(case)
        parts = [repr(a) for a in case.args] + [f"{k}={v!r}" for k, v in case.kwargs.items()]
        text = f"{self.function}({', '.join(parts)})"
        return text if len(text) <= 200 else text[:197] + "..."


@dataclass(frozen=True)
class CaseVerdict:
    call: str
    why: str
    passed: bool
    expected: str
    got: str      # the value the learner's function gave, or what went wrong
    hint: str = ""

    def lines(self) -> list[str]:
        head = f"{self.call}" + (f"   [{self.why}]" if self.why else "")
        out = [head, f"    expected {self.expected}", f"    got      {self.got}"]
        return out + ([f"    hint: {self.hint}"] if self.hint else [])


@dataclass(frozen=True)
class TaskVerdict:
    number: int
    title: str
    cases: tuple[CaseVerdict, ...]
    problem: str = ""  # why no case could be judged (the function is missing, the notebook crashed)

    @property
    def heading(self) -> str:
        return f"Task {self.number} · {self.title}"

    @property
    def passed(self) -> bool:
        return not self.problem and bool(self.cases) and all(c.passed for c in self.cases)

    @property
    def failures(self) -> list[CaseVerdict]:
        return [c for c in self.cases if not c.passed]

    def message(self) -> str:
        """One line: why the task failed ("" when it passed)."""
        if self.problem:
            return self.problem
        failed = self.failures
        if not failed:
            return ""
        first = failed[0]
        text = f"{len(failed)} of {len(self.cases)} cases differ; first: {first.call}: expected {first.expected}, got {first.got}"
        return text + (f" (hint: {first.hint})" if first.hint else "")

    def report(self, max_failures: int = 3) -> list[str]:
        """Lines for a learner: the verdict, then up to ``max_failures`` failing cases in full."""
        if self.passed:
            return [f"{self.heading}: PASS ({len(self.cases)} cases)"]
        if self.problem:
            return [f"{self.heading}: FAIL: {self.problem}"]
        failed = self.failures
        lines = [f"{self.heading}: FAIL, {len(failed)} of {len(self.cases)} cases differ"]
        for case in failed[:max_failures]:
            lines += ["  " + line for line in case.lines()]
        if len(failed) > max_failures:
            lines.append(f"  ... and {len(failed) - max_failures} more")
        return lines


def expected_values(task: Task, cases: Sequence[Case]) -> list[Any]:
    """The reference's result for every case, as plain data."""
    return [to_plain(task.reference(*case.args, **case.kwargs)) for case in cases]


def judge(task: Task, cases: Sequence[Case], expected: Sequence[Any], outcomes: Any) -> TaskVerdict:
    """Compare the learner's per-case ``outcomes`` (untrusted plain data) with ``expected``."""
    if isinstance(outcomes, dict) and isinstance(outcomes.get("missing"), str):
        return TaskVerdict(task.number, task.title, (), outcomes["missing"][:300])
    if not isinstance(outcomes, list):
        return TaskVerdict(task.number, task.title, (), "no results came back for this task")
    verdicts = []
    for index, (case, want) in enumerate(zip(cases, expected)):
        outcome = outcomes[index] if index < len(outcomes) and isinstance(outcomes[index], dict) else {}
        verdicts.append(_judge_case(task, case, want, outcome))
    if verdicts and all(NOT_WRITTEN in v.got for v in verdicts):
        others = sorted({name for outcome in outcomes if (name := _unwritten(outcome)) and name != task.function})
        if others:  # this task's function calls another task's, still the starter
            return TaskVerdict(task.number, task.title, tuple(verdicts), (
                f"not done yet: it calls {', '.join(f'`{name}`' for name in others)}, another task's function, "
                "whose *Your code* cell still raises NotImplementedError: write that one first"))
        return TaskVerdict(task.number, task.title, tuple(verdicts), (
            "not done yet: replace the `raise NotImplementedError(...)` line in its *Your code* cell"))
    return TaskVerdict(task.number, task.title, tuple(verdicts))


def _judge_case(task: Task, case: Case, want: Any, outcome: dict) -> CaseVerdict:
    if "value" in outcome:
        want = _judged_against(task, want, outcome["value"])
    call, expected_text = task.call_text(case), _show_expected(want, task.rule)
    if "value" in outcome:
        got = outcome["value"]
        passed = same_value(want, got, task.rule)
        return CaseVerdict(call, case.why, passed, expected_text, _show_got(want, got, task.rule),
                           "" if passed else _hint(task, case, want, got))
    if outcome.get("timeout"):
        return CaseVerdict(call, case.why, False, expected_text, f"no answer within {task.time_limit_s:g} s",
                           "an endless loop? (the time limit covers all of this task's cases)")
    error = outcome.get("error")
    if isinstance(error, str):
        other = _unwritten(outcome)
        hint = (f"`{other}`, which this task's function calls, is not written yet (it still raises "
                "NotImplementedError): write it first" if other and other != task.function else error_hint(error))
        return CaseVerdict(call, case.why, False, expected_text, f"raised {shortened(error, 900)}", hint)
    return CaseVerdict(call, case.why, False, expected_text, "no result (the run stopped before this case)")


def _unwritten(outcome: Any) -> str | None:
    """The function whose starter raised in this (untrusted) outcome, when it names a plausible one."""
    name = outcome.get("unwritten") if isinstance(outcome, dict) else None
    return name if isinstance(name, str) and name.isidentifier() and len(name) <= 80 else None


def error_hint(error: str) -> str:
    """The hint for an error the learner's call raised ("Type: message"): the first of ``ERROR_HINTS``
    whose text it holds, else ""."""
    return next((hint for text, hint in ERROR_HINTS if text in error), "")


def _judged_against(task: Task, want: Any, got: Any) -> Any:
    """The expected value, with a tied decision taken from the learner's own numbers (``Task.at_a_tie``)."""
    if task.at_a_tie is None:
        return want
    try:
        return task.at_a_tie(want, got)
    except Exception:  # noqa: BLE001 - whatever the learner returned, judge it against the reference
        return want


def _show_expected(want: Any, rule: Rule) -> str:
    """The expected value as feedback shows it; a distribution as shares of the draws."""
    if rule.significance is None:
        return show(want)
    return "shares [" + ", ".join(f"{share:.4g}" for share in from_plain(want)) + "]"


def _show_got(want: Any, got: Any, rule: Rule) -> str:
    """The result as feedback shows it; counts of draws with their chi-square test's verdict."""
    if rule.significance is None:
        return show(got)
    try:
        return goodness_of_fit(want, got, rule.significance, rule.draws).text()
    except PlainDataError as error:
        return f"{show(got)}: {error}"


def _hint(task: Task, case: Case, want: Any, got: Any) -> str:
    if task.hint is None:
        return ""
    try:
        return task.hint(case, from_plain(want), from_plain(got)) or ""
    except Exception:  # noqa: BLE001 - a hint must never break grading, whatever the learner returned
        return ""
