"""ONNX tensors are checked against their dims before use, and refused naming the tensor."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import policyport as pp
from policyport.errors import BadModelError
from policyport.graph.model import check_tensor, from_onnx, tensor_array


def raw(data_type, dims, data: bytes, name="W"):
    t = TensorProto(name=name, data_type=data_type, dims=dims)
    t.raw_data = data
    return t


@pytest.mark.parametrize("tensor,nbytes", [
    (numpy_helper.from_array(np.zeros((3, 5), np.float32), "W"), 60),
    (helper.make_tensor("W", TensorProto.FLOAT, [2, 2], [1.0, 2.0, 3.0, 4.0]), 16),  # float_data
    (helper.make_tensor("W", TensorProto.INT64, [3], [1, 2, 3]), 24),
    (helper.make_tensor("W", TensorProto.FLOAT16, [3], np.array([1, 2, 3], np.float16)), 6),  # int32_data
    (helper.make_tensor("W", TensorProto.COMPLEX64, [2], [1 + 2j, 3 + 4j]), 16),  # two float_data each
    (raw(TensorProto.INT4, [5], b"\0\0\0"), 3),  # 4-bit, packed two to a byte, rounded up
    (helper.make_tensor("W", TensorProto.INT4, [5], [1, 2, 3, 4, 5]), 3),  # int32_data packed: 3 entries
    (raw(TensorProto.UINT2, [9], b"\0\0\0"), 3),
    (helper.make_tensor("W", TensorProto.STRING, [2], [b"a", b"b"]), 0),
    (raw(TensorProto.FLOAT, [0, 7], b""), 0),
])
def test_tensors_that_hold_what_their_dims_say_pass(tensor, nbytes):
    assert check_tensor(tensor) == nbytes


@pytest.mark.parametrize("tensor,message", [
    (raw(TensorProto.FLOAT, [4, 4], b"\0" * 63), "initializer 'W' has dims [4, 4] (16 float32 elements), which take 64 bytes of raw_data, but it holds 63"),
    (raw(TensorProto.FLOAT, [10**6, 10**6], b""), "which take 4,000,000,000,000 bytes of raw_data, but it holds 0"),
    (raw(TensorProto.DOUBLE, [2], b"\0" * 24), "take 16 bytes of raw_data, but it holds 24"),
    (TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[3], float_data=[1.0, 2.0]), "take 3 entries of float_data, but it holds 2"),
    (TensorProto(name="W", data_type=TensorProto.STRING, dims=[2], string_data=[b"a"]), "take 2 entries of string_data"),
    (TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[-1]), "has dims [-1]; dims must be non-negative"),
    (TensorProto(name="W", data_type=0, dims=[1]), "has element type 0, which is not an ONNX tensor element type"),
    (TensorProto(name="W", data_type=99, dims=[1]), "has element type 99"),
])
def test_tensors_whose_data_does_not_match_their_dims_are_refused_naming_them(tensor, message):
    with pytest.raises(BadModelError, match=re.escape(message)):
        check_tensor(tensor)


def test_external_data_not_loaded_is_refused_rather_than_read_from_the_working_folder():
    t = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[2], data_location=TensorProto.EXTERNAL)
    entry = t.external_data.add()
    entry.key, entry.value = "location", "weights.bin"
    assert check_tensor(t) == 8
    with pytest.raises(BadModelError, match="stored in an external file that was not loaded"):
        tensor_array(t)


def _model(initializer, attribute_tensor=None):
    nodes = [helper.make_node("MatMul", ["obs", "W"], ["y"], name="dense")]
    if attribute_tensor is not None:
        nodes = [helper.make_node("Constant", [], ["W"], name="weights", value=attribute_tensor), *nodes]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["b", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 4])],
                              [] if initializer is None else [initializer])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_every_reader_refuses_a_short_initializer_given_as_a_model_too():
    model = _model(raw(TensorProto.FLOAT, [4, 4], b"\0" * 63))
    for read in (from_onnx, pp.extract_weights, pp.expose, lambda m: pp.load(m), lambda m: pp.load(m, backend="onnxruntime"),
                 lambda m: pp.verify(m, samples=4)):
        with pytest.raises(BadModelError, match="initializer 'W' has dims"):
            read(model)


def test_a_constant_node_tensor_is_checked_and_named_by_its_node():
    model = _model(None, attribute_tensor=raw(TensorProto.FLOAT, [4, 4], b"\0" * 8, name="value"))
    with pytest.raises(BadModelError, match=r"Constant node \"weights\" attribute 'value': tensor 'value' has dims \[4, 4\]"):
        pp.load(model)


def test_a_string_attribute_that_is_not_utf8_is_refused_naming_its_node():
    model = _model(numpy_helper.from_array(np.eye(4, dtype=np.float32), "W"))
    model.graph.node[0].attribute.append(helper.make_attribute("note", b"\xff\xfe"))
    with pytest.raises(BadModelError, match="MatMul node \"dense\": attribute 'note' is not UTF-8 text"):
        from_onnx(model)


def test_valid_models_still_read_exactly(metadrive_model):
    graph = from_onnx(metadrive_model)
    for init in metadrive_model.graph.initializer:
        np.testing.assert_array_equal(graph.initializers[init.name], numpy_helper.to_array(init))
    onnx.checker.check_model(metadrive_model)
