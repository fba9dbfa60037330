"""What ``inspect`` says of the numpy backend is what ``run --backend numpy`` does."""

from __future__ import annotations

import json

import numpy as np
from onnx import TensorProto, helper
from typer.testing import CliRunner

from policyport.cli import app

runner = CliRunner()


def _relu(path, opset: int):
    graph = helper.make_graph([helper.make_node("Relu", ["obs"], ["y"], name="r")], "g",
                              [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    return path


def test_inspect_names_the_refusal_run_gives_for_a_model_whose_ops_it_has(tmp_path):
    model = _relu(tmp_path / "newer.onnx", 30)  # Relu exists at every opset, but opset 30 is beyond the backend's
    np.save(tmp_path / "obs.npy", np.zeros((2, 4), np.float32))
    run = runner.invoke(app, ["run", str(model), "-i", str(tmp_path / "obs.npy"), "-o", str(tmp_path / "out.npz")])
    refusal = "the model declares default-domain opset 30, newer than the operator sets the numpy backend knows"
    assert run.exit_code == 3 and refusal in " ".join(run.stderr.split())
    shown = runner.invoke(app, ["inspect", str(model)])
    assert shown.exit_code == 0
    assert "runs on --backend numpy" not in shown.stdout
    assert f"numpy backend lacks no op, but refuses the model: {refusal}" in " ".join(shown.stdout.split())
    doc = json.loads(runner.invoke(app, ["inspect", str(model), "--json"]).stdout)
    assert doc["numpy_backend_lacks"] == [] and doc["numpy_backend_refusal"].startswith(refusal)


def test_inspect_says_a_model_runs_when_run_runs_it(tmp_path):
    model = _relu(tmp_path / "m.onnx", 17)
    np.save(tmp_path / "obs.npy", np.zeros((2, 4), np.float32))
    assert runner.invoke(app, ["run", str(model), "-i", str(tmp_path / "obs.npy"), "-o", str(tmp_path / "o.npz")]).exit_code == 0
    assert "numpy backend lacks: nothing (runs on --backend numpy)" in runner.invoke(app, ["inspect", str(model)]).stdout
    assert json.loads(runner.invoke(app, ["inspect", str(model), "--json"]).stdout)["numpy_backend_refusal"] is None
