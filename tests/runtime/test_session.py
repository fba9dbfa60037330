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
    with pytest.raises(pp.UnsupportedOpError, match=r'NotAnOnnxOp node "fc_1/tanh" \(opset 17; no NotAnOnnxOp at any'):
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


def several_missing_ops_model():
    """Cos twice and Sin (no implementation at any opset), Gelu at opset 18 (implemented from 20), a
    com.microsoft op, and ops the numpy backend has, in between."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Cos", ["x"], ["a"], name="cos_1"), helper.make_node("Relu", ["a"], ["b"], name="relu"),
             helper.make_node("Gelu", ["b"], ["c"], name="gelu"), helper.make_node("Cos", ["c"], ["d"], name="cos_2"),
             helper.make_node("Sin", ["d"], ["e"], name="sin"),
             helper.make_node("FusedMatMul", ["e", "e"], ["f"], name="fused", domain="com.microsoft")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_tensor_value_info("f", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])


def test_one_error_names_every_missing_op_with_its_nodes_and_opset():
    from policyport.errors import MissingOp

    with pytest.raises(pp.UnsupportedOpError) as e:
        pp.load(several_missing_ops_model(), backend="numpy")
    assert e.value.missing == [
        MissingOp("Cos", "", 18, ("cos_1", "cos_2"), ()),
        MissingOp("Gelu", "", 18, ("gelu",), (20,)),
        MissingOp("Sin", "", 18, ("sin",), ()),
        MissingOp("FusedMatMul", "com.microsoft", 1, ("fused",), ()),
    ]
    assert str(e.value) == (
        'the numpy backend lacks 4 ops of this model: Cos nodes "cos_1", "cos_2" (opset 18; no Cos at any opset); '
        'Gelu node "gelu" (opset 18; implemented from opset 20); Sin node "sin" (opset 18; no Sin at any opset); '
        "FusedMatMul node \"fused\" in domain 'com.microsoft' (opset 1; no FusedMatMul at any opset) — load it with "
        'backend="onnxruntime" (policyport inspect lists the ops it has)')
    assert e.value.reexport_opset is None  # Cos exists at no opset: re-exporting cannot help


def test_the_remedy_fits_where_the_error_surfaced():
    from policyport.errors import MissingOp

    error = pp.UnsupportedOpError([MissingOp("Gelu", "", 18, ("g",), (20,)), MissingOp("Mish", "", 17, ("m",), (18,))])
    assert error.reexport_opset == 20
    subject = 'the numpy backend lacks 2 ops of this model: Gelu node "g" (opset 18; implemented from opset 20); ' \
              'Mish node "m" (opset 17; implemented from opset 18) — re-export the model at opset 20 or newer, or '
    assert error.message_for(None) == subject + 'load it with backend="onnxruntime" (policyport inspect lists the ops it has)'
    assert error.message_for("run") == subject + "use --backend onnxruntime (policyport inspect lists the ops it has)"
    assert error.message_for("verify", source_given=True) == \
        subject + "verify onnxruntime against the source alone: add --backends onnxruntime"
    assert error.message_for("verify") == subject + (
        "verify onnxruntime against the source the model came from (--backends onnxruntime --source SRC); "
        "with no source, 'policyport run --backend onnxruntime' runs it")
    pack = error.message_for("pack")
    assert "a packed policy runs on numpy alone, so this model cannot be packed; re-export the model at opset 20" in pack
    assert "--backend" not in pack.split("'policyport run")[0]  # pack has no backend option


def test_an_unsupported_op_error_may_carry_a_message_of_its_own():
    error = pp.UnsupportedOpError("Foo node \"f\" needs a feature onnxruntime lacks")
    assert error.missing == [] and str(error) == error.message_for("run") == 'Foo node "f" needs a feature onnxruntime lacks'
    assert isinstance(error, NotImplementedError) and error.exit_code == 3


# ------------------------------------------------------------------------------- argument types


@pytest.mark.parametrize("tensors, message", [
    (5, r"tensors must be a name or glob, a comma-separated string of them, a list of them or None, not int 5"),
    ([1, "fc_1/*"], r"tensors must be names or globs \(strings\); found int 1"),
    (b"fc_1/*", r"not bytes b'fc_1/\*'"),
    ({"fc_1/tanh": 1}, r"not dict"),
])
def test_tensors_of_the_wrong_type_raise_an_argument_type_error(session, tensors, message):
    feeds = {"obs": np.zeros((1, 275), np.float32)}
    for call in (lambda: session.record(feeds, tensors=tensors), lambda: session.record_iter([feeds], tensors),
                 lambda: session.selection(tensors)):
        with pytest.raises(pp.ArgumentTypeError, match=message) as caught:
            call()
        assert isinstance(caught.value, TypeError) and caught.value.exit_code == 2


def test_a_selection_is_resolved_once_per_pattern_and_kept(session):
    chosen = session.selection(["*/tanh", "action"])
    assert chosen and chosen[-1] == "action" and all(n.endswith("/tanh") for n in chosen[:-1])
    assert session.selection(["*/tanh", "action"]) is chosen  # a list's patterns: kept under their tuple
    assert session.selection("*/tanh,action") is session.selection("*/tanh,action") == chosen
    assert session.selection(None) is session.selection(None)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"threads": 100_000}, pp.InputMismatchError, r"threads \(0: one per core\) must be a finite number >= 0 and <= 1024, got 100000"),
    ({"threads": -1}, pp.InputMismatchError, r"threads \(0: one per core\) must be a finite number >= 0 and <= 1024, got -1"),
    ({"threads": 2.0}, pp.ArgumentTypeError, r"threads \(0: one per core\) must be a whole number, not float 2\.0"),
    ({"threads": True}, pp.ArgumentTypeError, r"must be a whole number, not bool True"),
    ({"seed": "7"}, pp.ArgumentTypeError, r"seed must be a whole number or None, not str '7'"),
])
def test_load_checks_its_arguments(metadrive_model, kwargs, error, message):
    with pytest.raises(error, match=message):
        pp.load(metadrive_model, **kwargs)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"samples": "8"}, pp.ArgumentTypeError, r"samples \(observations to draw\) must be a whole number, not str '8'"),
    ({"samples": 0}, pp.InputMismatchError, r"samples \(observations to draw\) must be a finite number >= 1, got 0"),
    ({"low": float("nan")}, pp.InputMismatchError, r"low \(the smallest observation value drawn\) must be a finite number"),
    ({"high": [1.0]}, pp.ArgumentTypeError, r"high \(the bound of the observation values drawn\) must be a number"),
])
def test_pack_and_export_check_how_observations_are_drawn_before_any_work(metadrive_model, tmp_path, kwargs, error, message):
    with pytest.raises(error, match=message):
        pp.pack(metadrive_model, tmp_path / "b", **kwargs)
    with pytest.raises(error, match=message):
        pp.export_numpy(metadrive_model, tmp_path / "p.py", **kwargs)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------ NaN and infinities


@pytest.mark.parametrize("rows", [2, 3000])  # 3,000 rows: the row blocks run on several threads
def test_nan_and_inf_propagate_without_numpy_warnings(metadrive_model, rows):
    import warnings

    obs = np.zeros((rows, 275), np.float32)
    obs[0, 0], obs[1, :] = np.nan, np.inf
    session = pp.load(metadrive_model, backend="numpy")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning would fail the test
        outputs = session.run({"obs": obs})
        recorded = session.record({"obs": obs})
    assert np.isnan(outputs["action"][:2]).all() and np.isfinite(outputs["action"][2:]).all()
    assert np.isnan(recorded["fc_1/linear"][:2]).all()


def test_a_caller_that_asks_numpy_to_raise_keeps_it_on_every_thread(metadrive_model):
    obs = np.zeros((3000, 275), np.float32)
    obs[2999, :] = np.inf  # in the last row block, which a worker thread computes
    session = pp.load(metadrive_model, backend="numpy", threads=2)
    with np.errstate(all="raise"), pytest.raises(pp.BadModelError, match=r'Gemm node "fc_1/linear" on the numpy '
                                                                          r"backend failed: FloatingPointError"):
        session.run({"obs": obs})


@pytest.mark.parametrize("kwargs, message", [
    ({"activation": 5}, r"convert\(\): activation must be str, not int 5"),
    ({"opset": "17"}, r"opset must be a whole number, not str '17'"),
    ({"keep_value": "yes"}, r"convert\(\): keep_value must be bool, not str 'yes'"),
    ({"colour": "red"}, r"convert\(\) got unexpected keyword argument\(s\) colour"),
])
def test_convert_checks_its_option_types_before_reading_the_source(metadrive_path, kwargs, message):
    with pytest.raises(pp.ArgumentTypeError, match=message) as caught:
        pp.convert(metadrive_path, **kwargs)
    assert isinstance(caught.value, TypeError)


def test_record_dataset_checks_its_argument_types(metadrive_model, tmp_path):
    from policyport.analysis import record_dataset

    np.save(tmp_path / "obs.npy", np.zeros((4, 275), np.float32))
    with pytest.raises(pp.ArgumentTypeError, match=r"batch_size \(rows per block\) must be a whole number, not str '8'"):
        record_dataset(metadrive_model, tmp_path / "obs.npy", tmp_path / "r.npz", batch_size="8")
    assert not (tmp_path / "r.npz").exists()
