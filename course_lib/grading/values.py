"""Results as plain data, compared by value the way a person would.

A learner's function returns whatever Python object its author chose: an ``int`` or a ``float``
holding an integer, a ``dict`` or an ``OrderedDict``, a list or a tuple, a tensor, a
``Fraction``. ``to_plain`` turns any of them into JSON-ready data (tagged where JSON has no
type of its own), so results can leave the learner's process as data, never as objects or text;
``same_value`` then judges a result against the reference's under a task's ``Rule``:

* numbers are equal by value: ``131072.0`` equals ``131072``; non-integral results compare
  within the rule's tolerance; ``bool`` is not a number (``True`` is not ``1``);
* any mapping equals any other with the same items; key order counts only under
  ``Rule(ordered=True)``, when the task asks for an order;
* lists, tuples and arrays (tensors, NumPy) are all sequences and compare item by item (a
  tuple stays a tuple on the way, so inputs and feedback look as Python would print them);
* strings and bytes compare exactly;
* under ``Rule(significance=...)`` the expected value is a distribution (the probability of each
  outcome) and a result is how often each outcome came up in many random draws: it passes
  Pearson's chi-square goodness-of-fit test at that significance, and never shows an outcome
  of probability 0 (``goodness_of_fit``).
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import Any

MAX_DEPTH = 32          # nesting deeper than this is refused (a result is never that deep)
MAX_ITEMS = 200_000     # numbers, strings and containers in one result
MAX_TEXT = 16 * 2**20   # bytes of untrusted JSON the grader will parse


class PlainDataError(ValueError):
    """A value, or a file, that cannot be read as plain data; the message says why."""


@dataclass(frozen=True)
class Rule:
    """How a task's results are compared: float tolerances, whether mapping order counts, and for
    random results, the significance of the test they must pass."""

    rel_tol: float = 1e-6  # float32 arithmetic (NumPy, torch) is right to about 1e-7
    abs_tol: float = 1e-9
    ordered: bool = False
    significance: float | None = None  # results are counts of draws from the expected distribution
    draws: int | None = None  # with a significance: how many draws every result must count


@dataclass(frozen=True)
class Fit:
    """How counts of random draws fit a distribution: Pearson's chi-square test."""

    counts: tuple[int, ...]
    shares: tuple[float, ...]          # the expected probability of each outcome
    statistic: float                   # over possible outcomes, the sum of (count - expected)^2 / expected
    degrees_of_freedom: int            # possible outcomes - 1
    critical: float                    # what a right sampler's statistic exceeds with probability ``significance``
    significance: float
    impossible: tuple[int, ...]        # outcomes of probability 0 that were drawn

    @property
    def passed(self) -> bool:
        return not self.impossible and self.statistic <= self.critical

    def text(self) -> str:
        draws = sum(self.counts)
        seen = ", ".join(f"{count / draws:.4g}" for count in self.counts)
        text = f"counts {list(self.counts)} of {draws} draws (shares {seen})"
        if self.impossible:
            return text + f": drew {_outcomes(self.impossible)}, of probability 0"
        if not self.degrees_of_freedom:
            return text + ": the one possible outcome every time"
        verdict = "at most" if self.passed else "above"
        degrees = f"{self.degrees_of_freedom} degree{'s' if self.degrees_of_freedom > 1 else ''} of freedom"
        return text + (f": chi-square {self.statistic:.4g}, {verdict} the critical {self.critical:.4g} "
                       f"({degrees}, significance {self.significance:g})")


def _outcomes(indices: tuple[int, ...]) -> str:
    return ("outcome " if len(indices) == 1 else "outcomes ") + ", ".join(map(str, indices))


def goodness_of_fit(expected: Any, got: Any, significance: float, draws: int | None = None) -> Fit:
    """Test plain counts ``got`` against the plain distribution ``expected`` (one share per outcome,
    normalised here to sum to 1). Raises PlainDataError when ``got`` is not one count (an int, 0 or
    more) per outcome, with at least one draw, or (given ``draws``) counts another number of draws:
    a result from fewer draws than the grader asked for would pass a looser test."""
    weights = [float(share) for share in _sequence(expected)]
    shares = tuple(weight / sum(weights) for weight in weights)
    counts = _sequence(got)
    whole = isinstance(counts, list) and all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts)
    if not whole or len(counts) != len(shares) or not sum(counts):
        raise PlainDataError(f"not a list of {len(shares)} counts of draws")
    if draws is not None and sum(counts) != draws:
        raise PlainDataError(f"counts of {sum(counts)} draws, not of the {draws} the grader asked for")
    draws = sum(counts)
    possible = [i for i, share in enumerate(shares) if share > 0]
    statistic = sum((counts[i] - draws * shares[i]) ** 2 / (draws * shares[i]) for i in possible)
    degrees = len(possible) - 1
    impossible = tuple(i for i, share in enumerate(shares) if share == 0 and counts[i])
    return Fit(tuple(counts), shares, statistic, degrees, chi_square_critical(degrees, significance),
               significance, impossible)


def chi_square_survival(x: float, degrees_of_freedom: int) -> float:
    """P(X > x) for X chi-square distributed with a whole number of degrees of freedom, exactly:
    the closed forms, a sum of Poisson terms (x/2)^j e^(-x/2) / Gamma(j + 1) over j = 0, 1, ... below
    k/2 for even k, and over j = 1/2, 3/2, ... below k/2, plus erfc(sqrt(x/2)), for odd k."""
    if x <= 0:
        return 1.0
    half = x / 2
    odd = degrees_of_freedom % 2
    j = 0.5 if odd else 0.0
    term = math.exp(-half) * half ** j / math.gamma(j + 1)
    total = math.erfc(math.sqrt(half)) if odd else 0.0
    while j + 1 <= degrees_of_freedom / 2:  # the terms below k/2 (for odd k, from 1/2 on)
        total += term
        j += 1
        term *= half / j
    return total


def chi_square_critical(degrees_of_freedom: int, significance: float) -> float:
    """The x with P(X > x) = ``significance`` (0 for no degrees of freedom: the statistic is then 0),
    by bisection on ``chi_square_survival``."""
    if degrees_of_freedom == 0:
        return 0.0
    low, high = 0.0, 1.0
    while chi_square_survival(high, degrees_of_freedom) > significance:
        low, high = high, 2 * high
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if chi_square_survival(middle, degrees_of_freedom) > significance else (low, middle)
    return high


def to_plain(value: Any) -> Any:
    """``value`` as JSON-ready data: None, bools, ints, floats and strings as they are; containers,
    bytes, tensors and other objects as ``{"kind": ...}`` records. Raises PlainDataError when the
    value is nested more than MAX_DEPTH deep or holds more than MAX_ITEMS parts."""
    budget = [MAX_ITEMS]

    def convert(item: Any, depth: int) -> Any:
        budget[0] -= 1
        if budget[0] < 0:
            raise PlainDataError(f"the result has more than {MAX_ITEMS:,} parts")
        if depth > MAX_DEPTH:
            raise PlainDataError(f"the result is nested more than {MAX_DEPTH} levels deep")
        if item is None or isinstance(item, (bool, str)):
            return item
        if isinstance(item, numbers.Integral):
            return int(item)
        if isinstance(item, numbers.Real):
            return float(item)
        if isinstance(item, (bytes, bytearray)):
            return {"kind": "bytes", "hex": bytes(item).hex()}
        if hasattr(item, "tolist") and hasattr(item, "shape"):  # tensors and NumPy arrays or scalars
            items = item.tolist()
            return convert(items, depth + 1) if tuple(item.shape) == () else {"kind": "array", "items": convert(items, depth + 1)["items"]}
        if isinstance(item, Mapping):
            return {"kind": "mapping", "items": [[convert(k, depth + 1), convert(v, depth + 1)] for k, v in item.items()]}
        if isinstance(item, Set):
            return {"kind": "set", "items": sorted((convert(v, depth + 1) for v in item), key=repr)}
        if isinstance(item, (list, tuple)):
            return {"kind": type(item).__name__ if type(item) in (list, tuple) else "list",
                    "items": [convert(v, depth + 1) for v in item]}
        return {"kind": "object", "type": type(item).__name__, "repr": _short(repr(item))}

    return convert(value, 0)


def from_plain(plain: Any) -> Any:
    """The Python value plain data stands for (lists for sequences, dicts for mappings): how the
    grader's chosen inputs reach a learner's function."""
    if not isinstance(plain, dict):
        return [from_plain(v) for v in plain] if isinstance(plain, list) else plain
    kind = plain.get("kind")
    if kind == "bytes":
        return bytes.fromhex(plain["hex"])
    if kind == "mapping":
        return {_hashable(from_plain(k)): from_plain(v) for k, v in plain["items"]}
    if kind == "set":
        return {_hashable(from_plain(v)) for v in plain["items"]}
    if kind in ("list", "array"):
        return [from_plain(v) for v in plain["items"]]
    if kind == "tuple":
        return tuple(from_plain(v) for v in plain["items"])
    raise PlainDataError(f"no Python value for plain data of kind {kind!r}")


def _hashable(value: Any) -> Any:
    return tuple(_hashable(v) for v in value) if isinstance(value, list) else value


def loads(text: str) -> Any:
    """Parse untrusted JSON text: size-limited, and any failure (nesting included) is a PlainDataError."""
    if len(text) > MAX_TEXT:
        raise PlainDataError(f"larger than {MAX_TEXT // 2**20} MiB")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as error:
        raise PlainDataError(f"not readable JSON ({type(error).__name__})") from None


def same_value(expected: Any, got: Any, rule: Rule = Rule()) -> bool:
    """Whether plain result ``got`` equals plain reference ``expected`` under ``rule``."""
    try:
        if rule.significance is not None:
            return goodness_of_fit(expected, got, rule.significance, rule.draws).passed
        return _same(expected, got, rule)
    except (Exception, RecursionError):  # noqa: BLE001 - malformed data from the learner's side, or 10**400
        return False


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _sequence(value: Any) -> list | None:
    if isinstance(value, dict) and value.get("kind") in ("list", "tuple", "array"):
        return value["items"]
    return None


def _same(expected: Any, got: Any, rule: Rule) -> bool:
    if _is_number(expected):
        if not _is_number(got):
            return False
        if isinstance(expected, int) and isinstance(got, int):
            return expected == got
        if math.isnan(expected) or math.isnan(got):
            return math.isnan(expected) and math.isnan(got)
        if isinstance(expected, int):  # an integral answer: a float must hold exactly that integer
            return float(got).is_integer() and int(got) == expected
        return math.isclose(expected, got, rel_tol=rule.rel_tol, abs_tol=rule.abs_tol)
    if expected is None or isinstance(expected, (bool, str)):
        return type(got) is type(expected) and got == expected
    expected_items = _sequence(expected)
    if expected_items is not None:
        got_items = _sequence(got)
        return (got_items is not None and len(got_items) == len(expected_items)
                and all(_same(e, g, rule) for e, g in zip(expected_items, got_items)))
    kind = expected["kind"]
    if not isinstance(got, dict) or got.get("kind") != kind:
        return False
    if kind == "mapping":
        if len(got["items"]) != len(expected["items"]):
            return False
        if rule.ordered:
            return all(_same(ek, gk, rule) and _same(ev, gv, rule)
                       for (ek, ev), (gk, gv) in zip(expected["items"], got["items"]))
        unmatched = list(got["items"])
        for key, value in expected["items"]:
            match = next((i for i, (k, _) in enumerate(unmatched) if _same(key, k, rule)), None)
            if match is None or not _same(value, unmatched.pop(match)[1], rule):
                return False
        return True
    if kind == "set":
        return len(got["items"]) == len(expected["items"]) and all(
            any(_same(e, g, rule) for g in got["items"]) for e in expected["items"])
    return expected == got  # bytes (and objects, which a reference never returns)


def show(plain: Any, limit: int = 300) -> str:
    """Plain data written the way Python would print the value, shortened to about ``limit`` characters."""
    def text(value: Any) -> str:
        if not isinstance(value, dict):
            return "[" + ", ".join(map(text, value)) + "]" if isinstance(value, list) else repr(value)
        kind = value.get("kind")
        if kind == "bytes":
            return f"<{len(value['hex']) // 2} bytes {value['hex'][:12]}...>"
        if kind == "mapping":
            return "{" + ", ".join(f"{text(k)}: {text(v)}" for k, v in value["items"]) + "}"
        if kind == "set":
            return "{" + ", ".join(map(text, value["items"])) + "}" if value["items"] else "set()"
        if kind == "tuple":
            return "(" + ", ".join(map(text, value["items"])) + ("," if len(value["items"]) == 1 else "") + ")"
        if kind in ("list", "array"):
            return "[" + ", ".join(map(text, value["items"])) + "]"
        return f"<{value.get('type', 'object')}: {value.get('repr', '')}>"

    try:
        return _short(text(plain), limit)
    except (Exception, RecursionError):  # noqa: BLE001 - malformed data from the learner's side
        return "<unreadable value>"


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."
