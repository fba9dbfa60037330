"""verify: per-tensor figures, the first diverging tensor, tolerances, the comparison rule."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import policyport as pp
from policyport.verification.verify import compare, sample_inputs


def test_metadrive_passes_with_source_and_reports_every_tensor(metadrive_model, metadrive_path, metadrive_obs):
    report = pp.verify(metadrive_model, metadrive_obs, source=metadrive_path)
    assert report.passed and report.first_divergence is None and report.samples == 1000
    pairs = {(c.tensor, c.candidate, c.reference) for c in report.comparisons}
    for t in ["fc_1/linear", "fc_1/tanh", "fc_2/linear", "fc_2/tanh", "logits", "action", "log_std"]:
        assert {(t, "onnxruntime", "numpy"), (t, "numpy", "source"), (t, "onnxruntime", "source")} <= pairs
    assert 0 < report.worst() <= 1e-5
    assert report.worst("source") <= 1e-5
    doc = report.to_dict()
    assert doc["passed"] is True and len(doc["comparisons"]) == 21


def perturbed(model, name, index, delta):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    init = next(i for i in m.graph.initializer if i.name == name)
    arr = onnx.numpy_helper.to_array(init).copy()
    arr[index] += delta
    init.CopyFrom(onnx.numpy_helper.from_array(arr, name))
    return m


def test_a_changed_weight_fails_at_the_first_tensor_it_touches(metadrive_model, metadrive_path):
    bad = perturbed(metadrive_model, "default_policy/fc_2/bias", 3, 1e-3)
    report = pp.verify(bad, source=metadrive_path, samples=50)
    assert not report.passed
    first = report.first_divergence
    assert (first.tensor, first.reference) == ("fc_2/linear", "source")
    assert first.max_abs == pytest.approx(1e-3, rel=1e-2)
    assert all(c.passed for c in report.comparisons if c.tensor.startswith("fc_1"))


def test_tolerances_decide(metadrive_model):
    obs = sample_inputs(pp.load(metadrive_model).inputs, samples=200, seed=3)
    assert pp.verify(metadrive_model, obs).passed
    strict = pp.verify(metadrive_model, obs, atol=0.0, rtol=0.0, rounding=False)
    assert not strict.passed  # numpy and onnxruntime accumulate in different orders
    assert strict.first_divergence.candidate == "onnxruntime"
    rounded = pp.verify(metadrive_model, obs, atol=0.0, rtol=0.0)  # the same differences are float32 rounding
    assert rounded.passed and rounded.oracle == "numpy float64"
    by_rounding = [c for c in rounded.comparisons if c.rule == "rounding"]
    assert {c.tensor for c in by_rounding} == {c.tensor for c in strict.comparisons if not c.passed}
    for c in by_rounding:
        assert 0 < c.max_abs <= c.rounding_bound
        assert c.rounding_bound >= 8 * min(c.candidate_vs_float64, c.reference_vs_float64)


def test_sample_inputs_respects_range_seed_and_dtype(metadrive_model):
    inputs = pp.load(metadrive_model).inputs
    a = sample_inputs(inputs, samples=10, low=-3, high=-2, seed=7)["obs"]
    assert a.shape == (10, 275) and a.dtype == np.float32 and a.min() >= -3 and a.max() < -2
    np.testing.assert_array_equal(a, sample_inputs(inputs, samples=10, low=-3, high=-2, seed=7)["obs"])
    with pytest.raises(pp.InputMismatchError):
        sample_inputs(inputs, samples=10, low=1, high=1)


@pytest.mark.parametrize("a, b, atol, rtol, passed, max_abs", [
    ([1.0, 2.0], [1.0, 2.0], 0, 0, True, 0.0),
    ([1.0, 2.1], [1.0, 2.0], 0.05, 0, False, 0.1),
    ([1.0, 2.1], [1.0, 2.0], 0.0, 0.06, True, 0.1),
    ([np.nan, 1.0], [np.nan, 1.0], 0, 0, True, 0.0),
    ([np.nan, 1.0], [0.0, 1.0], 1, 1, False, np.inf),
    ([np.inf, 1.0], [np.inf, 1.0], 0, 0, True, 0.0),
    ([np.inf, 1.0], [1e30, 1.0], 1, 1, False, np.inf),
])
def test_compare_rule(a, b, atol, rtol, passed, max_abs):
    c = compare("t", "x", np.array(a), "y", np.array(b), atol, rtol)
    assert c.passed is passed
    assert c.max_abs == pytest.approx(max_abs)


def test_compare_shape_mismatch_fails():
    assert not compare("t", "x", np.zeros((2, 3)), "y", np.zeros((3, 2)), 1, 1).passed


def test_verify_needs_something_to_compare(metadrive_model, metadrive_obs):
    with pytest.raises(pp.InputMismatchError, match="nothing to compare"):
        pp.verify(metadrive_model, metadrive_obs[:4], backends=("numpy",))
    with pytest.raises(pp.InputMismatchError, match="0 rows"):
        pp.verify(metadrive_model, metadrive_obs[:0])


def test_a_shape_mismatch_is_described():
    c = compare("t", "x", np.zeros((2, 3)), "y", np.zeros((2, 4)), 1, 1)
    assert not c.passed and c.detail == "shape (2, 3) vs (2, 4)"
