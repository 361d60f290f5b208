"""Byte units and human-readable formatting."""

from __future__ import annotations

import math

KiB = 1024
MiB = 1024**2
GiB = 1024**3
GB = 10**9


def format_bytes(num_bytes: float, whole: bool = False) -> str:
    """Format a byte count with a binary unit, e.g. ``131072 -> '128.0 KiB'``; ``whole`` drops a
    '.0' (``'128 KiB'``), for menus and ticks of round sizes."""
    sign = "-" if num_bytes < 0 else ""
    value = abs(float(num_bytes))
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if value >= size:
            text = f"{value / size:.1f}"
            return f"{sign}{text.removesuffix('.0') if whole else text} {unit}"
    return f"{sign}{value:.0f} B"


def format_number(value: float, digits: int = 3) -> str:
    """``value`` to ``digits`` significant digits as a plain decimal with thousands separators,
    never in e-notation, trailing zeros after the point dropped: 2048.7 -> '2,049', 184.4 -> '184',
    1.0249 -> '1.02', 0.5 -> '0.5', 0.000123 -> '0.000123'. Whole digits are never dropped
    (123456 -> '123,456')."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    rounded = round(value, decimals)
    if rounded != 0:  # rounding may carry into the next power of ten (9.996 -> 10.0)
        decimals = max(0, digits - 1 - math.floor(math.log10(abs(rounded))))
    text = f"{round(value, decimals):,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def format_si(value: float, unit: str, digits: int = 3) -> str:
    """``value`` with an SI prefix and ``unit``, to ``digits`` significant digits, never in
    e-notation: (3.35e12, 'B/s') -> '3.35 TB/s', (494.5e12, 'FLOP/s', 4) -> '494.5 TFLOP/s'."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{format_number(value / scale, digits)} {prefix}{unit}"
    return f"{format_number(value, digits)} {unit}"


SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def format_power_of_ten(value: float, digits: int = 2) -> str:
    """``value`` as ``digits`` significant digits times a power of ten written in superscripts, for
    values too small or large to read as decimals, never in e-notation: 4.77e-7 -> '4.8 × 10⁻⁷',
    3.81e-6 -> '3.8 × 10⁻⁶', 1e-7 -> '1 × 10⁻⁷', 0 -> '0'."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    mantissa, exponent = f"{value:.{digits - 1}e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".") if "." in mantissa else mantissa
    return f"{mantissa} × 10{str(int(exponent)).translate(SUPERSCRIPT)}"


def format_duration(seconds: float, digits: int = 3) -> str:
    """``seconds`` in the unit that fits it, s, ms, µs or ns, to ``digits`` significant digits, never in
    e-notation: 4.2949 -> '4.29 s', 0.00511 -> '5.11 ms', 9.02e-5 -> '90.2 µs'. A value that rounds up to
    the next unit takes it (0.99996 -> '1 s', not '1,000 ms')."""
    if seconds == 0 or not math.isfinite(seconds):
        return f"{seconds:g} s"
    carry = 1 - 5 * 10 ** -(digits + 1)  # 0.9995 of a unit rounds to 1 at 3 digits
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(seconds) >= scale * carry:
            return f"{format_number(seconds / scale, digits)} {unit}"
    return f"{format_number(seconds * 1e9, digits)} ns"


def plural(count: float, noun: str, plural_noun: str | None = None) -> str:
    """``count`` (thousands separated, as ``format_number`` writes it) and ``noun``, plural unless
    the count is exactly 1: (1, 'token') -> '1 token', (2048, 'token') -> '2,048 tokens',
    (1, 'request/s') -> '1 request/s'; ``plural_noun`` where adding 's' is wrong."""
    word = noun if count == 1 else (plural_noun or _plural_of(noun))
    return f"{format_number(count) if count != int(count) else f'{int(count):,}'} {word}"


def _plural_of(noun: str) -> str:
    """'token' -> 'tokens'; a rate's first word takes the 's': 'request/s' -> 'requests/s'."""
    head, slash, tail = noun.partition("/")
    return f"{head}s{slash}{tail}"


def format_speedup(ratio: float) -> str:
    """A speed ratio (old time / new time) in words, by which side of 1 it falls: 1.5 -> '1.50x
    faster', 0.94 -> '1.06x slower' (1 / 0.94), 1.001 -> 'no faster or slower (1.00x)'."""
    if round(ratio, 2) == 1:
        return "no faster or slower (1.00x)"
    return f"{ratio:.2f}x faster" if ratio > 1 else f"{1 / ratio:.2f}x slower"
