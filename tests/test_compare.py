"""policyport.verification.compare element by element: every branch of the rule with the value it must give
(rounding steps, the coarser dtype, NaN and infinity patterns, max_rel, the rounding bound, the
exact comparisons and the report's JSON)."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from policyport.verification.compare import (
    ROUNDING_FACTOR,
    Comparison,
    Report,
    Skipped,
    coarser,
    compare,
    is_floating,
    rounding_check,
    rounding_step,
    tolerance,
)


@pytest.mark.parametrize("dtype,step", [
    (np.float16, 2.0**-10), (np.float32, 2.0**-23), (np.float64, 2.0**-52),
    (np.complex64, 2.0**-23), (np.complex128, 2.0**-52), (ml_dtypes.bfloat16, 2.0**-7),
    (ml_dtypes.float8_e4m3fn, 2.0**-3),
])
def test_rounding_step_is_the_machine_epsilon_of_the_dtype_or_of_a_complex_part(dtype, step):
    assert rounding_step(np.dtype(dtype)) == step
    assert rounding_step(dtype) == step  # a type, not only a dtype


@pytest.mark.parametrize("a,b,coarse", [
    (np.float16, np.float64, np.float16), (np.float64, np.float16, np.float16),
    (np.float32, np.float64, np.float32), (np.float64, np.float32, np.float32),
    (np.float32, np.float32, np.float32), (ml_dtypes.bfloat16, np.float16, ml_dtypes.bfloat16),
    (np.float16, ml_dtypes.bfloat16, ml_dtypes.bfloat16), (np.complex64, np.float64, np.complex64),
    (np.float64, np.complex128, np.float64), (ml_dtypes.float8_e4m3fn, np.float32, ml_dtypes.float8_e4m3fn),
])
def test_coarser_is_the_dtype_with_fewer_significant_bits_in_either_order(a, b, coarse):
    assert np.dtype(coarser(np.dtype(a), np.dtype(b))) == np.dtype(coarse)


def test_coarser_puts_dtypes_it_does_not_rank_last():
    assert coarser(np.dtype(np.int32), np.dtype(np.float32)) == np.dtype(np.float32)
    assert coarser(np.dtype(np.float32), np.dtype(np.int32)) == np.dtype(np.float32)


@pytest.mark.parametrize("dtype,floating", [
    (np.float32, True), (np.complex64, True), (ml_dtypes.bfloat16, True), (ml_dtypes.float8_e5m2, True),
    (ml_dtypes.int4, False), (np.int8, False), (np.bool_, False), (object, False), (np.str_, False),
])
def test_is_floating(dtype, floating):
    assert is_floating(np.dtype(dtype)) is floating


@pytest.mark.parametrize("dtype,expected", [
    (np.complex128, (1e-9, 1e-9)), (np.uint8, (0.0, 0.0)), (ml_dtypes.int4, (0.0, 0.0)),
    (ml_dtypes.float8_e5m2, (0.25, 0.25)), (np.str_, (0.0, 0.0)),
])
def test_tolerance_of_other_kinds(dtype, expected):
    assert tolerance(np.dtype(dtype)) == expected


# ------------------------------------------------------------------------------------ compare: floats


def test_a_shape_mismatch_fails_with_infinite_errors_and_names_both_shapes():
    c = compare("t", "cand", np.zeros((2, 3), np.float32), "ref", np.zeros((3, 2), np.float32))
    assert c == Comparison("t", "cand", "ref", (2, 3), "float32", float("inf"), float("inf"), False,
                           "shape (2, 3) vs (3, 2)")


def test_kinds_that_differ_name_both_dtypes():
    c = compare("t", "c", np.array(["x"]), "r", np.array([1.0]))
    assert not c.passed and c.detail == "dtype <U1 vs float64".replace("<U1", np.array(["x"]).dtype.name)
    assert c.max_abs == float("inf") and c.max_rel == float("inf") and c.dtype == np.array(["x"]).dtype.name


def test_empty_float_tensors_pass_with_the_tolerance_of_their_dtype():
    c = compare("t", "c", np.zeros((0, 4), np.float16), "r", np.zeros((0, 4), np.float16))
    assert c == Comparison("t", "c", "r", (0, 4), "float16", 0.0, 0.0, True, atol=1e-3, rtol=1e-3)


def test_nan_patterns_must_match_and_the_detail_counts_each_side():
    a = np.array([np.nan, np.nan, np.nan, 1.0, 2.0], np.float32)
    b = np.array([np.nan, 0.0, 1.0, np.nan, 3.0], np.float32)
    c = compare("t", "cand", a, "ref", b)
    assert not c.passed and c.detail == "NaN in 2 places of cand only, 1 of ref only"
    c = compare("t", "cand", np.array([np.nan, np.nan, 1.0, 2.0]), "ref", np.array([np.nan, np.nan, np.nan, 2.0]))
    assert c.detail == "NaN in 0 places of cand only, 1 of ref only"
    same = compare("t", "cand", np.array([np.nan, 1.0]), "ref", np.array([np.nan, 1.0]))
    assert same.passed and same.max_abs == 0.0 and same.max_rel == 0.0


def test_infinities_match_only_the_same_infinity():
    inf = np.inf
    assert compare("t", "c", np.array([inf, -inf, 1.0]), "r", np.array([inf, -inf, 1.0])).passed
    c = compare("t", "c", np.array([inf, 1.0]), "r", np.array([-inf, 1.0]))
    assert not c.passed and c.max_abs == inf
    c = compare("t", "c", np.array([1.0, 2.0]), "r", np.array([inf, 2.0]))
    assert not c.passed and c.max_abs == inf and c.max_rel == 0.0  # an infinite reference scales nothing
    c = compare("t", "c", np.array([inf, 2.0]), "r", np.array([1.0, 2.0]))
    assert not c.passed and c.max_abs == inf and c.max_rel == inf


def test_max_abs_and_max_rel_over_the_elements_with_a_nonzero_reference():
    a = np.array([0.5, 4.0, -3.0], np.float64)
    b = np.array([0.0, 2.0, -4.0], np.float64)
    c = compare("t", "c", a, "r", b, atol=0.0, rtol=0.0)
    assert (c.max_abs, c.max_rel, c.passed) == (2.0, 1.0, False)  # |0.5 - 0| has no relative error
    assert compare("t", "c", np.array([3.0]), "r", np.array([0.0]), atol=0.0, rtol=0.0).max_rel == 0.0


def test_given_tolerances_replace_the_dtype_defaults_and_are_reported():
    a, b = np.array([1.0, 2.0], np.float32), np.array([1.0, 2.5], np.float32)
    assert not compare("t", "c", a, "r", b).passed
    c = compare("t", "c", a, "r", b, atol=0.5, rtol=0.0)
    assert c.passed and (c.atol, c.rtol) == (0.5, 0.0)
    c = compare("t", "c", a, "r", b, atol=0.0, rtol=0.2)  # 0.5 <= 0.2 * 2.5
    assert c.passed and (c.atol, c.rtol) == (0.0, 0.2)
    c = compare("t", "c", a, "r", b, atol=0.0, rtol=0.19)
    assert not c.passed


def test_the_coarser_dtype_of_candidate_and_reference_sets_the_tolerance_either_way():
    c = compare("t", "c", np.array([1.0]), "r", np.array([1.0 + 2e-6], np.float32))
    assert c.dtype == "float32" and (c.atol, c.rtol) == (1e-5, 1e-5) and c.passed
    c = compare("t", "c", np.array([1.0], np.float32), "r", np.array([1.0 + 2e-6]))
    assert c.dtype == "float32" and c.passed


def test_comparisons_raise_no_floating_point_warnings():
    import warnings

    inf = np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not compare("t", "c", np.array([inf, 1e308, 1.0]), "r", np.array([-inf, -1e308, inf])).passed
        assert compare("t", "c", np.array([inf, -inf]), "r", np.array([inf, -inf])).passed
        c = compare("t", "c", np.array([1e-300, 1.0]), "r", np.array([1e-310, 1.0]), atol=0.0, rtol=0.0)
        assert not c.passed and c.max_rel > 1e9
        c = compare("t", "c", np.array([1e300]), "r", np.array([1e-10]))  # |diff| / |ref| overflows to inf
        assert not c.passed and c.max_rel == inf


def test_complex_tensors_compare_the_modulus_of_the_difference():
    a = np.array([1 + 1j], np.complex64)
    c = compare("t", "c", a, "r", np.array([1 + 1j + 3e-6 + 4e-6j], np.complex64))
    assert c.dtype == "complex64" and c.max_abs == pytest.approx(5e-6, rel=1e-2) and c.passed


# ------------------------------------------------------------------------------------ the rounding rule


def test_the_rounding_bound_is_factor_times_the_more_accurate_sides_error():
    oracle = np.array([100.0, 0.0, -100.0])
    a = oracle + np.array([3e-4, 0.0, 0.0])  # E_a = 3e-4
    b = oracle + np.array([-1e-4, 0.0, 0.0])  # E_b = 1e-4
    bound, e_a, e_b = rounding_check(a, b, oracle, np.dtype(np.float32))
    assert (e_a, e_b) == (pytest.approx(3e-4), pytest.approx(1e-4))
    assert bound == pytest.approx(ROUNDING_FACTOR * 1e-4)


def test_the_rounding_bound_has_a_floor_of_a_rounding_step_of_the_largest_value():
    oracle = np.array([2.0**20, 1.0])
    bound, e_a, e_b = rounding_check(oracle.copy(), oracle.copy(), oracle, np.dtype(np.float32))
    assert (e_a, e_b) == (0.0, 0.0) and bound == ROUNDING_FACTOR * 2.0**-23 * 2.0**20
    bound16, _, _ = rounding_check(oracle.copy(), oracle.copy(), oracle, np.dtype(np.float16))
    assert bound16 == ROUNDING_FACTOR * 2.0**-10 * 2.0**20


def test_the_rounding_check_uses_only_elements_finite_in_all_three():
    oracle = np.array([1.0, np.inf, 5.0])
    a = np.array([1.5, 7.0, 5.0])
    b = np.array([1.0, np.nan, 5.25])
    bound, e_a, e_b = rounding_check(a, b, oracle, np.dtype(np.float64))
    assert (e_a, e_b) == (0.5, 0.25) and bound == ROUNDING_FACTOR * 0.25
    assert rounding_check(np.array([np.nan]), np.array([1.0]), np.array([1.0]), np.dtype(np.float32)) is None


def test_compare_passes_by_rounding_and_reports_both_float64_errors():
    oracle = np.array([1000.0, 0.0], np.float64)
    a = np.array([1000.0, 3e-5], np.float32)  # |a - b| = 5e-5 > 1e-5 + 1e-5 * |b|
    b = np.array([1000.0, -2e-5], np.float32)
    c = compare("scores", "onnxruntime", a, "numpy", b, oracle=oracle)
    assert c.passed and c.rule == "rounding"
    assert c.candidate_vs_float64 == pytest.approx(3e-5) and c.reference_vs_float64 == pytest.approx(2e-5)
    assert c.rounding_bound == pytest.approx(ROUNDING_FACTOR * max(2e-5, 2.0**-23 * 1000.0))
    assert c.max_abs == pytest.approx(5e-5) and (c.atol, c.rtol) == (1e-5, 1e-5)


def test_a_difference_equal_to_the_rounding_bound_passes():
    # E_a = 0.4375, E_b = 0.0625: bound 8 * 0.0625 = 0.5, exactly |a - b|
    c = compare("t", "cand", np.array([0.5]), "ref", np.array([0.0]), atol=0.0, rtol=0.0, oracle=np.array([0.0625]))
    assert (c.tensor, c.candidate, c.reference, c.shape, c.dtype) == ("t", "cand", "ref", (1,), "float64")
    assert c.rule == "rounding" and c.rounding_bound == 0.5 and c.max_abs == 0.5 and c.passed
    assert (c.candidate_vs_float64, c.reference_vs_float64, c.max_rel) == (0.4375, 0.0625, 0.0)
    assert not compare("t", "c", np.array([0.5 + 1e-12]), "r", np.array([0.0]), atol=0.0, rtol=0.0,
                       oracle=np.array([0.0625])).passed


def test_compare_fails_by_rounding_when_one_side_moved_away():
    oracle = np.array([1.0, 0.0])
    a = np.array([1.0, 1e-2], np.float32)  # a real difference: one side is 1e-2 off, the other exact
    b = np.array([1.0, 0.0], np.float32)
    c = compare("t", "c", a, "r", b, oracle=oracle)
    assert not c.passed and c.rule == "rounding" and c.reference_vs_float64 == 0.0
    assert c.rounding_bound == ROUNDING_FACTOR * 2.0**-23


def test_a_complex_tensor_is_judged_by_rounding_against_the_whole_complex_oracle():
    oracle = np.array([1e4j, 1e-3j], np.complex128)
    b = oracle.astype(np.complex64)
    moved = np.array([1e4j, 5j], np.complex64)  # a real difference in the imaginary parts
    c = compare("z", "onnxruntime", moved, "numpy", b, oracle=oracle)
    assert not c.passed and c.rule == "rounding" and c.dtype == "complex64"
    assert c.candidate_vs_float64 == pytest.approx(5 - 1e-3, rel=1e-6) and c.reference_vs_float64 < 1e-9
    rounded = np.array([1e4j, 2e-3j], np.complex64)  # 1e-3 apart, within rounding of |1e4j|
    c = compare("z", "onnxruntime", rounded, "numpy", b, oracle=oracle)
    assert c.passed and c.rule == "rounding"
    assert c.rounding_bound == pytest.approx(ROUNDING_FACTOR * 2.0**-23 * 1e4, rel=1e-3)


def test_the_oracle_is_ignored_when_the_tolerance_passes_or_its_shape_differs():
    a, b = np.array([1.0, 2.0], np.float32), np.array([1.0, 2.5], np.float32)
    assert compare("t", "c", a, "r", a.copy(), oracle=np.zeros(2)).rule == "tolerance"
    c = compare("t", "c", a, "r", b, oracle=np.array([1.0, 2.25, 0.0]))
    assert c.rule == "tolerance" and not c.passed
    c = compare("t", "c", a, "r", b, oracle=np.array([np.nan, np.nan]))  # nothing finite: no rounding verdict
    assert c.rule == "tolerance" and not c.passed


# ------------------------------------------------------------------------------------ exact kinds


def test_integers_report_the_largest_gap_and_relative_gap():
    a = np.array([5, 0, 7, -2], np.int32)
    b = np.array([3, 4, 7, 0], np.int32)
    c = compare("t", "c", a, "r", b)
    assert c == Comparison("t", "c", "r", (4,), "int32", 4.0, 1.0, False, "3 of 4 elements differ", rule="exact")
    c = compare("t", "c", np.array([1, 2], np.uint8), "r", np.array([0, 2], np.uint8))
    assert (c.max_abs, c.max_rel) == (1.0, 0.0)  # the only difference has a zero reference
    c = compare("t", "c", np.array([7], np.int8), "r", np.array([9], np.int8))
    assert (c.passed, c.max_abs, c.detail) == (False, 2.0, "1 of 1 elements differ")


def test_int64_gaps_are_exact_beyond_float64_precision():
    big = 2**62
    c = compare("t", "c", np.array([big, 3], np.int64), "r", np.array([big + 1, 3], np.int64))  # float64 rounds big + 1
    assert (c.passed, c.max_abs, c.max_rel) == (False, 1.0, 1 / (big + 1))


def test_equal_and_empty_integer_tensors_pass_exactly():
    for a in (np.array([[1, 2]], np.int64), np.zeros((0, 2), np.int64), np.array([True, False])):
        c = compare("t", "c", a, "r", a.copy())
        assert c == Comparison("t", "c", "r", a.shape, a.dtype.name, 0.0, 0.0, True, rule="exact")


def test_ml_dtypes_integers_compare_as_int64():
    a = np.array([1, -3, 7], ml_dtypes.int4)
    c = compare("t", "c", a, "r", np.array([1, 2, 7], ml_dtypes.int4))
    assert not c.passed and c.max_abs == 5.0 and c.dtype == "int64" and c.detail == "1 of 3 elements differ"


def test_strings_and_bytes_compare_by_equality():
    a = np.array(["a", "b"])
    assert compare("t", "c", a, "r", a.copy()) == Comparison("t", "c", "r", (2,), a.dtype.name, 0.0, 0.0, True,
                                                              "", rule="exact")
    c = compare("t", "c", np.array([b"x", b"y"]), "r", np.array([b"x", b"z"]))
    assert (c.passed, c.max_abs, c.max_rel, c.detail) == (False, 1.0, 1.0, "1 of 2 strings differ")
    c = compare("t", "c", np.array(["red", "blue", "go"]), "r", np.array(["red", "bluer", "stop"]))
    assert (c.passed, c.max_abs, c.dtype, c.detail) == (False, 1.0, "str128", "2 of 3 strings differ")


# ------------------------------------------------------------------------------------ the report


def _report() -> Report:
    ok = Comparison("a", "onnxruntime", "numpy", (2, 3), "float32", 1e-6, 1e-6, True, atol=1e-5, rtol=1e-5)
    exact = Comparison("i", "onnxruntime", "numpy", (2,), "int64", 0.0, 0.0, True, rule="exact")
    half = Comparison("h", "numpy", "source", (2,), "float16", 2e-3, 0.5, False, atol=1e-3, rtol=1e-3)
    bad = Comparison("b", "onnxruntime", "source", (2,), "float32", float("inf"), float("nan"), False, "NaN in 1 places")
    return Report(["numpy", "onnxruntime"], "source", 2, None, None, [ok, exact, half, bad],
                  [Skipped("noise", "depends on RandomNormal node 'r'")], ["2 observations"], "float64 run")


def test_report_verdict_first_divergence_worst_and_tolerances():
    report = _report()
    assert not report.passed and report.first_divergence.tensor == "h"
    assert report.worst() == float("inf") and report.worst("numpy") == 1e-6 and report.worst("source") == float("inf")
    assert report.worst("nobody") == 0.0
    assert report.tolerances() == {"float32": (1e-5, 1e-5), "float16": (1e-3, 1e-3)}
    assert list(report.tolerances()) == ["float32", "float16"]
    assert Report(["numpy"], None, 1, None, None).passed and Report(["numpy"], None, 1, None, None).first_divergence is None


def test_report_to_dict_is_json_with_non_finite_figures_as_strings():
    doc = json.loads(json.dumps(_report().to_dict()))
    assert doc["passed"] is False and doc["backends"] == ["numpy", "onnxruntime"] and doc["source"] == "source"
    assert (doc["samples"], doc["atol"], doc["rtol"], doc["oracle"]) == (2, None, None, "float64 run")
    assert doc["tolerances"] == {"float32": {"atol": 1e-5, "rtol": 1e-5}, "float16": {"atol": 1e-3, "rtol": 1e-3}}
    assert doc["first_divergence"]["tensor"] == "h" and doc["first_divergence"]["shape"] == [2]
    assert [c["tensor"] for c in doc["comparisons"]] == ["a", "i", "h", "b"]
    assert doc["comparisons"][0]["shape"] == [2, 3] and doc["comparisons"][0]["max_abs"] == 1e-6
    assert doc["comparisons"][3]["max_abs"] == "inf" and doc["comparisons"][3]["max_rel"] == "nan"
    assert doc["comparisons"][2]["rule"] == "tolerance" and doc["comparisons"][1]["rule"] == "exact"
    assert doc["skipped"] == [{"tensor": "noise", "reason": "depends on RandomNormal node 'r'"}]
    assert doc["notes"] == ["2 observations"]
    direct = _report().to_dict()["comparisons"][0]
    assert isinstance(direct["shape"], list) and set(direct) == {
        "tensor", "candidate", "reference", "shape", "dtype", "max_abs", "max_rel", "passed", "detail", "atol",
        "rtol", "rule", "candidate_vs_float64", "reference_vs_float64", "rounding_bound"}
    passing = Report(["numpy"], None, 1, 1e-3, 1e-4, [_report().comparisons[0]]).to_dict()
    assert passing["passed"] is True and passing["first_divergence"] is None and (passing["atol"], passing["rtol"]) == (1e-3, 1e-4)
