"""Models policyport did not write: which initializers are parameters (extract, inspect, pack), and
expose on tensors ONNX shape inference cannot resolve."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

import policyport as pp
from policyport.cli import app
from policyport.graph.passes import parameter_names
from policyport.verification.summary import summarize

RNG = np.random.default_rng(0)


def mlagents_like():
    """An ML-Agents-shaped export: normalised obs -> dense (8 -> 16) -> Reshape -> action mean plus a
    learned log_std; ``version_number`` and ``memory_size`` constants passed to outputs through
    Identity; int64 shape constants; a float Clip bound."""
    inits = {
        "normalization_steps": np.array([3.0], np.float32),  # read by Div: a running statistic, a weight
        "running_mean": RNG.standard_normal(8).astype(np.float32),
        "dense.weight": RNG.standard_normal((8, 16)).astype(np.float32),
        "dense.bias": RNG.standard_normal(16).astype(np.float32),
        "mu.weight": RNG.standard_normal((16, 2)).astype(np.float32),
        "log_std": np.zeros((1, 2), np.float32),
        "version_number": np.array([3.0], np.float32),
        "memory_size": np.array([0.0], np.float32),
        "shape": np.array([-1, 16], np.int64),
        "clip_min": np.array(-5.0, np.float32),
        "clip_max": np.array(5.0, np.float32),
    }
    nodes = [
        helper.make_node("Sub", ["obs", "running_mean"], ["centred"], name="centred"),
        helper.make_node("Div", ["centred", "normalization_steps"], ["scaled"], name="scaled"),
        helper.make_node("Clip", ["scaled", "clip_min", "clip_max"], ["normalised"], name="normalised"),
        helper.make_node("MatMul", ["normalised", "dense.weight"], ["h0"], name="dense"),
        helper.make_node("Add", ["h0", "dense.bias"], ["h1"], name="dense_bias"),
        helper.make_node("Reshape", ["h1", "shape"], ["h2"], name="flat"),
        helper.make_node("Tanh", ["h2"], ["h"], name="act"),
        helper.make_node("MatMul", ["h", "mu.weight"], ["mu"], name="mu"),
        helper.make_node("Add", ["mu", "log_std"], ["shifted"], name="shifted"),
        helper.make_node("Identity", ["version_number"], ["version_out"], name="version"),
        helper.make_node("Identity", ["memory_size"], ["memory_out"], name="memory"),
    ]
    outputs = [helper.make_tensor_value_info("shifted", TensorProto.FLOAT, ["batch", 2]),
               helper.make_tensor_value_info("version_out", TensorProto.FLOAT, [1]),
               helper.make_tensor_value_info("memory_out", TensorProto.FLOAT, [1])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 8])],
                              outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


WEIGHTS = ["normalization_steps", "running_mean", "dense.weight", "dense.bias", "mu.weight", "log_std"]


def test_parameters_are_float_weights_read_by_compute_ops():
    assert parameter_names(mlagents_like().graph) == set(WEIGHTS)


def test_extract_and_inspect_leave_constants_out():
    model = mlagents_like()
    weights = pp.extract_weights(model)
    assert list(weights) == WEIGHTS
    summary = summarize(model)
    assert [p["name"] for p in summary["parameters"]] == WEIGHTS
    assert summary["parameter_count"] == 1 + 8 + 8 * 16 + 16 + 16 * 2 + 2 == 187
    dense = next(n for n in summary["nodes"] if n["name"] == "dense")
    assert dense["parameters"] == ["dense.weight"] and dense["parameter_count"] == 128
    assert next(n for n in summary["nodes"] if n["name"] == "version")["parameter_count"] == 0


def test_pack_stores_constants_apart_from_weights(tmp_path):
    folder = pp.pack(mlagents_like(), tmp_path / "b", samples=4)
    with np.load(folder / "weights.npz") as w, np.load(folder / "constants.npz") as c:
        assert list(w.files) == WEIGHTS
        assert sorted(c.files) == ["clip_max", "clip_min", "memory_size", "shape", "version_number"]
    assert pp.verify_bundle(folder).passed


def test_cli_inspect_counts_parameters_by_that_rule(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(mlagents_like(), path)
    doc = json.loads(CliRunner().invoke(app, ["inspect", str(path), "--json"]).stdout)
    assert doc["parameter_count"] == 187


# --------------------------------------------------------------------------------------- expose


def reshape_to_computed_shape():
    """x (batch, 12) -> Reshape to dims[:width // 4] = (3, -1, 4), a shape ONNX inference cannot size
    -> LSTM (hidden 5) -> Y_h -> Squeeze -> Tanh; plus Reshape(Y, computed) which no inference types."""
    h = 5
    inits = {"one": np.array(1, np.int64), "four": np.array(4, np.int64), "ax": np.array([0], np.int64),
             "zero1": np.array([0], np.int64), "dims": np.array([3, -1, 4, 7], np.int64),
             "W": RNG.standard_normal((1, 4 * h, 4)).astype(np.float32),
             "R": RNG.standard_normal((1, 4 * h, h)).astype(np.float32), "flat": np.array([-1, 0], np.int64)}
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "one"], ["width"], axis=0, name="width"),
             helper.make_node("Div", ["width", "four"], ["n"], name="n"),
             helper.make_node("Unsqueeze", ["n", "ax"], ["n1"], name="n1"),
             helper.make_node("Slice", ["dims", "zero1", "n1"], ["target"], name="target"),
             helper.make_node("Reshape", ["x", "target"], ["seq"], name="to_sequence"),
             helper.make_node("LSTM", ["seq", "W", "R"], ["Y", "Y_h", "Y_c"], hidden_size=h, name="lstm"),
             helper.make_node("Squeeze", ["Y_h", "ax"], ["last"], name="last"),
             helper.make_node("Reshape", ["Y", "flat"], ["Y_flat"], name="flatten_y"),
             helper.make_node("Tanh", ["last"], ["y"], name="act")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", h]),
                               helper.make_tensor_value_info("Y_flat", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)


def test_expose_gives_every_output_a_type_and_shape_the_checker_accepts():
    model = reshape_to_computed_shape()
    inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(model, data_prop=True).graph.value_info}
    assert not inferred["seq"].type.tensor_type.HasField("shape")  # inference cannot size it
    exposed = pp.expose(model)
    onnx.checker.check_model(exposed, full_check=True)
    outputs = {o.name: o.type.tensor_type for o in exposed.graph.output}
    assert outputs["seq"].elem_type == TensorProto.FLOAT
    assert [d.HasField("dim_value") or d.HasField("dim_param") for d in outputs["seq"].shape.dim] == [False] * 3
    assert [d.dim_value for d in outputs["Y"].shape.dim][1:] == [1, 0, 5][1:2] + [0, 5][0:0] or \
        [d.dim_value for d in outputs["Y"].shape.dim][-1] == 5
    assert len(outputs["Y_flat"].shape.dim) == 2  # declared without a shape; typed by the run
    assert len(outputs["target"].shape.dim) == 1 and outputs["target"].elem_type == TensorProto.INT64
    x = RNG.standard_normal((2, 12)).astype(np.float32)
    ran = pp.load(exposed, backend="onnxruntime").run({"x": x})
    assert ran["seq"].shape == (3, 2, 4) and ran["Y"].shape == (3, 1, 2, 5)


def test_expose_cli_writes_a_model_that_passes_the_checker(tmp_path):
    path, out = tmp_path / "m.onnx", tmp_path / "e.onnx"
    onnx.save(reshape_to_computed_shape(), path)
    result = CliRunner().invoke(app, ["expose", str(path), "-o", str(out), "--tensors", "seq,Y*"])
    assert result.exit_code == 0, result.output
    exposed = onnx.load(out)
    onnx.checker.check_model(exposed, full_check=True)
    assert [o.name for o in exposed.graph.output] == ["y", "Y_flat", "seq", "Y", "Y_h", "Y_c"]
