"""Argument checks shared by the systems code, with errors that say what to change."""

from __future__ import annotations


def require_positive(name: str, value: float) -> None:
    """Raise ValueError unless ``value`` is a number greater than zero."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}; pass a value above 0.")


def require_fraction(name: str, value: float) -> None:
    """Raise ValueError unless ``0 < value <= 1``."""
    require_positive(name, value)
    if value > 1:
        raise ValueError(f"{name} is a fraction of memory and must be at most 1, got {value!r}.")


def require_probability(name: str, value: float) -> None:
    """Raise ValueError unless ``value`` is a number in ``[0, 1]``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"{name} is a probability and must lie in [0, 1], got {value!r}.")
