"""Numbers a learner reads: plain decimals with thousands separators, never e-notation."""

import pytest

from course_lib.perf.units import format_bytes, format_duration, format_number, format_si
from course_lib.widgets.log_ticks import bytes_ticks, time_ticks


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


@pytest.mark.parametrize("seconds, text", [
    (4.294967, "4.29 s"), (17.183146, "17.2 s"), (0.00511, "5.11 ms"), (9.016e-5, "90.2 µs"), (0.05504, "55 ms"),
    (0.99996, "1 s"), (0.9994, "999 ms"), (1.5e-9, "1.5 ns"), (0, "0 s"), (-0.002, "-2 ms"), (17183.1, "17,183 s"),
])
def test_format_duration_picks_the_unit_that_fits(seconds, text):
    assert format_duration(seconds) == text


def test_format_bytes_whole_drops_only_a_zero_decimal():
    assert format_bytes(128 * 1024) == "128.0 KiB" and format_bytes(128 * 1024, whole=True) == "128 KiB"
    assert format_bytes(1536, whole=True) == "1.5 KiB" and format_bytes(100, whole=True) == "100 B"


def test_log_ticks_carry_units_and_lie_on_the_data():
    ticks = time_ticks(9e-7, 17.2)
    assert ticks["ticktext"][0] == "1 µs" and ticks["ticktext"][-1] == "10 s" and "1 ms" in ticks["ticktext"]
    assert all(any(u in t for u in (" s", "ms", "µs", "ns")) for t in ticks["ticktext"])
    narrow = time_ticks(2e-3, 8e-3)  # inside one decade: still labelled, at 1-2-5 or whole steps
    assert narrow["ticktext"][0] == "2 ms" and len(narrow["tickvals"]) >= 3
    sizes = bytes_ticks(1024, 4 * 2**30)
    assert sizes["tickvals"][:2] == [1024, 16384] and sizes["ticktext"][:3] == ["1 KiB", "16 KiB", "256 KiB"]
    assert sizes["tickvals"][-1] >= 4 * 2**30
    with pytest.raises(ValueError, match="0 < low <= high"):
        time_ticks(0, 1)


def test_plural_says_one_thing_and_many_things():
    from course_lib.perf.units import plural

    assert plural(1, "token") == "1 token" and plural(2048, "token") == "2,048 tokens"
    assert plural(1, "request/s") == "1 request/s" and plural(14.37, "request/s") == "14.4 requests/s"
    assert plural(0, "pitfall") == "0 pitfalls" and plural(2, "query", "queries") == "2 queries"


def test_a_speed_ratio_is_worded_by_its_side_of_one():
    from course_lib.perf.units import format_speedup

    assert format_speedup(1.5) == "1.50x faster" and format_speedup(0.5) == "2.00x slower"
    assert format_speedup(0.94) == "1.06x slower" and format_speedup(1.001) == "no faster or slower (1.00x)"


@pytest.mark.parametrize("value, text", [
    (4.77e-7, "4.8 × 10⁻⁷"), (3.81e-6, "3.8 × 10⁻⁶"), (1e-7, "1 × 10⁻⁷"), (9.96e-7, "1 × 10⁻⁶"), (0.0, "0"),
    (-1.2e-8, "-1.2 × 10⁻⁸"), (2.5e12, "2.5 × 10¹²"),
])
def test_format_power_of_ten(value, text):
    from course_lib.perf.units import format_power_of_ten

    assert format_power_of_ten(value) == text and "e" not in text
