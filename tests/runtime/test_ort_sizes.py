"""The onnxruntime backend sizes node outputs before onnxruntime sees the model, with the limit the
numpy backend applies, reading the model's small constants only."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import policyport as pp
from policyport.io.limits import MIB, using_limits
from policyport.runtime.ort import _shapes_of, check_tensor_sizes

pytest.importorskip("onnxruntime")


def _model(nodes, initializers, out_shape):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_a_shape_computed_from_constants_is_followed_to_the_size_it_gives():
    # Expand to (obs's width * 2**20, 4): the shape is computed by Shape, Slice, Mul and Concat
    nodes = [helper.make_node("Shape", ["obs"], ["s"], name="shape", start=1),
             helper.make_node("Mul", ["s", "scale"], ["rows"], name="scale"),
             helper.make_node("Concat", ["rows", "four"], ["to"], name="to", axis=0),
             helper.make_node("Expand", ["obs", "to"], ["y"], name="widen")]
    model = _model(nodes, [numpy_helper.from_array(np.array([1 << 20], np.int64), "scale"),
                           numpy_helper.from_array(np.array([4], np.int64), "four")], None)
    with using_limits(array_bytes=8 * MIB), pytest.raises(pp.LimitExceededError) as caught:
        pp.load(model, backend="onnxruntime")
    assert str(caught.value).startswith('Expand node "widen" on the onnxruntime backend: its output (float32, shape '
                                        "(4194304, 4)) would take 64 MiB")
    pp.load(model, backend="onnxruntime")  # within the default limit


def test_weights_are_not_copied_to_size_the_outputs():
    weight = numpy_helper.from_array(np.ones((4, 1000), np.float32), "w")
    model = _model([helper.make_node("MatMul", ["obs", "w"], ["y"], name="mm")], [weight], ["batch", 1000])
    light = _shapes_of(model)
    assert list(light.graph.initializer) == []
    assert [(v.name, [d.dim_value for d in v.type.tensor_type.shape.dim]) for v in light.graph.input] == \
        [("obs", [0, 4]), ("w", [4, 1000])]
    check_tensor_sizes(model)
    with using_limits(array_bytes=1000), pytest.raises(pp.LimitExceededError, match=r'MatMul node "mm" .* shape \(1, 1000\)'):
        check_tensor_sizes(model)
