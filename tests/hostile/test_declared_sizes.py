"""Sizes a small file declares, directly or through a config, are checked against policyport's limits
before anything that large is allocated: each hostile file is made here, at test time, and the
command that reads it runs under a 2 GiB address space (:mod:`limited`), where a missing check shows
up as another message (a MemoryError, onnxruntime's or TensorFlow's own), never as the limit's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from limited import SUPPORTED, refused, run_limited

pytestmark = pytest.mark.skipif(not SUPPORTED, reason="address-space limits as on Linux")

ARRAY_LIMIT = "above the limit of 1 GiB for"


def _model(nodes, initializers=(), opset=17, output="y"):
    from onnx import TensorProto, helper

    graph = helper.make_graph(nodes, "hostile", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info(output, TensorProto.FLOAT, ["batch", 4])],
                              list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _save(model, path: Path) -> Path:
    path.write_bytes(model.SerializeToString())
    return path


def test_onnxruntime_is_not_handed_a_constant_of_shape_above_the_array_limit(tmp_path):
    from onnx import helper, numpy_helper

    # 194 bytes: ConstantOfShape of 2.125e9 float32 zeros (8.5 GB), summed and added to the observation
    path = _save(_model([helper.make_node("ConstantOfShape", ["shape"], ["big"], name="fill"),
                         helper.make_node("ReduceSum", ["big"], ["total"], name="sum", keepdims=0),
                         helper.make_node("Add", ["obs", "total"], ["y"], name="add")],
                        [numpy_helper.from_array(np.array([2_125_000_000], np.int64), "shape")]), tmp_path / "fill.onnx")
    np.save(tmp_path / "obs.npy", np.zeros((2, 4), np.float32))
    for backend in ("onnxruntime", "numpy"):  # the same limit, the same words
        message = refused(run_limited(["run", path, "-i", tmp_path / "obs.npy", "-o", tmp_path / "out.npz",
                                       "--backend", backend]))
        assert f'ConstantOfShape node "fill" on the {backend} backend: its output (float32, shape (2125000000,)) ' \
               f"would take 7.92 GiB (8,500,000,000 bytes), {ARRAY_LIMIT} one tensor sized from a value" in message
    assert not (tmp_path / "out.npz").exists()


def test_inspect_refuses_a_graph_above_the_node_limit_before_describing_it(tmp_path):
    from onnx import helper

    count = 300_000  # a chain of Relu nodes: 10 MB; described, 1.3 GB and 25 s (--json), minutes as a table
    nodes = [helper.make_node("Relu", [f"t{i}" if i else "obs"], [f"t{i + 1}" if i < count - 1 else "y"], name=f"r{i}")
             for i in range(count)]
    path = _save(_model(nodes), tmp_path / "deep.onnx")
    message = refused(run_limited(["inspect", path]))
    assert "the graph has 300,000 nodes, more than the limit of 200,000 nodes (the numpy backend's" in message
    assert "POLICYPORT_MAX_NODES=300000" in message
