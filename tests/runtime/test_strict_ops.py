"""Nodes whose attributes or inputs contradict their operator page are refused with the node's name.

Each case is a one-node model that onnxruntime refuses (and, where it can tell, ONNX shape inference in
strict mode). The numpy backend must refuse it too: at load when the attributes and constant inputs
decide it, else at run time, with a BadModelError that names the node — never silently compute
something. Valid neighbours of each case still run, with onnxruntime's result.
"""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import policyport as pp  # noqa: E402


def model(op_type, inputs, outputs, opset, inits=(), shape=(2, 3), **attrs):
    """One node "n0" reading graph input x (float32, ``shape``) and constant initializers ``inits``."""
    node = helper.make_node(op_type, inputs, outputs, name="n0", **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def i64(*values):
    return np.array(values, np.int64)


F32 = np.ones((3, 2), np.float32)

CASES = {
    # Split: sizes that do not add up, in every form the opsets have
    "split-13 equal parts of a length 3 axis": (model("Split", ["x"], ["a", "b"], 13, axis=1), "load",
                                                 r"an axis of length 3 cannot be split into 2 equal parts"),
    "split-13 sizes input [2, 2] of 5": (model("Split", ["x", "s"], ["a", "b"], 13, [("s", i64(2, 2))], (2, 5), axis=1),
                                         "load", r"split sizes \[2, 2\] add up to 4, but the axis has length 5"),
    "split-11 attribute [2, 2] of 5": (model("Split", ["x"], ["a", "b"], 11, (), (2, 5), axis=1, split=[2, 2]), "load",
                                       r"split sizes \[2, 2\] add up to 4, but the axis has length 5"),
    "split-11 negative size": (model("Split", ["x"], ["a", "b"], 11, (), (2, 5), axis=1, split=[6, -1]), "load",
                               r"include a negative size"),
    "split-11 three sizes, two outputs": (model("Split", ["x"], ["a", "b"], 11, (), (2, 5), axis=1, split=[1, 1, 3]),
                                          "load", r"give 3 parts for 2 outputs"),
    "split-18 split and num_outputs": (model("Split", ["x", "s"], ["a", "b"], 18, [("s", i64(2, 3))], (2, 5), axis=1,
                                             num_outputs=2), "load", r"both the split input and num_outputs"),
    "split-18 num_outputs against outputs": (model("Split", ["x"], ["a", "b"], 18, (), (2, 6), axis=1, num_outputs=3),
                                             "load", r"num_outputs is 3 but the node has 2 outputs"),
    "split axis out of range": (model("Split", ["x"], ["a", "b"], 13, (), (2, 6), axis=2), "load",
                                r"axis 2 is out of range for a rank-2 input"),
    # shapes and axes
    "transpose negative perm": (model("Transpose", ["x"], ["y"], 13, perm=[-1, 0]), "load",
                                r"perm \[-1, 0\] is not a permutation of 0..1"),
    "transpose perm of another rank": (model("Transpose", ["x"], ["y"], 13, perm=[0]), "load",
                                       r"perm \[0\] has 1 entries for a rank-2 input"),
    "softmax-11 axis 5": (model("Softmax", ["x"], ["y"], 11, axis=5), "run", r"axis 5 is out of range"),
    "logsoftmax-11 axis 5": (model("LogSoftmax", ["x"], ["y"], 11, axis=5), "run", r"axis 5 is out of range"),
    "hardmax-11 axis -3": (model("Hardmax", ["x"], ["y"], 11, axis=-3), "run", r"axis -3 is out of range"),
    "flatten axis 3 of rank 2": (model("Flatten", ["x"], ["y"], 13, axis=3), "run", r"axis 3 is out of range"),
    "layernorm axis 4 of rank 2": (model("LayerNormalization", ["x", "sc"], ["y"], 17, [("sc", np.ones(3, np.float32))],
                                         axis=4), "run", r"axis 4 is out of range"),
    "slice lists of other lengths": (model("Slice", ["x", "s", "e", "a"], ["y"], 13,
                                           [("s", i64(0, 0)), ("e", i64(1)), ("a", i64(0, 1))]), "load", r"differ in length"),
    "slice-1 lists of other lengths": (model("Slice", ["x"], ["y"], 9, starts=[0, 0], ends=[1], axes=[0, 1]), "load",
                                       r"starts \[0, 0\], ends \[1\], axes \[0, 1\] and steps None differ in length"),
    "slice-1 lists of other lengths without axes": (model("Slice", ["x"], ["y"], 9, starts=[0, 0], ends=[1]), "load",
                                                    r"starts \[0, 0\], ends \[1\], axes None and steps None differ"),
    "slice repeated axis": (model("Slice", ["x", "s", "e", "a"], ["y"], 13,
                                  [("s", i64(0, 1)), ("e", i64(1, 2)), ("a", i64(1, 1))]), "load", r"repeat an axis"),
    "slice axis repeated once negative": (model("Slice", ["x", "s", "e", "a"], ["y"], 13,
                                                [("s", i64(0, 1)), ("e", i64(1, 2)), ("a", i64(1, -1))]), "load",
                                          r"axes \[1, -1\] repeat an axis"),
    "slice axis out of range": (model("Slice", ["x", "s", "e", "a"], ["y"], 13,
                                      [("s", i64(0)), ("e", i64(1)), ("a", i64(2))]), "load", r"out of range for a rank-2"),
    "tile repeats of another rank": (model("Tile", ["x", "r"], ["y"], 13, [("r", i64(2))]), "load",
                                     r"repeats \[2\] has 1 entries for a rank-2 input"),
    "reshape dim below -1": (model("Reshape", ["x", "s"], ["y"], 13, [("s", i64(-2, 3))]), "load",
                             r"a dimension below -1"),
    "reshape size mismatch": (model("Reshape", ["x", "s"], ["y"], 13, [("s", i64(4, 2))]), "run",
                              r"cannot reshape array of size 6"),
    "gemm A of rank 3": (model("Gemm", ["x", "w"], ["y"], 13, [("w", F32)], (4, 2, 3)), "load",
                         r"A has rank 3; Gemm multiplies matrices"),
    "gemm A of rank 1": (model("Gemm", ["x", "w"], ["y"], 13, [("w", F32)], (3,)), "load", r"A has rank 1"),
    "gemm B of rank 3": (model("Gemm", ["x", "w"], ["y"], 13, [("w", np.ones((3, 2, 2), np.float32))]), "load",
                         r"B has rank 3; Gemm multiplies matrices"),
    "gemm C that does not broadcast": (model("Gemm", ["x", "w", "c"], ["y"], 13,
                                             [("w", F32), ("c", np.ones((5, 2, 2), np.float32))]), "load",
                                       r"C of shape \(5, 2, 2\) does not broadcast to \(M, N\)"),
    "concat axis out of range": (model("Concat", ["x", "x"], ["y"], 13, axis=2), "run", r"axis 2 is out of bounds"),
    "concat of other widths": (model("Concat", ["x", "w"], ["y"], 13, [("w", np.ones((2, 4), np.float32))], axis=0),
                               "run", r"dimensions except for the concatenation axis must match"),
    "gather index out of range": (model("Gather", ["x", "i"], ["y"], 13, [("i", i64(5))], axis=1), "run",
                                  r"index 5 is out of bounds"),
    "batchnorm one value for three channels": (model("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], 15,
                                                     [(k, np.ones(1, np.float32)) for k in "sbmv"], (2, 3, 4)), "run",
                                               r"scale of shape \(1,\) does not hold one value per channel"),
    "gelu approximate 'fast'": (model("Gelu", ["x"], ["y"], 20, approximate="fast"), "load",
                                r"approximate is 'fast'"),
    "dropout ratio 1.5": (model("Dropout", ["x", "r"], ["y"], 13, [("r", np.array(1.5, np.float32))]), "run",
                          r"ratio is 1.5; it must be in \[0, 1\)"),
    "clip bound that is not a scalar": (model("Clip", ["x", "lo"], ["y"], 13, [("lo", np.ones(3, np.float32))]), "load",
                                        r"min has shape \(3,\); it must be a scalar"),
    "clip bound of rank 2": (model("Clip", ["x", "lo"], ["y"], 13, [("lo", np.ones((1, 1), np.float32))]), "load",
                             r"min has shape \(1, 1\); it must be a scalar"),
    # element types the operator gives one type variable
    "add float32 + float64": (model("Add", ["x", "w"], ["y"], 13, [("w", np.ones((2, 3), np.float64))]), "load",
                              r"its inputs must share one element type; found input 0 float32, input 1 float64"),
    "concat float32 + float64": (model("Concat", ["x", "w"], ["y"], 13, [("w", np.ones((2, 3), np.float64))], axis=0),
                                 "load", r"must share one element type"),
    # a recurrent node lists its activations for every direction
    "bidirectional rnn with one activation": (
        model("RNN", ["x", "w", "r"], ["y"], 14, [("w", np.ones((2, 4, 3), np.float32)), ("r", np.ones((2, 4, 4), np.float32))],
              (2, 1, 3), hidden_size=4, direction="bidirectional", activations=["Tanh"]),
        "run", r"activations lists 1 functions; 2 expected \(1 per direction\)"),
    # a Constant takes exactly one value attribute
    "constant with two values": (model("Constant", [], ["y"], 13, value_float=1.0, value_int=2), "load",
                                 r"it has 2 value attributes \(value_float, value_int\); the operator takes exactly one"),
}


def onnx_refuses(m) -> bool:
    try:
        onnx.shape_inference.infer_shapes(m, strict_mode=True)
    except Exception:  # noqa: BLE001 - InferenceError and friends
        pass
    else:
        session_refused = False
        try:
            shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
            ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
                None, {"x": np.random.default_rng(0).random(shape).astype(np.float32)})
        except Exception:  # noqa: BLE001 - onnxruntime's own error types
            session_refused = True
        return session_refused
    return True


@pytest.mark.parametrize("name", list(CASES))
def test_a_node_the_spec_forbids_is_refused_with_its_name(name):
    m, when, message = CASES[name]
    assert onnx_refuses(m), "the oracle accepts this model: not a case the numpy backend must refuse"
    shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(0).random(shape).astype(np.float32)
    if when == "load":
        with pytest.raises(pp.BadModelError, match=r'node "n0" \(opset \d+\): .*' + message):
            pp.load(m)
    else:
        sess = pp.load(m)
        with pytest.raises(pp.BadModelError, match=r'node "n0" on the numpy backend failed: \w+: .*' + message):
            sess.run({"x": x})


VALID = {
    "split-13 equal parts of a length 4 axis": model("Split", ["x"], ["a", "b"], 13, (), (2, 4), axis=1),
    "split-11 sizes [2, 3] of 5": model("Split", ["x"], ["a", "b"], 11, (), (2, 5), axis=1, split=[2, 3]),
    "split-18 num_outputs 3 of 7": model("Split", ["x"], ["a", "b", "c"], 18, (), (2, 7), axis=1, num_outputs=3),
    "transpose perm [1, 0]": model("Transpose", ["x"], ["y"], 13, perm=[1, 0]),
    "slice negative axis": model("Slice", ["x", "s", "e", "a"], ["y"], 13, [("s", i64(1)), ("e", i64(3)), ("a", i64(-1))]),
    "tile repeats [2, 1]": model("Tile", ["x", "r"], ["y"], 13, [("r", i64(2, 1))]),
    "flatten axis 2 of rank 2": model("Flatten", ["x"], ["y"], 13, axis=2),
    "gemm C row": model("Gemm", ["x", "w", "c"], ["y"], 13, [("w", F32), ("c", np.ones((1, 2), np.float32))]),
    "clip bound of shape (1,)": model("Clip", ["x", "lo"], ["y"], 13, [("lo", np.full(1, 0.5, np.float32))]),
    "reduce-sum repeated axis": model("ReduceSum", ["x", "a"], ["y"], 13, [("a", i64(1, 1))]),
    "constant with one value": model("Constant", [], ["y"], 13, value_floats=[1.5, -2.0]),
    "bidirectional rnn with two activations": model(
        "RNN", ["x", "w", "r"], ["y"], 14, [("w", np.full((2, 4, 3), 0.1, np.float32)), ("r", np.full((2, 4, 4), 0.1, np.float32))],
        (2, 1, 3), hidden_size=4, direction="bidirectional", activations=["Tanh", "Relu"]),
}


@pytest.mark.parametrize("name", list(VALID))
def test_valid_neighbours_still_run_as_onnxruntime_does(name):
    m = VALID[name]
    shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(1).random(shape).astype(np.float32)
    ours = pp.load(m).run({"x": x})
    theirs = pp.load(m, backend="onnxruntime").run({"x": x})
    for k in ours:
        np.testing.assert_allclose(ours[k], theirs[k], rtol=1e-6)


def test_a_slice_with_axes_of_an_input_of_unknown_rank_loads_and_runs():
    node = helper.make_node("Slice", ["x", "s", "e", "a"], ["y"], name="n0")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(i64(*v), k) for k, v in (("s", (1,)), ("e", (3,)), ("a", (-1,)))])
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    got = pp.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])).run({"x": x})["y"]
    np.testing.assert_array_equal(got, x[:, 1:3])
