"""extract_weights and expose: bit-exact round trips, purity, selection."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import policyport as pp


def test_extract_reproduces_the_metadrive_file_key_for_key_bit_for_bit(metadrive_model, metadrive_weights):
    weights = pp.extract_weights(metadrive_model)
    assert list(weights) == list(metadrive_weights)
    for name, arr in metadrive_weights.items():
        assert weights[name].dtype == arr.dtype and weights[name].shape == arr.shape
        assert weights[name].tobytes() == arr.tobytes(), name


def test_extract_keeps_zero_biases_and_leaves_head_constants_out():
    w = {"fc_1/kernel": np.eye(3, dtype=np.float32), "fc_1/bias": np.zeros(3, np.float32),
         "fc_out/kernel": np.ones((3, 2), np.float32), "fc_out/bias": np.zeros(2, np.float32)}
    model = pp.convert(w, activation="tanh", head="diag-gaussian")
    assert any(i.name.startswith("head/") for i in model.graph.initializer)
    weights = pp.extract_weights(model)
    assert list(weights) == list(w)
    np.testing.assert_array_equal(weights["fc_1/bias"], np.zeros(3, np.float32))


def test_extract_undoes_a_recorded_transpose(metadrive_model):
    model = onnx.ModelProto()
    model.CopyFrom(metadrive_model)
    kernel = next(i for i in model.graph.initializer if i.name == "default_policy/fc_1/kernel")
    source = onnx.numpy_helper.to_array(kernel)
    kernel.CopyFrom(onnx.numpy_helper.from_array(np.ascontiguousarray(source.T), kernel.name))
    props = {p.key: p for p in model.metadata_props}
    import json

    mapping = json.loads(props["policyport.parameters"].value)
    mapping["default_policy/fc_1/kernel"] = {"name": "default_policy/fc_1/kernel", "transpose": [1, 0]}
    props["policyport.parameters"].value = json.dumps(mapping)
    assert pp.extract_weights(model)["default_policy/fc_1/kernel"].tobytes() == source.tobytes()


def test_extract_of_a_foreign_model_returns_initializers_by_name(metadrive_model):
    model = onnx.ModelProto()
    model.CopyFrom(metadrive_model)
    del model.metadata_props[:]
    weights = pp.extract_weights(model)
    # the six float weights under their initializer names; the int64 Slice bounds of the head are constants
    assert list(weights) == [i.name for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT]
    assert sorted(set(i.name for i in model.graph.initializer) - set(weights)) == [
        "head/axes", "head/end", "head/mid", "head/zero"]


def test_expose_all_adds_every_node_output_with_type_and_shape(metadrive_model):
    before = metadrive_model.SerializeToString()
    exposed = pp.expose(metadrive_model)
    assert metadrive_model.SerializeToString() == before  # pure: the argument is untouched
    outputs = {o.name: o for o in exposed.graph.output}
    assert list(outputs) == ["logits", "action", "log_std", "fc_1/linear", "fc_1/tanh", "fc_2/linear", "fc_2/tanh"]
    t = outputs["fc_2/tanh"].type.tensor_type
    assert t.elem_type == onnx.TensorProto.FLOAT
    assert [d.dim_param or d.dim_value for d in t.shape.dim] == ["batch", 256]
    onnx.checker.check_model(exposed, full_check=True)


def test_expose_with_globs_selects_only_matches(metadrive_model):
    exposed = pp.expose(metadrive_model, tensors="fc_1/*,*tanh")
    assert [o.name for o in exposed.graph.output][3:] == ["fc_1/linear", "fc_1/tanh", "fc_2/tanh"]


def test_expose_with_a_pattern_matching_nothing_says_what_exists(metadrive_model):
    with pytest.raises(pp.InputMismatchError, match=r"\['fc_9\*'\] match no tensor.*fc_1/linear"):
        pp.expose(metadrive_model, tensors="fc_9*")


def test_expose_leaves_the_file_untouched(tmp_path, metadrive_model):
    path = tmp_path / "m.onnx"
    path.write_bytes(metadrive_model.SerializeToString())
    before = path.read_bytes()
    exposed = pp.expose(path)
    assert path.read_bytes() == before and len(exposed.graph.output) == 7


def _with_metadata(model, **props):
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    onnx.helper.set_model_props(copy, {**{p.key: p.value for p in copy.metadata_props}, **props})
    return copy


def test_value_entries_and_the_recorded_order_rebuild_buffers_the_graph_does_not_hold(metadrive_model):
    import json

    props = {p.key: p.value for p in metadrive_model.metadata_props}
    mapping = json.loads(props["policyport.parameters"])
    mapping["bn.num_batches_tracked"] = {"name": "bn.num_batches_tracked",
                                         "value": {"dtype": "int64", "shape": [], "data": [1234]}}
    order = ["bn.num_batches_tracked", *reversed([v if isinstance(v, str) else v["name"] for v in mapping.values()][:-1])]
    model = _with_metadata(metadrive_model, **{"policyport.parameters": json.dumps(mapping),
                                               "policyport.parameter_order": json.dumps(order)})
    weights = pp.extract_weights(model)
    assert list(weights) == order
    assert weights["bn.num_batches_tracked"].dtype == np.int64 and weights["bn.num_batches_tracked"].shape == ()
    assert int(weights["bn.num_batches_tracked"]) == 1234


@pytest.mark.parametrize("value", [
    {"dtype": "object", "shape": [], "data": [1]},
    {"dtype": "int64", "shape": [2], "data": [1]},
    {"dtype": "int64", "shape": [100], "data": list(range(100))},
])
def test_a_malformed_value_entry_is_refused(metadrive_model, value):
    import json

    mapping = {"x": {"name": "x", "value": value}}
    with pytest.raises(pp.BadModelError, match="policyport.parameters' is malformed"):
        pp.extract_weights(_with_metadata(metadrive_model, **{"policyport.parameters": json.dumps(mapping)}))


@pytest.mark.parametrize("transpose, message", [
    ("x", "metadata 'policyport.parameters' is malformed: 'default_policy/fc_1/kernel' has transpose x, not a "
          "permutation of its axes (a list holding 0 to rank - 1 once each)"),
    ([0, 0], "metadata 'policyport.parameters' is malformed: 'default_policy/fc_1/kernel' has transpose [0, 0], not a "
             "permutation of its axes (a list holding 0 to rank - 1 once each)"),
    ([5, 1], "metadata 'policyport.parameters' is malformed: 'default_policy/fc_1/kernel' has transpose [5, 1], not a "
             "permutation of its axes (a list holding 0 to rank - 1 once each)"),
    ([True, False], "metadata 'policyport.parameters' is malformed: 'default_policy/fc_1/kernel' has transpose [True, "
                    "False], not a permutation of its axes (a list holding 0 to rank - 1 once each)"),
    ([1, 0, 2], "metadata 'policyport.parameters' transposes 'default_policy/fc_1/kernel' by [1, 0, 2], but it has 2 "
                "axes (shape (275, 256))"),
])
def test_a_transpose_that_is_no_permutation_of_the_initializers_axes_is_refused(tmp_path, metadrive_model, transpose,
                                                                                 message):
    import json

    from typer.testing import CliRunner

    from policyport.cli import app

    mapping = json.loads({p.key: p.value for p in metadrive_model.metadata_props}["policyport.parameters"])
    mapping["default_policy/fc_1/kernel"] = {"name": "default_policy/fc_1/kernel", "transpose": transpose}
    model = _with_metadata(metadrive_model, **{"policyport.parameters": json.dumps(mapping)})
    onnx.save(model, tmp_path / "m.onnx")
    for command in (["extract", tmp_path / "m.onnx", "-o", tmp_path / "w.npz"], ["pack", tmp_path / "m.onnx", "-o",
                                                                                  tmp_path / "packed"]):
        result = CliRunner().invoke(app, [str(a) for a in command])
        assert result.exit_code == 3, result.output
        assert " ".join(result.stderr.split()) == f"error: {message}"
    assert not (tmp_path / "w.npz").exists() and not (tmp_path / "packed").exists()
