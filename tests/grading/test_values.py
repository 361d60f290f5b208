"""Results compared by value: the rules a person grading by hand would apply."""

import json
from collections import OrderedDict
from fractions import Fraction

import numpy as np
import pytest
import torch

from course_lib.grading.values import MAX_DEPTH, PlainDataError, Rule, from_plain, loads, same_value, show, to_plain


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
