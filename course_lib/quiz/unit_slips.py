"""Numeric answers given in the wrong unit: off by a power of 1,000 or 1,024, or by 8 (bits).

A learner who enters 0.0655 where 65.5 ms is asked did the sum right and wrote seconds; saying
"too low" would send them looking for a mistake that is not there. ``unit_slip`` recognises a
value that one of ``UNIT_FACTORS`` turns into an accepted answer, and names the unit the value
looks like when the question's unit is one it knows (time, bytes and bits, and their rates).

Invariant: a slip is only reported for a value the question rejects (the caller checks the
answer first), and the sentence speaks of the value given and its unit, never of the answer.
"""

from __future__ import annotations

from collections.abc import Callable

# The factors a unit slip multiplies by, with how to say them. The lint probes every question
# with all of them; ``8`` (bits for bytes) and the decimal/binary ratios only mean a slip in data units.
UNIT_FACTORS = {1e3: "1,000", 1e6: "a million", 1e9: "a billion",
                2.0**10: "1,024", 2.0**20: "2^20 (1,048,576)", 2.0**30: "2^30", 8.0: "8"}
_DATA_ONLY = {8.0: "8", 2**10 / 1e3: "1.024", 2**20 / 1e6: "1.049", 2**30 / 1e9: "1.074"}

_TIME = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}
_DATA = {"bits": 1 / 8, "bytes": 1.0, "B": 1.0, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
         "KiB": 2.0**10, "MiB": 2.0**20, "GiB": 2.0**30, "TiB": 2.0**40}


def _family(unit: str) -> tuple[dict[str, float], float, str] | None:
    """The known units ``unit`` belongs with, its scale among them and a suffix ("/s" for rates)."""
    base, suffix = (unit[:-2], "/s") if unit.endswith("/s") else (unit, "")
    for family in (_TIME, _DATA):
        if base in family and not (family is _TIME and suffix):
            return family, family[base], suffix
    return None


def _unit_at(scale: float, family: dict[str, float], suffix: str) -> str | None:
    """The first unit of ``family`` (in its listed order) whose scale is ``scale``."""
    return next((name + suffix for name, s in family.items() if abs(s / scale - 1) < 1e-6), None)


def slip_factors(unit: str) -> dict[float, str]:
    """The factors that make a unit slip in ``unit``, with how to say them."""
    known = _family(unit)
    if known is not None and known[0] is _DATA:
        return UNIT_FACTORS | _DATA_ONLY
    return {f: said for f, said in UNIT_FACTORS.items() if f != 8.0}


def unit_slip(value: float, answer: float, unit: str, accepts: Callable[[float, float], bool]) -> str | None:
    """What to tell a learner whose ``value`` is off by a unit factor from ``answer`` (``accepts``
    judges a value against the answer), or None when no factor explains it."""
    known = _family(unit)
    factors = slip_factors(unit)
    slips = [(abs(value * f / answer - 1) if small else abs(value / f / answer - 1), f, small)
             for f in factors for small in (True, False)
             if answer and accepts(value * f if small else value / f, answer)]
    if not slips:
        return None
    _, factor, small = min(slips)
    said = f"{factors[factor]} times too {'small' if small else 'large'}"
    if known is not None:
        family, scale, suffix = known
        looks_like = _unit_at(scale * factor if small else scale / factor, family, suffix)
        if looks_like is not None:
            return f"{said}: that looks like a value in {looks_like}, where the question asks for {unit}."
    return f"{said}: check the unit, the question asks for {unit}."
