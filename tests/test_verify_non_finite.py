"""Observations and tensors that are NaN or infinite prove nothing: NaN matches NaN, so a wrong model
would pass on them. Observations of which every row holds one are refused (exit 3); some such rows
are counted in a note; a compared tensor NaN or infinite in every element on both sides is named.

The expected values are numpy's own arithmetic on the weights, never policyport's."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from typer.testing import CliRunner

import policyport as pp
from policyport.cli import app
from policyport.verification.compare import verdict

RIGHT = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
WRONG = RIGHT + np.float32(0.5)  # the model's weight: every action differs from the source's


def _linear(weight: np.ndarray, fixed_rows: int | None = None) -> onnx.ModelProto:
    """``y = obs @ weight`` (obs of 4 features; a batch axis, or ``fixed_rows`` rows)."""
    rows = "batch" if fixed_rows is None else fixed_rows
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["obs", "w"], ["y"], name="y")], "g",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, [rows, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, 3])],
        [helper.make_tensor("w", TensorProto.FLOAT, weight.shape, weight.ravel())])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _source(obs: np.ndarray) -> dict[str, np.ndarray]:
    """The trained policy, as numpy computes it."""
    with np.errstate(invalid="ignore"):
        return {"y": obs @ RIGHT}


FINITE = np.random.default_rng(0).uniform(-1, 1, (10, 4)).astype(np.float32)


def _invoke(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    return result


@pytest.mark.parametrize("poison", [np.nan, np.inf, -np.inf])
def test_observations_of_which_every_row_is_non_finite_are_refused(poison):
    """Before the refusal a wrong model passed against the source on them ("worst 0"): NaN matches NaN."""
    with np.errstate(invalid="ignore"):
        assert np.isnan(np.full((5, 4), np.nan, np.float32) @ WRONG).all()
    obs = FINITE[:5].copy()
    obs[:, 2] = poison  # one feature of every row
    with pytest.raises(pp.InputMismatchError) as caught:
        pp.verify(_linear(WRONG), obs, reference=_source)
    assert str(caught.value) == ("every one of the 5 observations holds NaN or infinity: every tensor computed from "
                                 "them is NaN or infinite on every side, and NaN matches NaN, so comparing them proves "
                                 "nothing; give observations whose values are finite")


def test_one_non_finite_observation_of_fixed_shape_is_refused():
    obs = np.full((1, 4), np.nan, np.float32)
    with pytest.raises(pp.InputMismatchError, match=r"^the observation holds NaN or infinity: every tensor computed "
                                                     r"from it is NaN"):
        pp.verify(_linear(WRONG, fixed_rows=1), obs)


def test_some_non_finite_rows_are_counted_and_the_others_still_decide():
    obs = FINITE.copy()
    obs[[1, 4, 7], 0] = np.nan
    wrong = pp.verify(_linear(WRONG), obs, reference=_source)
    assert not wrong.passed and wrong.first_divergence.tensor == "y"
    assert ("3 of the 10 observations hold NaN or infinity: what is computed from them is compared NaN with NaN, "
            "which proves nothing; the verdict rests on the other 7") in wrong.notes
    right = pp.verify(_linear(RIGHT), obs, reference=_source)
    assert right.passed and right.non_finite == []


def test_the_cli_refuses_them_for_verify_and_for_convert(tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(_linear(RIGHT), model)
    np.save(tmp_path / "nan.npy", np.full((6, 4), np.nan, np.float32))
    result = _invoke("verify", model, "-i", tmp_path / "nan.npy")
    assert result.exit_code == 3
    assert " ".join(result.stderr.split()) == (
        "error: every one of the 6 observations holds NaN or infinity: every tensor computed from them is NaN or "
        "infinite on every side, and NaN matches NaN, so comparing them proves nothing; give observations whose "
        "values are finite")
    doc = json.loads(_invoke("verify", model, "-i", tmp_path / "nan.npy", "--json").stdout)
    assert doc["exit_code"] == 3 and doc["error"].startswith("every one of the 6 observations holds NaN")

    weights = {"fc_1/kernel": RIGHT, "fc_1/bias": np.zeros(3, np.float32),
               "fc_out/kernel": RIGHT[:3], "fc_out/bias": np.zeros(3, np.float32)}
    np.savez(tmp_path / "w.npz", **weights)
    result = _invoke("convert", tmp_path / "w.npz", "-o", tmp_path / "c.onnx", "--activation", "tanh",
                     "-i", tmp_path / "nan.npy")
    assert result.exit_code == 3 and "every one of the 6 observations holds NaN or infinity" in result.stderr
    assert not (tmp_path / "c.onnx").exists()


def test_a_tensor_non_finite_everywhere_on_both_sides_is_named():
    """log(-1 - |obs|) is NaN whatever the observation (numpy agrees), on every backend: its
    comparison passes and proves nothing, which the report, its JSON and the verdict say."""
    with np.errstate(invalid="ignore"):
        assert np.isnan(np.log(-1 - np.abs(FINITE))).all()
    nodes = [helper.make_node("Abs", ["obs"], ["magnitude"], name="magnitude"),
             helper.make_node("Sub", ["minus_one", "magnitude"], ["negative"], name="negative"),
             helper.make_node("Log", ["negative"], ["nan"], name="nan"),
             helper.make_node("Neg", ["obs"], ["y"], name="y")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("nan", TensorProto.FLOAT, ["batch", 4]),
                               helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor("minus_one", TensorProto.FLOAT, [], [-1.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    report = pp.verify(model, FINITE)
    assert report.passed and report.non_finite == ["nan"]
    assert "NaN or infinite in every element on both sides, so their comparisons pass and prove nothing: 'nan'" in \
        report.notes
    assert report.to_dict()["non_finite"] == ["nan"]
    assert "; 1 tensor NaN or infinite everywhere on both sides proves nothing; worst " in verdict(report)
