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
