"""Which answers look copied: a similarity report for the cohort gradebook, as MOSS and JPlag give.

Learners can read the course's solutions and each other's shared files, and no grader can stop
them copying. What it can do is point an instructor at answers that are the same code under a
new coat. Per task, each learner's answer (their *Your code* cell for the task, plus any cell
they added that defines the task's function or follows that cell) is compared with the course
solution's (``solutions/NN_name_solution.ipynb``) and with every other learner's:

1. **Normalised tokens.** The code is split into Python tokens (``tokenize``; a cell that does
   not tokenize is split by a plain regular expression instead); comments, docstrings and other
   bare strings, blank lines and layout are dropped; every name a learner chooses (variables,
   parameters, helpers) becomes ``V``, so renaming changes nothing, while keywords, built-ins,
   attribute names (``model.num_layers``) and keyword-argument names stay; a number or a string
   becomes its value (``1e3`` and ``1000.0``, ``'a'`` and ``"a"`` are the same). IPython lines
   (``%timeit``, ``!ls``) are dropped. Learner code is only read, never run.
2. **Fingerprints:** every run of ``K`` consecutive normalised tokens (MOSS's k-grams, all of
   them: the cells are small, so none is sampled away). What the exercise itself gives (the
   task's starter cell: signature, docstring, ``raise NotImplementedError``; and the notebook's
   set-up cells) is removed first, as MOSS removes a base file: its lines are dropped from each
   answer and its fingerprints ignored, so the starter never makes two learners alike.
3. **Score:** shared fingerprints over all fingerprints of the two answers (Jaccard), so 1.0
   is the same code after normalisation and a reordering of independent statements only loses
   the few fingerprints that span the swapped lines; and **contained**: shared fingerprints over
   the shorter answer's (JPlag's maximum similarity), which a copy padded with code of one's own
   (checks, prints, a helper) keeps near 1.0 while its score drops.

A pair is **flagged** when its score is at least ``FLAG_SCORE`` or its contained share at least
``FLAG_CONTAINED``, and both answers have at least ``MIN_FINGERPRINTS`` fingerprints of their
own: a one-line formula is written the same way by most honest learners, so such short answers
are counted, never flagged. Pairs scoring at least
``LIST_SCORE`` are listed unflagged, for context. A flag is evidence for a conversation with
the learner, not proof: two learners who worked together, or followed the lesson's code
closely, look alike too; and a copy rewritten by hand (a loop for a comprehension, an
expression split in two) is not caught.

The notebooks compared are the ones ``grade-cohort`` graded, read the same way (as data, no link
followed, bounded: ``cohort.graded_notebooks``). The report is ``similarity.csv`` (one row per
listed pair) and ``similarity.html`` (a table of the learners flagged; per task, who is like the
course solution and which learners are alike, each answer shown once; the pairs listed for
context; per task how many answers were long enough to compare), written by ``gradebook.py``
like the rest of the gradebook: the same bytes on a rerun, each file written aside and renamed.
"""

from __future__ import annotations

import ast
import builtins
import csv
import html
import io
import keyword
import re
import tokenize
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import nbformat

from course_lib.exercise_files import solution_file
from course_lib.grading.gradebook import _cell, _write_atomically
from course_lib.grading.restore import ADDED_TAG, bound_names, restore_locked_cells
from course_lib.paths import REPO_ROOT

K = 5                    # tokens per fingerprint
FLAG_SCORE = 0.8         # flagged at or above this score, or ...
FLAG_CONTAINED = 0.9     # ... with this share of the shorter answer's fingerprints in the other, ...
MIN_FINGERPRINTS = 40    # ... when both answers have at least this many fingerprints of their own (about 4 lines)
LIST_SCORE = 0.5         # listed (not flagged) at or above this score
MAX_ANSWER_CHARS = 50_000  # of one answer's code, compared; the rest is ignored (a real answer is < 2,000)
MAX_SHOWN_CHARS = 4_000    # of one answer's code, shown in similarity.html
SOLUTION = "course solution"  # how the course's own answer is named in the report

NAME = "V"
BUILTINS = frozenset(dir(builtins))
STRUCTURE = {tokenize.NEWLINE: "⏎", tokenize.INDENT: "→", tokenize.DEDENT: "←"}
LAYOUT = frozenset(STRUCTURE.values())
_MAGIC = re.compile(r"^\s*[%!?]")
_FALLBACK = re.compile(r"""
    (?P<comment>\#[^\n]*)
  | (?P<string>[rRbBuUfF]{0,2}(?:'''[\s\S]*?'''|\"\"\"[\s\S]*?\"\"\"|'[^'\n]*'|"[^"\n]*"))
  | (?P<number>\d[\w.]*|\.\d[\w.]*)
  | (?P<name>[^\W\d]\w*)
  | (?P<newline>\n)
  | (?P<space>[ \t\r\f\\]+)
  | (?P<op>\*\*=?|//=?|>>=?|<<=?|->|:=|[-+*/%&|^@=<>!]=|[^\s\w])
""", re.VERBOSE)


@dataclass(frozen=True)
class Answer:
    who: str                     # a learner's folder name, or SOLUTION
    source: str                  # the code compared
    fingerprints: frozenset      # its fingerprints, less the exercise's own
    tokens: tuple[str, ...]      # its normalised tokens (identical answers have the same)


@dataclass(frozen=True)
class Pair:
    exercise: str
    task: str
    first: str                   # a learner
    second: str                  # another learner, or SOLUTION
    score: float                 # shared over all fingerprints of the two
    contained: float             # shared over the shorter answer's fingerprints
    shared: int                  # fingerprints the two have in common
    sizes: tuple[int, int]       # each one's fingerprints
    identical: bool              # the same normalised code
    flagged: bool

    @property
    def against(self) -> str:
        return "solution" if self.second == SOLUTION else "learner"


@dataclass(frozen=True)
class TaskSummary:
    exercise: str
    task: str
    answers: int                 # learners whose answer has code of their own (not only the starter)
    compared: int                # of those, answers long enough to be flagged
    solution_size: int           # the course solution's fingerprints (0: no solution to compare with)


@dataclass(frozen=True)
class SimilarityReport:
    pairs: tuple[Pair, ...]                  # listed pairs, by exercise, task, then highest score first
    tasks: tuple[TaskSummary, ...]
    sources: Mapping[tuple[str, str, str], str] = field(repr=False)  # (exercise, task, who) -> code, flagged only
    problems: tuple[str, ...] = ()           # what could not be compared (a task whose solution is missing)

    @property
    def flagged(self) -> tuple[Pair, ...]:
        return tuple(pair for pair in self.pairs if pair.flagged)


# --- normalising code ---------------------------------------------------------------------------

def _literal(text: str, kind: str) -> str:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return kind  # an f-string, or a literal too odd to read: its kind only
    return repr(value)[:60]


def _raw_tokens(source: str) -> list[tuple[str, str]]:
    """(kind, text) for each token: ``tokenize``'s, else the fallback expression's for code that
    does not tokenize (an unfinished cell)."""
    try:
        tokens = []
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type in STRUCTURE:
                tokens.append(("structure", STRUCTURE[token.type]))
            elif token.type == tokenize.NAME:
                tokens.append(("name", token.string))
            elif token.type == tokenize.NUMBER:
                tokens.append(("number", token.string))
            elif token.type == tokenize.STRING:
                tokens.append(("string", token.string))
            elif token.type in (tokenize.OP, tokenize.ERRORTOKEN) and token.string.strip():
                tokens.append(("op", token.string))
        return tokens
    except (tokenize.TokenError, IndentationError, SyntaxError, ValueError):
        pass
    tokens = []
    for match in _FALLBACK.finditer(source):
        kind = match.lastgroup
        if kind == "newline":
            tokens.append(("structure", STRUCTURE[tokenize.NEWLINE]))
        elif kind not in ("comment", "space"):
            tokens.append((kind, match.group()))
    return tokens


def normalised_tokens(source: str) -> list[str]:
    """``source``'s tokens with names, layout, comments and docstrings normalised away (see the
    module's docstring); learner code is only tokenized, never parsed into anything that runs."""
    source = "\n".join("" if _MAGIC.match(line) else line for line in source[:MAX_ANSWER_CHARS].splitlines())
    raw = _raw_tokens(source + "\n")
    out: list[str] = []
    depth, bare_string = 0, False
    for index, (kind, text) in enumerate(raw):
        before = raw[index - 1] if index else ("structure", "⏎")
        after = raw[index + 1] if index + 1 < len(raw) else ("structure", "⏎")
        if kind == "op":
            depth += text in "([{"
            depth -= depth > 0 and text in ")]}"
            out.append(text)
        elif kind == "structure":
            if text != "⏎" or (out and out[-1] not in ("⏎", "→") and not bare_string):  # no empty lines
                out.append(text)
            bare_string = False
        elif kind == "string":
            if before[0] == "structure" and after == ("structure", "⏎"):
                bare_string = True
                continue  # a docstring or another bare string: a comment
            if before[0] == "string" and out and out[-1].startswith(("'", '"', "string")):
                continue  # implicit concatenation: one literal
            out.append(_literal(text, "string"))
        elif kind == "number":
            out.append(_literal(text, "number"))
        elif keyword.iskeyword(text) or text in BUILTINS or before == ("op", ".") \
                or (depth and after == ("op", "=")):
            out.append(text)  # a keyword, a built-in, an attribute, a keyword argument's name
        else:
            out.append(NAME)
    while out and out[-1] in ("⏎", "←"):
        out.pop()
    return out


def fingerprints(tokens: Sequence[str], base: frozenset = frozenset()) -> frozenset:
    """Every run of ``K`` tokens (a shorter answer is one fingerprint), less those in ``base`` and
    those of layout only."""
    runs = {tuple(tokens[i:i + K]) for i in range(max(1, len(tokens) - K + 1))} if tokens else set()
    return frozenset(run for run in runs - base if not set(run) <= LAYOUT)


def similarity(a: frozenset, b: frozenset) -> float:
    """Shared fingerprints over all of the two answers' fingerprints (0 when both are empty)."""
    union = len(a | b)
    return len(a & b) / union if union else 0.0


# --- the answers in a notebook -----------------------------------------------------------------

def _is(cell, tag: str) -> bool:
    return tag in cell.metadata.get("tags", [])


def task_sources(book: nbformat.NotebookNode, pristine: nbformat.NotebookNode,
                 functions: Sequence[str]) -> list[str]:
    """The learner's code for each task, in task order: the task's *Your code* cell as the grader
    rebuilds it (``restore.py``), with each cell they added: under the task whose function it
    defines, else under the *Your code* cell it follows (the first task's, above them all)."""
    ids = [cell.get("id") for cell in pristine.cells if _is(cell, "student")]
    parts: list[list[str]] = [[] for _ in ids]
    current = 0
    for cell in restore_locked_cells(book, pristine).cells:
        if cell.cell_type != "code":
            continue
        if _is(cell, "student") and cell.get("id") in ids:
            current = ids.index(cell.get("id"))
            parts[current].append(cell.source)
        elif _is(cell, ADDED_TAG):
            defined = bound_names(cell.source) or set()  # parsed, never run; a star import names none
            owner = next((i for i, name in enumerate(functions[:len(ids)]) if name in defined), current)
            parts[owner].append(cell.source)
    return ["\n\n".join(part) for part in parts]


def solution_sources(solution: nbformat.NotebookNode) -> list[str]:
    """The course solution's code for each task: its ``student`` cells, in order."""
    return [cell.source for cell in solution.cells if cell.cell_type == "code" and _is(cell, "student")]


def load_solutions(modules: Iterable[str], course_root: Path = REPO_ROOT) -> dict[str, list[str]]:
    """Each module's course solution (``solution_sources``), read from ``course_root/solutions/``;
    a module without a readable solution is left out (its learners are compared with each other)."""
    solutions = {}
    for module in modules:
        try:
            solutions[module] = solution_sources(
                nbformat.read(course_root / "solutions" / solution_file(module), as_version=4))
        except (OSError, ValueError):
            continue
    return solutions


def given_code(pristine: nbformat.NotebookNode) -> list[str]:
    """What the exercise itself gives each task, in task order: its set-up cells and the task's
    starter cell (signature, docstring, ``raise NotImplementedError``)."""
    setup = [cell.source for cell in pristine.cells if cell.cell_type == "code" and _is(cell, "setup")]
    return ["\n\n".join([*setup, cell.source]) for cell in pristine.cells
            if cell.cell_type == "code" and _is(cell, "student")]


def _lines(tokens: Sequence[str]) -> list[tuple[str, ...]]:
    """The logical lines of normalised ``tokens``: each line's tokens, indentation included."""
    lines, line = [], []
    for token in tokens:
        if token == "⏎":
            lines.append(tuple(line))
            line = []
        else:
            line.append(token)
    return lines + [tuple(line)] if line else lines


def _content(line: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(token for token in line if token not in ("→", "←"))


def without_given(tokens: Sequence[str], given: Sequence[str]) -> list[str]:
    """``tokens`` without the logical lines that ``given`` has too (the starter's signature, its
    ``raise`` line, an import of the set-up), so no fingerprint spans what the exercise gave."""
    known = {_content(line) for line in _lines(given)}
    out: list[str] = []
    for line in _lines(tokens):
        if _content(line) in known:
            out += [token for token in line if token in ("→", "←")]
        else:
            out += [*line, "⏎"]
    return out[:-1] if out[-1:] == ["⏎"] else out


# --- comparing ----------------------------------------------------------------------------------

def compare_task(exercise: str, task: str, answers: Mapping[str, str], given: str = "",
                 solution: str | None = None) -> tuple[list[Pair], TaskSummary, dict]:
    """Compare every two of ``answers`` (learner -> code) and each with ``solution``, leaving out
    what the exercise ``given``: the listed pairs, the task's summary, and the code of every
    answer in a flagged pair."""
    given_tokens = normalised_tokens(given)
    base = fingerprints(given_tokens)

    def answer(who: str, source: str) -> Answer:
        source = source[:MAX_ANSWER_CHARS]
        tokens = without_given(normalised_tokens(source), given_tokens)
        return Answer(who, source, fingerprints(tokens, base), tuple(tokens))

    held = {}
    for who, source in sorted(answers.items()):
        mine = answer(who, source)
        if mine.fingerprints:
            held[who] = mine
    reference = answer(SOLUTION, solution) if solution is not None else None
    others = [(a, b) for a, b in combinations(held.values(), 2)]
    if reference is not None and reference.fingerprints:
        others += [(answer, reference) for answer in held.values()]
    pairs, shown = [], {}
    for a, b in others:
        smaller = min(len(a.fingerprints), len(b.fingerprints))
        if smaller < MIN_FINGERPRINTS:
            continue  # short answers look alike whoever wrote them: counted in the summary, never listed
        shared = len(a.fingerprints & b.fingerprints)
        score, contained = similarity(a.fingerprints, b.fingerprints), shared / smaller
        flagged = score >= FLAG_SCORE or contained >= FLAG_CONTAINED
        if score < LIST_SCORE and not flagged:
            continue
        pair = Pair(exercise, task, a.who, b.who, round(score, 3), round(contained, 3), shared,
                    (len(a.fingerprints), len(b.fingerprints)), a.tokens == b.tokens, flagged)
        pairs.append(pair)
        if pair.flagged:
            shown.update({(exercise, task, a.who): a.source, (exercise, task, b.who): b.source})
    pairs.sort(key=lambda p: (-p.score, p.first, p.second))
    compared = sum(len(answer.fingerprints) >= MIN_FINGERPRINTS for answer in held.values())
    summary = TaskSummary(exercise, task, len(held), compared,
                          len(reference.fingerprints) if reference is not None else 0)
    return pairs, summary, shown


def compare_cohort(learners: Iterable[str], exercises: Sequence, solutions: Mapping[str, list[str]],
                   read: Callable[[str, str], nbformat.NotebookNode | None]) -> SimilarityReport:
    """The similarity report for ``learners`` on ``exercises`` (``PreparedExercise``: its pristine
    notebook and tasks). ``solutions`` maps a module to its solution's task sources
    (``solution_sources``); ``read(learner, module)`` gives the notebook the grader graded, or None."""
    learners = sorted(learners)
    pairs, tasks, shown, problems = [], [], {}, []
    for exercise in exercises:
        functions = [task.function for task in exercise.tasks]
        headings = [task.heading for task in exercise.tasks]
        given = given_code(exercise.pristine)
        answers: list[dict[str, str]] = [{} for _ in given]
        for learner in learners:
            book = read(learner, exercise.name)
            if book is None:
                continue
            for index, source in enumerate(task_sources(book, exercise.pristine, functions)):
                answers[index][learner] = source
        reference = solutions.get(exercise.name)
        if reference is None:
            problems.append(f"{exercise.name}: no course solution to compare with; learners were compared "
                            "with each other only")
        for index, code in enumerate(given):
            heading = headings[index] if index < len(headings) else f"Task {index + 1}"
            solution = reference[index] if reference is not None and index < len(reference) else None
            found, summary, sources = compare_task(exercise.name, heading, answers[index], code, solution)
            pairs += found
            tasks.append(summary)
            shown.update(sources)
    return SimilarityReport(tuple(pairs), tuple(tasks), shown, tuple(problems))


# --- the report ---------------------------------------------------------------------------------

def similarity_csv(report: SimilarityReport) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["exercise", "task", "learner", "other", "against", "score", "contained", "shared", "learner_size",
                     "other_size", "identical", "flagged"])
    for pair in report.pairs:
        writer.writerow([pair.exercise, _cell(pair.task), _cell(pair.first), _cell(pair.second), pair.against,
                         f"{pair.score:.3f}", f"{pair.contained:.3f}", pair.shared, pair.sizes[0], pair.sizes[1],
                         int(pair.identical), int(pair.flagged)])
    return out.getvalue()


def _groups(pairs: Sequence[Pair]) -> list[list[str]]:
    """The learners that ``pairs`` link, directly or through others, each group sorted."""
    parent: dict[str, str] = {}

    def root(who: str) -> str:
        while parent.setdefault(who, who) != who:
            who = parent[who]
        return who

    for pair in pairs:
        parent[root(pair.first)] = root(pair.second)
    groups: dict[str, list[str]] = defaultdict(list)
    for who in sorted(parent):
        groups[root(who)].append(who)
    return sorted(groups.values())


def _answer(report: SimilarityReport, exercise: str, task: str, who: str) -> str:
    source = report.sources.get((exercise, task, who), "")
    cut = source[:MAX_SHOWN_CHARS] + ("\n..." if len(source) > MAX_SHOWN_CHARS else "")
    return (f"<details><summary>{html.escape(who)}'s answer</summary>"
            f"<pre style='background:#f6f8fa;padding:6px'>{html.escape(cut)}</pre></details>")


def _scores(pairs: Iterable[Pair]) -> str:
    return ", ".join(f"{html.escape(p.first)} and {html.escape(p.second)} {_score(p)}" for p in pairs)


def _score(pair: Pair) -> str:
    return f"{pair.score:.3f}" + (f", {pair.contained:.3f} contained" if pair.score < FLAG_SCORE else "")


def _split(pairs: Sequence[Pair]) -> tuple[list[Pair], list[Pair]]:
    """One task's flagged pairs: those of a learner like the course solution, and those of two
    learners alike, less the pairs of two learners who are both like the solution (that says
    nothing more; the CSV still lists them)."""
    like_solution = [pair for pair in pairs if pair.second == SOLUTION]
    copied = {pair.first for pair in like_solution}
    return like_solution, [pair for pair in pairs
                           if pair.second != SOLUTION and not {pair.first, pair.second} <= copied]


def _task_section(report: SimilarityReport, exercise: str, task: str, pairs: list[Pair]) -> str:
    """One task's flags: who is like the course solution, then groups of learners alike."""
    like_solution, between = _split(pairs)
    copied = {pair.first for pair in like_solution}
    parts = [f"<h3>{html.escape(exercise)} · {html.escape(task)}</h3>"]
    if like_solution:
        who = ", ".join(f"{html.escape(p.first)} ({_score(p)})" for p in sorted(like_solution, key=lambda p: p.first))
        parts.append(f"<p><b>Like the course solution:</b> {who}</p>")
    for group in _groups(between):
        inside = [pair for pair in between if pair.first in group]
        parts.append(f"<p><b>Alike:</b> {', '.join(map(html.escape, group))} ({_scores(inside)})</p>")
    shown = ([SOLUTION] if like_solution else []) + sorted(copied | {w for p in between for w in (p.first, p.second)})
    parts += [_answer(report, exercise, task, who) for who in shown]
    return "".join(parts)


def _pair_row(pair: Pair) -> str:
    return (f"<tr><td>{html.escape(pair.exercise)}</td><td>{html.escape(pair.task)}</td>"
            f"<td>{html.escape(pair.first)}</td><td>{html.escape(pair.second)}</td><td>{pair.score:.3f}</td>"
            f"<td>{pair.contained:.3f}</td>"
            f"<td>{pair.shared} of {pair.sizes[0]} / {pair.sizes[1]}</td></tr>")


def similarity_html(report: SimilarityReport) -> str:
    flagged = report.flagged
    listed = [pair for pair in report.pairs if not pair.flagged]
    by_task: dict[tuple[str, str], list[Pair]] = defaultdict(list)
    for pair in flagged:
        by_task[(pair.exercise, pair.task)].append(pair)
    sections = "".join(_task_section(report, exercise, task, by_task[(exercise, task)])
                       for exercise, task in dict.fromkeys((t.exercise, t.task) for t in report.tasks)
                       if (exercise, task) in by_task)
    per_learner: dict[str, list[set[str]]] = defaultdict(lambda: [set(), set()])
    for (exercise, task), pairs in by_task.items():
        where = f"{exercise} {task.split(' ·')[0]}"
        like_solution, between = _split(pairs)
        for pair in like_solution:
            per_learner[pair.first][0].add(where)
        for pair in between:
            per_learner[pair.first][1].add(where)
            per_learner[pair.second][1].add(where)
    learner_rows = "".join(
        f"<tr><td>{html.escape(who)}</td><td>{len(solution)}</td><td>{html.escape(', '.join(sorted(solution)))}</td>"
        f"<td>{len(others)}</td><td>{html.escape(', '.join(sorted(others)))}</td></tr>"
        for who, (solution, others) in sorted(per_learner.items(), key=lambda item: (-sum(map(len, item[1])), item[0])))
    head = ("<tr><th>exercise</th><th>task</th><th>learner</th><th>other</th><th>score</th><th>contained</th>"
            "<th>shared fingerprints</th></tr>")
    task_rows = "".join(
        f"<tr><td>{html.escape(t.exercise)}</td><td>{html.escape(t.task)}</td><td>{t.answers}</td>"
        f"<td>{t.compared}</td><td>{t.solution_size or 'no solution'}</td></tr>" for t in report.tasks)
    problems = "".join(f"<li>{html.escape(line)}</li>" for line in report.problems)
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>Similarity</title></head>"
        "<body style='font-family:sans-serif'><h1>Answers that look alike</h1>"
        f"<p>Per task, each learner's code is compared with the course solution's and with every other "
        f"learner's, after normalising it: names become one placeholder, comments, docstrings and layout go, "
        f"literals are compared by value. The score is the share of {K}-token fingerprints the two answers "
        f"have in common (1.0: the same code after normalising); what the exercise gives (its starter cell and "
        f"set-up) is left out; <i>contained</i> is the share of the shorter answer's fingerprints found in the "
        f"other, high for a copy padded with code of one's own. A pair is <b>flagged</b> at a score of "
        f"{FLAG_SCORE} or more, or {FLAG_CONTAINED} contained, when both answers have at least "
        f"{MIN_FINGERPRINTS} fingerprints of their own (about four lines): shorter answers, such as a one-line "
        f"formula, are written alike by honest learners and are never flagged. Renaming, "
        f"reformatting, new comments and reordered statements do not hide a copy; rewriting it does.</p>"
        f"<p><b>A flag is evidence for a conversation, not proof</b>: learners who worked together, or who "
        f"followed the lesson's code closely, look alike too.</p>"
        + (f"<ul>{problems}</ul>" if problems else "")
        + f"<h2>Flagged: {len(flagged)} pair(s)</h2>"
        + ("<table border=1 cellpadding=4><tr><th>learner</th><th colspan=2>tasks like the course solution</th>"
           f"<th colspan=2>tasks like another learner's</th></tr>{learner_rows}</table>{sections}"
           if flagged else "<p>None.</p>")
        + f"<h2>Listed, not flagged: {len(listed)} pair(s)</h2><p>Scores from {LIST_SCORE} to {FLAG_SCORE}, "
        f"for context.</p>"
        + (f"<table border=1 cellpadding=4>{head}{''.join(map(_pair_row, listed))}</table>"
           if listed else "<p>None.</p>")
        + "<h2>Answers per task</h2><p>Answers: learners with code of their own for the task; compared: those "
        f"long enough to be flagged ({MIN_FINGERPRINTS} fingerprints or more).</p><table border=1 cellpadding=4>"
        "<tr><th>exercise</th><th>task</th><th>answers</th><th>compared</th><th>solution's fingerprints</th></tr>"
        f"{task_rows}</table></body></html>\n")


def write_similarity(report: SimilarityReport, out: Path) -> list[Path]:
    """Write ``similarity.csv`` and ``similarity.html`` under ``out``; return their paths."""
    return [_write_atomically(out / "similarity.csv", similarity_csv(report)),
            _write_atomically(out / "similarity.html", similarity_html(report))]
