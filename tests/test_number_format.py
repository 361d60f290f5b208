"""Numbers a learner reads: plain decimals with thousands separators, never e-notation."""

import pytest

from course_lib.perf.units import format_number, format_si


@pytest.mark.parametrize("value, text", [
    (2048.7, "2,049"), (2050.3, "2,050"), (184.4, "184"), (1.0249, "1.02"), (0.5, "0.5"), (69.23, "69.2"),
    (0.000123, "0.000123"), (9.996, "10"), (999.7, "1,000"), (123456, "123,456"), (-2050.3, "-2,050"), (0, "0"),
])
def test_format_number(value, text):
    assert format_number(value) == text


def test_format_number_takes_more_digits_when_asked():
    assert format_number(295.2238, 4) == "295.2" and format_number(184.514, 4) == "184.5"


@pytest.mark.parametrize("value, unit, digits, text", [
    (3.35e12, "B/s", 3, "3.35 TB/s"), (494.5e12, "FLOP/s", 4, "494.5 TFLOP/s"), (16.6e9, "B", 3, "16.6 GB"),
    (531e9, "FLOP", 3, "531 GFLOP"), (5, "B", 3, "5 B"), (2.2e15, "FLOP/s", 3, "2.2 PFLOP/s"),
])
def test_format_si(value, unit, digits, text):
    assert format_si(value, unit, digits) == text
