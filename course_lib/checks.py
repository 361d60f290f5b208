"""Argument checks shared by the systems code, with errors that say what to change."""

from __future__ import annotations


def require_positive(name: str, value: float) -> None:
    """Raise ValueError unless ``value`` is a number greater than zero."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}; pass a value above 0.")


def require_count(name: str, value: int, minimum: int = 1) -> None:
    """Raise ValueError unless ``value`` is an int (not a bool) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be a whole number of at least {minimum}, got {value!r}.")


def require_fraction(name: str, value: float) -> None:
    """Raise ValueError unless ``0 < value <= 1`` (a share of something: memory, a peak)."""
    require_positive(name, value)
    if value > 1:
        raise ValueError(f"{name} is a fraction and must be at most 1 (1 means all of it), got {value!r}.")


def require_probability(name: str, value: float) -> None:
    """Raise ValueError unless ``value`` is a number in ``[0, 1]``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"{name} is a probability and must lie in [0, 1], got {value!r}.")
