"""Statistics of a recording: equal to a direct float64 numpy computation, however the rows are split."""

from __future__ import annotations

import json

import numpy as np
import pytest

import policyport as pp
from policyport.analysis import record_dataset, statistics
from policyport.analysis.moments import Moments
from policyport.analysis.statistics import nonfinite_rows


@pytest.fixture(scope="module", params=["npz", "parquet"])
def recording(request, tmp_path_factory, metadrive_onnx, dataset):
    out = tmp_path_factory.mktemp("rec") / f"rec.{request.param}"
    record_dataset(metadrive_onnx, dataset[0], out, batch_size=1000)
    return out


def direct(x: np.ndarray) -> dict:
    x = x.reshape(len(x), -1).astype(np.float64)
    return {"mean": x.mean(0), "std": x.std(0), "min": x.min(0), "max": x.max(0), "active": (x > 0).mean(0)}


def test_statistics_equal_a_direct_float64_computation(recording):
    stats = statistics(recording, batch_size=777)
    with_values = pp.analysis.open_recording(recording).head(3000)
    assert stats.rows == 3000 and [s.name for s in stats.tensors] == list(with_values)
    for s in stats.tensors:
        x = with_values[s.name]
        ref = direct(x)
        m = s.moments
        np.testing.assert_allclose(m.mean, ref["mean"], rtol=1e-6, atol=1e-12, err_msg=s.name)
        np.testing.assert_allclose(m.std, ref["std"], rtol=1e-6, err_msg=s.name)
        np.testing.assert_array_equal(m.minimum, ref["min"])
        np.testing.assert_array_equal(m.maximum, ref["max"])
        np.testing.assert_allclose(m.active / m.count, ref["active"], rtol=1e-12)
        layer = s.layer()
        flat = x.astype(np.float64).reshape(-1)
        assert layer["mean"] == pytest.approx(flat.mean(), rel=1e-6) and layer["std"] == pytest.approx(flat.std(), rel=1e-6)
        assert layer["values"] == flat.size and layer["nan"] == layer["inf"] == 0
        if s.op_type == "Tanh":
            np.testing.assert_allclose(m.saturated / m.count, (np.abs(x) > 0.99).mean(0), rtol=1e-12)
            assert layer["saturated_fraction"] == pytest.approx((np.abs(flat) > 0.99).mean(), rel=1e-12)
        else:
            assert layer["saturated_fraction"] is None


def test_the_split_into_blocks_does_not_matter(recording):
    coarse, fine = statistics(recording, batch_size=5000), statistics(recording, batch_size=7)
    for a, b in zip(coarse.tensors, fine.tensors):
        for field in ("count", "nan", "inf", "active", "saturated", "minimum", "maximum"):
            np.testing.assert_array_equal(getattr(a.moments, field), getattr(b.moments, field))
        np.testing.assert_allclose(a.moments.mean, b.moments.mean, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(a.moments.std, b.moments.std, rtol=1e-10)


def test_running_moments_are_stable_far_from_zero():
    """A naive sum of squares loses every digit here; the pairwise update keeps them."""
    rng = np.random.default_rng(3)
    x = 1e8 + rng.standard_normal((20000, 3))
    m = Moments.empty(3)
    for i in range(0, len(x), 999):
        m.update(x[i:i + 999])
    np.testing.assert_allclose(m.std, x.std(0), rtol=1e-6)
    np.testing.assert_allclose(m.mean, x.mean(0), rtol=1e-14)


def test_moments_merge_and_travel_as_plain_arrays():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((500, 6)).astype(np.float32)
    whole = Moments.of_block(x, "Tanh")
    parts = Moments.empty(6, "Tanh")
    for chunk in np.array_split(x, [3, 4, 250, 250, 499]):
        parts.merge(Moments.from_state(Moments.of_block(chunk, "Tanh").to_state()))
    np.testing.assert_allclose(parts.mean, whole.mean, rtol=1e-12)
    np.testing.assert_allclose(parts.m2, whole.m2, rtol=1e-12)
    assert parts.rows == 500 and (parts.count == 500).all() and parts.saturation == "Tanh"


def test_nan_and_inf_are_counted_apart_from_the_moments(tmp_path):
    x = np.random.default_rng(9).standard_normal((400, 5)).astype(np.float32)
    x[3, 0], x[10, 0], x[20, 1], x[21, 1] = np.nan, np.inf, -np.inf, np.nan
    x[:, 4] = np.nan  # a neuron with no finite value at all
    np.savez(tmp_path / "acts.npz", h=x)  # a plain .npz, as 'policyport run --record' writes
    s = statistics(tmp_path / "acts.npz", batch_size=64)["h"]
    m = s.moments
    assert s.op_type is None
    assert m.nan.tolist() == [1, 1, 0, 0, 400] and m.inf.tolist() == [1, 1, 0, 0, 0]
    assert m.count.tolist() == [398, 398, 400, 400, 0]
    finite = np.ma.masked_invalid(x[:, :4].astype(np.float64))
    np.testing.assert_allclose(m.mean[:4], finite.mean(0), rtol=1e-6)
    np.testing.assert_allclose(m.std[:4], finite.std(0), rtol=1e-6)
    np.testing.assert_array_equal(m.minimum[:4], finite.min(0))
    doc = s.to_dict()
    assert doc["per_neuron"]["mean"][4] is None and doc["layer"]["nan"] == 402 and doc["layer"]["inf"] == 2
    json.dumps(doc, allow_nan=False)  # valid JSON: no NaN anywhere


def dense_model(op: str):
    """obs (4) -> Gemm "fc/linear" (5 units; bias -100 on unit 2, +100 on unit 3) -> op "fc/act"."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["obs", "W", "b"], ["fc/linear"]), helper.make_node(op, ["fc/linear"], ["fc/act"])],
        "g", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("fc/act", TensorProto.FLOAT, ["batch", 5])],
        [numpy_helper.from_array(rng.uniform(-0.1, 0.1, (4, 5)).astype(np.float32), "W"),
         numpy_helper.from_array(np.array([0, 0.1, -100, 100, -0.1], np.float32), "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("op, dead, saturated", [
    ("Relu", [2], None),  # never > 0
    ("LeakyRelu", [2], None),
    ("Tanh", [], [2, 3]),  # stuck at -1 and +1: saturated, not listed as dead
    ("Sigmoid", [], [2, 3]),  # stuck near 0 and at 1
    ("Neg", [], None),  # nothing constant
])
def test_dead_and_always_saturated_neurons(tmp_path, op, dead, saturated):
    np.save(tmp_path / "obs.npy", np.random.default_rng(1).uniform(-1, 1, (300, 4)).astype(np.float32))
    record_dataset(dense_model(op), tmp_path / "obs.npy", tmp_path / "rec.npz", batch_size=128)
    stats = statistics(tmp_path / "rec.npz")
    s = stats["fc/act"]
    assert s.op_type == op and s.dead == dead
    assert s.to_dict()["always_saturated"] == saturated
    assert stats["fc/linear"].dead == []


def test_a_constant_neuron_is_dead():
    s = pp.analysis.TensorStats("h", "Tanh", (3,), Moments.of_block(np.array([[0.5, 0.2, 1.0], [0.5, 0.3, 1.0]]), "Tanh"))
    assert s.dead == [0] and s.always_saturated == [2]


def test_nonfinite_rows_counts_rows_not_values():
    x = np.zeros((6, 2, 2), np.float32)
    x[1, 0, 0] = x[1, 1, 1] = np.nan
    x[4, 1, 0] = -np.inf
    assert nonfinite_rows(x) == 2 and nonfinite_rows(np.zeros((3, 2), np.int64)) == 0


def test_unknown_tensor_patterns_are_refused(recording):
    with pytest.raises(pp.InputMismatchError, match="match no tensor of the recording; it has"):
        statistics(recording, "fc_9/*")



@pytest.mark.parametrize("observations", [600, 3, 2])
def test_a_run_record_of_an_sb3_box_policy_gets_statistics_of_its_tensors_with_rows(tmp_path, pendulum_onnx, observations,
                                                                                   pendulum_constants):
    """What ``policyport run --record`` writes: every tensor, constants and shapes among them. Without
    a description, a constant as long as the recording has rows cannot be told from a tensor with
    rows (the (3,) statistics at 3 observations, the (2,) shape at 2)."""
    obs = np.random.default_rng(3).uniform(-1, 1, (600, 3)).astype(np.float32)[:observations]
    recorded = pp.load(pendulum_onnx).record(obs)
    assert {n: v.shape for n, v in recorded.items() if n in pendulum_constants} == pendulum_constants
    np.savez(tmp_path / "rec.npz", **recorded)
    stats = statistics(tmp_path / "rec.npz", batch_size=250)
    left_out = {n: s for n, s in pendulum_constants.items() if s[0] != observations}
    assert stats.rows == observations and stats.left_out == left_out
    assert [s.name for s in stats.tensors] == [n for n in recorded if n not in left_out]
    for s in stats.tensors:
        ref = direct(recorded[s.name])
        np.testing.assert_allclose(s.moments.mean, ref["mean"], rtol=1e-9, atol=1e-12, err_msg=s.name)
        np.testing.assert_array_equal(s.moments.maximum, ref["max"])
    assert stats.to_dict(neurons=False)["left_out"] == [{"name": n, "shape": list(s)} for n, s in left_out.items()]


def test_asking_for_statistics_of_an_array_without_rows_says_so(tmp_path, pendulum_onnx):
    np.savez(tmp_path / "rec.npz", **pp.load(pendulum_onnx).record(np.zeros((40, 3), np.float32)))
    with pytest.raises(pp.InputMismatchError, match=r"'vec_normalize/std' \(shape \(3,\)\) has no row for each of the "
                                                    "40 observations"):
        statistics(tmp_path / "rec.npz", "vec_normalize/std")
    with pytest.raises(pp.InputMismatchError, match=r"match no tensor"):  # a pattern matching nothing at all
        statistics(tmp_path / "rec.npz", "vec_normalize/std,fc_9")
    assert statistics(tmp_path / "rec.npz", "vec_normalize/*").left_out == {"vec_normalize/var_eps": (3,),
                                                                           "vec_normalize/std": (3,)}
