"""Results compared by value: the rules a person grading by hand would apply."""

import json
from collections import OrderedDict
from fractions import Fraction

import numpy as np
import pytest
import torch

from course_lib.grading.values import (MAX_DEPTH, PlainDataError, Rule, chi_square_critical, chi_square_survival,
                                      from_plain, goodness_of_fit, loads, same_value, show, to_plain)


def same(expected, got, rule=Rule()):
    return same_value(to_plain(expected), json.loads(json.dumps(to_plain(got))), rule)


@pytest.mark.parametrize("expected, got", [
    (131072, 131072.0), (4117, np.float64(4117.0)), (64, np.int64(64)), (0.16875, Fraction(27, 160)),
    ({"a": 1, "b": 2}, OrderedDict([("b", 2), ("a", 1)])), ([1, 2, 3], (1, 2, 3)), ([1.0, 2.0], torch.tensor([1.0, 2.0])),
    ([("ring", 0, 3)], [["ring", 0, 3]]), (5, torch.tensor(5)), (b"\x00\x01", b"\x00\x01"), ({1, 2}, {2, 1}),
])
def test_equal_by_value(expected, got):
    assert same(expected, got)


@pytest.mark.parametrize("expected, got", [
    (131072, 131072.5), (1, True), (True, 1), (0, None), ("ring", "tree"), ([1, 2], [1, 2, 3]),
    ({"a": 1}, {"a": 1, "b": 0}), (0.1, 0.1001), (4117, "4117"), ([1, 2], {"kind": "list"}), (b"a", "a"),
])
def test_different_values(expected, got):
    assert not same(expected, got)


def test_order_counts_only_when_the_rule_says_so():
    assert same({"a": 1, "b": 2}, {"b": 2, "a": 1})
    assert not same({"a": 1, "b": 2}, {"b": 2, "a": 1}, Rule(ordered=True))
    assert same({"a": 1, "b": 2}, OrderedDict(a=1, b=2), Rule(ordered=True))


def test_tolerance_is_the_rules():
    assert same(0.16875, 0.16875000298023224)  # float32 arithmetic passes by default
    assert not same(1.0, 1.0 + 1e-5)
    assert same(1.0, 1.0 + 1e-5, Rule(rel_tol=1e-4))
    assert not same(1, 10**400) and not same(0.5, 10**400)


def test_malformed_results_are_never_equal_and_never_raise():
    for junk in ({"kind": "mapping"}, {"kind": "mapping", "items": 5}, {"kind": "list", "items": None}, {"x": 1}, [[[]]]):
        assert not same_value(to_plain({"a": 1}), junk)
        assert not same_value(to_plain([1]), junk)
        show(junk)


def test_limits_on_what_a_result_may_be():
    deep = []
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    with pytest.raises(PlainDataError, match="nested"):
        to_plain(deep)
    with pytest.raises(PlainDataError, match="parts"):
        to_plain(list(range(300_000)))
    with pytest.raises(PlainDataError, match="JSON"):
        loads("[" * 100_000)
    assert to_plain(object())["kind"] == "object"


def test_inputs_round_trip_to_the_same_python_values():
    value = ([("a", 1)], {b"\x01", b"\x02"}, {"k": (1, 2)}, None, 2.5)
    assert from_plain(json.loads(json.dumps(to_plain(value)))) == value
    assert show(to_plain({"chat": 1, "doc": (2,)})) == "{'chat': 1, 'doc': (2,)}"


@pytest.mark.parametrize("degrees, significance, table", [
    (1, 0.05, 3.841), (1, 0.001, 10.828), (1, 1e-4, 15.137), (2, 0.05, 5.991), (3, 0.01, 11.345),
    (4, 0.001, 18.467), (5, 1e-4, 25.745), (10, 0.01, 23.209), (30, 0.05, 43.773), (100, 0.01, 135.807),
])
def test_chi_square_critical_values_match_the_tables(degrees, significance, table):
    assert chi_square_critical(degrees, significance) == pytest.approx(table, abs=1e-3)
    assert chi_square_survival(chi_square_critical(degrees, significance), degrees) == pytest.approx(significance)


def test_no_degrees_of_freedom_means_one_possible_outcome():
    assert chi_square_critical(0, 1e-4) == 0
    fit = goodness_of_fit(to_plain([0.0, 1.0]), to_plain([0, 500]), 1e-4)
    assert fit.passed and "the one possible outcome" in fit.text()


DRAWN = Rule(significance=1e-4)


def test_counts_of_draws_are_judged_by_a_chi_square_test():
    shares = to_plain([0.5, 0.25, 0.25, 0.0])
    assert same_value(shares, to_plain([1010, 480, 510, 0]), DRAWN)
    fit = goodness_of_fit(shares, to_plain([1200, 400, 400, 0]), 1e-4)  # 40 + 20 + 20: far above 18.42
    assert not fit.passed and fit.statistic == pytest.approx(80.0) and fit.degrees_of_freedom == 2
    assert "chi-square 80, above the critical 18.42 (2 degrees of freedom, significance 0.0001)" in fit.text()
    impossible = goodness_of_fit(shares, to_plain([1000, 500, 499, 1]), 1e-4)
    assert not impossible.passed and impossible.impossible == (3,) and "outcome 3, of probability 0" in impossible.text()
    assert not same_value(shares, to_plain([1000, 500, 499, 1]), DRAWN)


def test_anything_but_counts_fails_a_chi_square_rule_without_raising():
    shares = to_plain([0.5, 0.5])
    for junk in ([500, 500, 0], [500.0, 500], [True, 1], [-1, 3], [0, 0], {"kind": "list", "items": 7}, "ab", None):
        assert not same_value(shares, to_plain(junk), DRAWN)
        with pytest.raises(PlainDataError, match="counts of draws"):
            goodness_of_fit(shares, to_plain(junk), 1e-4)


def test_counts_of_fewer_draws_than_asked_for_never_pass():
    """A learner's process that sends counts of 1 draw (a forged caller) would pass any loose test."""
    shares, rule = to_plain([0.5, 0.5]), Rule(significance=1e-6, draws=3000)
    assert same_value(shares, to_plain([1500, 1500]), rule)
    assert not same_value(shares, to_plain([1, 0]), rule) and not same_value(shares, to_plain([1501, 1500]), rule)
    with pytest.raises(PlainDataError, match="counts of 1 draws, not of the 3000 the grader asked for"):
        goodness_of_fit(shares, to_plain([1, 0]), 1e-6, draws=3000)
