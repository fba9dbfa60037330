"""The comparison rule: rtol scaled by the reference, tolerances by dtype, exact integers and strings,
and the float16 policy that packs and verifies with the defaults."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

import policyport as pp
from policyport.cli import app
from policyport.verification.compare import TOLERANCES, compare, tolerance
from policyport.graph.passes import widen_to_float64
from policyport.graph.model import from_onnx
from policyport.verification.verify import sample_inputs

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "verification"
runner = CliRunner()


def test_rtol_is_scaled_by_the_reference_not_the_candidate():
    # |a - b| = 1; atol 0, rtol 0.5: passes when scaled by |b| = 2 (limit 1), fails by |a| = 1 (limit 0.5)
    assert compare("t", "cand", np.array([1.0]), "ref", np.array([2.0]), 0.0, 0.5).passed
    assert not compare("t", "cand", np.array([2.0]), "ref", np.array([1.0]), 0.0, 0.5).passed
    c = compare("t", "cand", np.array([1.0, 10.0]), "ref", np.array([2.0, 10.0]), 0.0, 0.5)
    assert (c.max_abs, c.max_rel) == (1.0, 0.5)


def test_the_boundary_is_inclusive_and_atol_adds_to_rtol():
    # limit = atol + rtol * |b| = 0.25 + 0.5 * 1.5 = 1.0
    assert compare("t", "c", np.array([2.5]), "r", np.array([1.5]), 0.25, 0.5).passed
    assert not compare("t", "c", np.array([2.5 + 1e-9]), "r", np.array([1.5]), 0.25, 0.5).passed


@pytest.mark.parametrize("dtype, expected", [
    ("float16", (1e-3, 1e-3)), ("bfloat16", (1e-2, 1e-2)), ("float32", (1e-5, 1e-5)), ("float64", (1e-9, 1e-9)),
    ("complex64", (1e-5, 1e-5)), ("int64", (0.0, 0.0)), ("bool", (0.0, 0.0)),
])
def test_default_tolerances_follow_the_dtype(dtype, expected):
    import ml_dtypes  # noqa: F401  (bfloat16's dtype)

    assert tolerance(np.dtype(dtype)) == expected


def test_float8_tolerance_is_its_rounding_step():
    import ml_dtypes

    assert tolerance(np.dtype(ml_dtypes.float8_e4m3fn)) == (0.125, 0.125)


def test_each_comparison_uses_its_own_dtype_and_the_coarser_of_two():
    a16 = np.array([1.0005], np.float16)
    assert compare("t", "c", np.array([1.0], np.float16), "r", a16).passed  # 1 fp16 step at 1
    c = compare("t", "c", np.array([1.0], np.float32), "r", np.array([1.0 + 2e-5], np.float32))
    assert not c.passed and (c.atol, c.rtol, c.dtype) == (1e-5, 1e-5, "float32")
    c = compare("t", "c", np.array([1.0], np.float16), "r", np.array([1.0], np.float64))
    assert c.dtype == "float16" and c.atol == TOLERANCES["float16"][0]
    c = compare("t", "c", np.array([1.0], np.float64), "r", np.array([1.0 + 1e-8]))
    assert not c.passed and c.atol == 1e-9


def test_integers_compare_exactly_beyond_float64_precision():
    big = np.array([2**53 + 1, 7], np.int64)
    c = compare("t", "c", big, "r", np.array([2**53, 7], np.int64), atol=1.0, rtol=1.0)
    assert not c.passed and c.rule == "exact" and c.max_abs == 1.0 and c.detail == "1 of 2 elements differ"
    assert compare("t", "c", big, "r", big.copy()).passed
    assert not compare("t", "c", np.array([True, False]), "r", np.array([True, True])).passed


def test_strings_compare_by_equality_never_as_floats():
    a = np.array(["1.0", "nan", "left"], dtype=object)
    assert compare("t", "c", a, "r", a.copy()).passed
    c = compare("t", "c", a, "r", np.array(["1", "nan", "left"], dtype=object))
    assert not c.passed and c.detail == "1 of 3 strings differ" and c.rule == "exact"


def test_kinds_that_differ_fail():
    c = compare("t", "c", np.array([1], np.int64), "r", np.array([1.0], np.float32))
    assert not c.passed and c.detail == "dtype int64 vs float32"


# ----------------------------------------------------------------------------- the float16 policy


@pytest.fixture(scope="module")
def fp16():
    """torch Linear(8, 32) - Tanh - Linear(32, 4) in half precision (see make_fixtures.py)."""
    return onnx.load(FIXTURES / "fp16_mlp.onnx")


def test_float16_policy_verifies_with_the_default_tolerances(fp16):
    report = pp.verify(fp16, samples=64)
    assert report.passed and report.atol is None and report.tolerances() == {"float16": (1e-3, 1e-3)}
    gemm = next(c for c in report.comparisons if c.tensor == "/0/Gemm_output_0")
    assert 0 < gemm.max_abs <= 2 ** -10  # the backends differ by one float16 step
    strict = pp.verify(fp16, samples=64, atol=1e-5, rtol=1e-5, rounding=False)
    assert not strict.passed and strict.first_divergence.dtype == "float16"


def test_float16_backends_are_within_3e_4_of_float32(fp16):
    wide = pp.load(widen_to_float64(from_onnx(fp16)))
    obs = sample_inputs(pp.load(fp16).inputs, samples=64)
    truth = wide.run({"obs": obs["obs"].astype(np.float64)})["action"]
    for backend in pp.BACKENDS:
        action = pp.load(fp16, backend=backend).run(obs)["action"]
        assert action.dtype == np.float16
        assert np.abs(action.astype(np.float64) - truth).max() <= 3e-4


def test_float16_policy_packs_by_default_and_reverifies(fp16, tmp_path):
    folder = pp.pack(fp16, tmp_path / "b")
    policy = json.loads((folder / "policy.json").read_text())
    assert policy["parity"]["passed"] and policy["parity"]["tolerances"] == {"float16": {"atol": 1e-3, "rtol": 1e-3}}
    assert pp.verify_bundle(folder).passed


def test_a_float16_failure_names_the_dtype_and_the_option(fp16, tmp_path):
    onnx.save(fp16, tmp_path / "m.onnx")
    result = runner.invoke(app, ["pack", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "b"), "--atol", "1e-6",
                                 "--rtol", "0"])
    assert result.exit_code == 0  # one float16 step apart, as far from float64: rounding
    rounding = json.loads((tmp_path / "b" / "policy.json").read_text())["parity"]["rounding"]
    assert rounding and all(r["candidate_vs_float64"] > 0 and r["reference_vs_float64"] > 0 for r in rounding)
    result = runner.invoke(app, ["pack", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "c"), "--atol", "1e-6",
                                 "--rtol", "0", "--no-rounding"])
    assert result.exit_code == 1
    assert "(float16, onnxruntime vs numpy)" in result.stderr and "pack with --atol/--rtol" in result.stderr
    assert not (tmp_path / "c").exists()
    result = runner.invoke(app, ["pack", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "c"), "--atol", "2e-3",
                                 "--no-rounding"])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "c" / "policy.json").read_text())["parity"]["atol"] == 2e-3
    result = runner.invoke(app, ["verify", str(tmp_path / "m.onnx"), "--samples", "64", "--atol", "1e-6", "--rtol", "0",
                                 "--no-rounding"])
    assert result.exit_code == 1
    assert "(float16, onnxruntime vs numpy)" in result.stdout and "loosen them with --atol/--rtol" in result.stdout
    result = runner.invoke(app, ["verify", str(tmp_path / "m.onnx"), "--samples", "64"])
    assert result.exit_code == 0 and "float16: atol 0.001, rtol 0.001" in result.stdout


def test_convert_of_float16_weights_checks_with_float16_tolerances(tmp_path):
    rng = np.random.default_rng(0)
    weights = {"fc_1/kernel": rng.standard_normal((8, 32)).astype(np.float16),
               "fc_1/bias": rng.standard_normal(32).astype(np.float16),
               "fc_out/kernel": rng.standard_normal((32, 4)).astype(np.float16),
               "fc_out/bias": np.zeros(4, np.float16)}
    np.savez(tmp_path / "w.npz", **weights)
    result = runner.invoke(app, ["convert", str(tmp_path / "w.npz"), "-o", str(tmp_path / "m.onnx"), "--activation",
                                 "tanh", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)["verification"]
    assert report["passed"] and report["tolerances"] == {"float16": {"atol": 1e-3, "rtol": 1e-3}}
    assert {c["dtype"] for c in report["comparisons"]} == {"float16"}
