"""The Session interface, identical across BACKENDS: feed checks before any backend runs."""

from __future__ import annotations

import numpy as np
import pytest

import policyport as pp

BACKENDS = list(pp.BACKENDS)


@pytest.fixture(scope="module", params=BACKENDS)
def session(request, metadrive_model):
    return pp.load(metadrive_model, backend=request.param)


@pytest.mark.parametrize("feeds, message", [
    ({"obs": np.zeros((4, 274), np.float32)}, r"expects shape \(batch, 275\), got \(4, 274\) \(axis 1 is 274, the model needs 275\)"),
    ({"obs": np.zeros((4, 275), np.float64)}, r"expects dtype float32, got float64"),
    ({"obs": np.zeros(275, np.float32)}, r"expects rank 2 .* got rank 1 .*add a batch axis"),
    ({"observation": np.zeros((1, 275), np.float32)}, r"the feeds have missing \['obs'\] and unexpected \['observation'\]"),
    ({"obs": np.zeros((1, 275), np.float32), "state": np.zeros(1)}, r"unexpected \['state'\]"),
    ({"obs": np.zeros((2, 275), np.int64)}, r"expects dtype float32, got int64"),
])
def test_bad_feeds_raise_input_mismatch_with_expected_and_found(session, feeds, message):
    with pytest.raises(pp.InputMismatchError, match=message):
        session.run(feeds)
    with pytest.raises(pp.InputMismatchError, match=message):
        session.record(feeds)


def test_input_mismatch_is_also_a_value_error(session):
    with pytest.raises(ValueError):
        session.run(np.zeros((1, 3), np.float32))


def test_bare_array_feeds_a_single_input_model(session, metadrive_obs):
    np.testing.assert_array_equal(session.run(metadrive_obs[:2])["logits"], session.run({"obs": metadrive_obs[:2]})["logits"])


def test_batch_of_zero_and_one(session):
    assert session.run(np.zeros((0, 275), np.float32))["action"].shape == (0, 2)
    assert session.run(np.zeros((1, 275), np.float32))["action"].shape == (1, 2)


def test_io_description(session):
    assert [(v.name, v.dtype.name, v.shape) for v in session.inputs] == [("obs", "float32", ("batch", 275))]
    assert [v.name for v in session.outputs] == ["logits", "action", "log_std"]
    assert session.tensor_names == ["fc_1/linear", "fc_1/tanh", "fc_2/linear", "fc_2/tanh", "logits", "action", "log_std"]


def test_unknown_backend_names_the_choices(metadrive_model):
    with pytest.raises(pp.InputMismatchError, match="choose one of numpy, onnxruntime"):
        pp.load(metadrive_model, backend="tensorrt")


def test_unreadable_model_file(tmp_path):
    bad = tmp_path / "x.onnx"
    bad.write_bytes(b"not a protobuf at all \x00\xff")
    with pytest.raises(pp.UnreadableFileError, match="not a readable ONNX model"):
        pp.load(bad)
    with pytest.raises(pp.UnreadableFileError, match="no such file"):
        pp.load(tmp_path / "missing.onnx")


def test_numpy_backend_reports_unsupported_ops_by_node(metadrive_model):
    import onnx

    model = onnx.ModelProto()
    model.CopyFrom(metadrive_model)
    model.graph.node[1].op_type = "NotAnOnnxOp"
    with pytest.raises(pp.UnsupportedOpError, match=r'NotAnOnnxOp node "fc_1/tanh" \(opset 17\)'):
        pp.load(model, backend="numpy")


@pytest.mark.parametrize("backend, message", [
    ("numpy", r'Gemm node "fc" on the numpy backend failed: ValueError'),
    ("onnxruntime", r"onnxruntime failed to run the model"),
])
def test_a_node_failing_at_run_time_is_a_bad_model_error_naming_it(backend, message):
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "W", "C"], ["y"], name="fc"), helper.make_node("Tanh", ["y"], ["z"], name="act")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(np.ones((3, 4), np.float32), "W"), numpy_helper.from_array(np.ones((3, 4), np.float32), "C")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = pp.load(model, backend=backend)
    np.testing.assert_allclose(session.run(np.ones((3, 3), np.float32))["z"], np.tanh(np.full((3, 4), 4, np.float32)), rtol=1e-6)
    with pytest.raises(pp.BadModelError, match=message):
        session.run(np.ones((2, 3), np.float32))  # C is (3, 4): it does not broadcast to a batch of 2
    with pytest.raises(pp.BadModelError, match=message):
        session.record(np.ones((2, 3), np.float32))
