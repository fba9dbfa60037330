"""The default operator set spelled "ai.onnx": ONNX gives it two names ("" and "ai.onnx", onnx.proto's
NodeProto.domain and OperatorSetIdProto.domain), and onnxruntime runs either. So must every command."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

import policyport as pp
from policyport.cli import app
from policyport.graph.passes import default_domain_spelled, infer_shapes

RNG = np.random.default_rng(7)
W = RNG.standard_normal((4, 3)).astype(np.float32)
B = RNG.standard_normal(3).astype(np.float32)
W2 = RNG.standard_normal((3, 2)).astype(np.float32)
OBS = RNG.standard_normal((6, 4)).astype(np.float32)

#: (node domain, opset import domain): each spelling of the default domain, and their mixes.
SPELLINGS = [("ai.onnx", ""), ("ai.onnx", "ai.onnx"), ("", "ai.onnx")]


def _gemm_tanh(node_domain: str, opset_domain: str) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["obs", "W", "b"], ["h"], domain=node_domain, name="fc"),
         helper.make_node("Tanh", ["h"], ["action"], domain=node_domain, name="act")],
        "policy", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(opset_domain, 17)], ir_version=8)


def _matmul_relu_softmax(node_domain: str, opset_domain: str) -> onnx.ModelProto:
    """A second kind: MatMul + Add + Relu + MatMul + Softmax (axis attribute checked against the schema)."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["obs", "W"], ["mm"], domain=node_domain, name="fc/MatMul"),
         helper.make_node("Add", ["mm", "b"], ["pre"], domain=node_domain, name="fc/Add"),
         helper.make_node("Relu", ["pre"], ["hidden"], domain=node_domain, name="fc/Relu"),
         helper.make_node("MatMul", ["hidden", "W2"], ["logits"], domain=node_domain, name="out/MatMul"),
         helper.make_node("Softmax", ["logits"], ["probs"], domain=node_domain, name="out/Softmax", axis=-1)],
        "policy", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 2])],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "b"), numpy_helper.from_array(W2, "W2")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(opset_domain, 13)], ir_version=8)


def _ort(model: onnx.ModelProto) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"obs": OBS})[0]


@pytest.mark.parametrize("node_domain, opset_domain", SPELLINGS)
def test_gemm_policy_runs_on_numpy_as_written_by_onnxruntime(node_domain, opset_domain):
    model = _gemm_tanh(node_domain, opset_domain)
    expected = np.tanh(OBS.astype(np.float64) @ W + B)
    got = pp.load(model, backend="numpy").run({"obs": OBS})["action"]
    np.testing.assert_allclose(got, expected, atol=1e-6)
    np.testing.assert_allclose(got, _ort(model), atol=1e-6)


@pytest.mark.parametrize("node_domain, opset_domain", SPELLINGS)
def test_second_kind_softmax_attribute_checked_and_run(node_domain, opset_domain):
    model = _matmul_relu_softmax(node_domain, opset_domain)
    logits = np.maximum(OBS.astype(np.float64) @ W + B, 0) @ W2
    expected = np.exp(logits - logits.max(1, keepdims=True))
    expected /= expected.sum(1, keepdims=True)
    for backend in ("numpy", "onnxruntime"):
        got = pp.load(model, backend=backend).run({"obs": OBS})["probs"]
        np.testing.assert_allclose(got, expected, atol=1e-6)


@pytest.mark.parametrize("node_domain, opset_domain", SPELLINGS)
def test_intermediate_tensors_are_typed_and_exposed(node_domain, opset_domain):
    model = _gemm_tanh(node_domain, opset_domain)
    inferred = {v.name: v for v in infer_shapes(model).graph.value_info}
    assert inferred["h"].type.tensor_type.elem_type == TensorProto.FLOAT
    for backend in ("numpy", "onnxruntime"):
        out = pp.load(pp.expose(model, "h"), backend=backend).run({"obs": OBS})
        np.testing.assert_allclose(out["h"], OBS.astype(np.float64) @ W + B, atol=1e-5)


def test_respelling_leaves_the_model_untouched():
    model = _gemm_tanh("ai.onnx", "ai.onnx")
    copy = default_domain_spelled(model)
    assert [n.domain for n in copy.graph.node] == ["", ""]
    assert [(o.domain, o.version) for o in copy.opset_import] == [("", 17)]
    assert [n.domain for n in model.graph.node] == ["ai.onnx", "ai.onnx"]
    plain = _gemm_tanh("", "")
    assert default_domain_spelled(plain) is plain


def test_cli_verify_and_run_on_a_file(tmp_path):
    path = tmp_path / "policy.onnx"
    onnx.save(_gemm_tanh("ai.onnx", "ai.onnx"), path)
    np.save(tmp_path / "obs.npy", OBS)
    runner = CliRunner()
    verdict = runner.invoke(app, ["verify", str(path), "-i", str(tmp_path / "obs.npy")])
    assert verdict.exit_code == 0, verdict.output
    assert "PASS" in verdict.output
    ran = runner.invoke(app, ["run", str(path), "-i", str(tmp_path / "obs.npy"), "-o", str(tmp_path / "a.npz"),
                              "--backend", "numpy"])
    assert ran.exit_code == 0, ran.output
    np.testing.assert_allclose(np.load(tmp_path / "a.npz")["action"], np.tanh(OBS.astype(np.float64) @ W + B),
                               atol=1e-6)
