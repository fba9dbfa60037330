"""Values read from a file's fields: the form the converter uses, or a BadModelError naming the field."""

from __future__ import annotations

import numpy as np
import pytest

import policyport as pp
from policyport.converter.fields import number_array, real_number, shape, whole_number


@pytest.mark.parametrize("value, kwargs, expected", [
    (3, {}, 3), (np.int64(3), {}, 3), (3.0, {}, 3), ("5", {"text": True}, 5), (" -2 ", {"text": True, "minimum": None}, -2),
])
def test_whole_numbers_as_writers_write_them(value, kwargs, expected):
    got = whole_number(value, "f", **kwargs)
    assert got == expected and type(got) is int


@pytest.mark.parametrize("value, kwargs, message", [
    (True, {}, "f is True, not a whole number"),
    ("5", {}, "f is '5', not a whole number"),
    ("²", {"text": True}, "f is '²', not a whole number"),
    (2.5, {}, "f is 2.5, not a whole number"),
    (float("nan"), {}, "f is nan, not a whole number"),
    (np.float32(np.inf), {}, "f is inf, not a whole number"),
    ([2], {}, "f is [2], not a whole number"),
    (0, {"minimum": 1}, "f is 0; it must be at least 1"),
])
def test_what_is_not_a_whole_number_is_refused(value, kwargs, message):
    with pytest.raises(pp.BadModelError, match="^" + message.replace("[", r"\[").replace("]", r"\]") + "$"):
        whole_number(value, "f", **kwargs)


def test_real_numbers():
    assert real_number(np.array([2.5], np.float32), "f") == 2.5
    assert real_number(float("inf"), "f", finite=False) == float("inf")
    for value, message in [(False, "f is False, not a number"), ("1", "f is '1', not a number"),
                           (float("nan"), "f is nan; it must be a finite number"),
                           (10**400, "f is 1" + "0" * 56 + "..., too large for a number policyport computes with")]:
        with pytest.raises(pp.BadModelError) as caught:
            real_number(value, "f")
        assert str(caught.value) == message


def test_number_arrays():
    assert number_array([[1, 2], [3, 4]], "f").tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert number_array(np.array([1, 2], np.int8), "f").dtype == np.float64
    assert np.isnan(number_array([np.nan], "f", nan=True)).all()
    for value, message in [([[1], [2, 3]], "f is [[1], [2, 3]], not an array of numbers"),
                           ([1, True], "f is [1, True], not numbers"), ([None], "f is [None], not numbers"),
                           (np.array([1j]), "f is an array of complex numbers (complex128), not of real numbers"),
                           ([np.nan], "f holds NaN")]:
        with pytest.raises(pp.BadModelError) as caught:
            number_array(value, "f")
        assert str(caught.value) == message


def test_shapes():
    assert shape([2, 3], "f") == (2, 3) and shape(np.array([4]), "f") == (4,)
    for value, message in [("2,3", "f is '2,3', not a list of dimensions"), ([2, -1], "f[1] is -1; it must be at least 0"),
                           ([2, "3"], "f[1] is '3', not a whole number")]:
        with pytest.raises(pp.BadModelError) as caught:
            shape(value, "f")
        assert str(caught.value) == message
