"""The graph passes rule by rule: what widen_to_float64 widens and leaves, prune's names and what it
drops, the parameter metadata (transposes, tied and zero parameters, malformed entries), which
initializers are parameters, free_dims, and expose's typing of tensors inference cannot type."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from policyport.errors import BadModelError, InputMismatchError
from policyport.graph.model import from_onnx
from policyport.graph.passes import (
    PARAMETERS_KEY,
    extract_weights,
    free_dims,
    parameter_map,
    parameter_names,
    widen_to_float64,
)
import policyport.runtime.expose as exposing
from policyport.runtime.expose import expose, prune


def _model(nodes, inputs, outputs, initializers=(), opset=17, value_info=(), metadata=None):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers), value_info=list(value_info))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    for key, value in (metadata or {}).items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    return model


def _vi(name, elem=TensorProto.FLOAT, shape=("batch", 2)):
    return helper.make_tensor_value_info(name, elem, list(shape) if shape is not None else None)


# ------------------------------------------------------------------------------------ widen_to_float64


def _typed_graph():
    nodes = [
        helper.make_node("Cast", ["x"], ["c32"], name="c32", to=TensorProto.FLOAT),
        helper.make_node("Cast", ["x"], ["c16"], name="c16", to=TensorProto.FLOAT16),
        helper.make_node("Cast", ["x"], ["cb16"], name="cb16", to=TensorProto.BFLOAT16),
        helper.make_node("Cast", ["x"], ["ci"], name="ci", to=TensorProto.INT64),
        helper.make_node("Cast", ["x"], ["cc"], name="cc", to=TensorProto.COMPLEX64),
        helper.make_node("RandomNormalLike", ["x"], ["r"], name="r", dtype=TensorProto.FLOAT),
        helper.make_node("LayerNormalization", ["x", "scale"], ["ln"], name="ln"),
        helper.make_node("LayerNormalization", ["x", "scale"], ["ln1"], name="ln1", stash_type=1),
        helper.make_node("Constant", [], ["k1"], name="k1", value_float=0.1),
        helper.make_node("Constant", [], ["k2"], name="k2", value_floats=[0.1, 0.2]),
        helper.make_node("Constant", [], ["k3"], name="k3", value=numpy_helper.from_array(np.array([0.1], np.float32))),
        helper.make_node("Constant", [], ["k4"], name="k4", value=numpy_helper.from_array(np.array([3], np.int64))),
        helper.make_node("ConstantOfShape", ["shape"], ["z"], name="z"),
        helper.make_node("ConstantOfShape", ["shape"], ["z16"], name="z16",
                         value=numpy_helper.from_array(np.array([1.5], np.float16))),
        helper.make_node("Add", ["x", "w"], ["y"], name="y"),
    ]
    inits = [numpy_helper.from_array(np.full(2, 0.1, np.float32), "w"),
             numpy_helper.from_array(np.ones(2, np.float16), "scale"),
             numpy_helper.from_array(np.array([2], np.int64), "shape"),
             numpy_helper.from_array(np.array([True]), "flag")]
    return from_onnx(_model(nodes, [_vi("x")], [_vi("y")], inits))


def test_widen_changes_every_float_element_type_and_nothing_else():
    graph = _typed_graph()
    wide = widen_to_float64(graph)
    attrs = {n.name: n.attrs for n in wide.nodes}
    assert [attrs[k]["to"] for k in ("c32", "c16", "cb16", "ci", "cc")] == [11, 11, 11, 7, 15]
    assert attrs["r"]["dtype"] == 11
    assert attrs["ln"]["stash_type"] == 11 and attrs["ln1"]["stash_type"] == 11
    assert attrs["k1"]["value"].dtype == np.float64 and attrs["k1"]["value"] == np.float64(np.float32(0.1))
    assert "value_float" not in attrs["k1"] and "value_floats" not in attrs["k2"]
    assert attrs["k2"]["value"].dtype == np.float64 and attrs["k2"]["value"].shape == (2,)
    assert attrs["k3"]["value"].dtype == np.float64 and attrs["k4"]["value"].dtype == np.int64
    assert attrs["z"]["value"].dtype == np.float64 and attrs["z"]["value"].tolist() == [0.0]
    assert attrs["z16"]["value"].dtype == np.float64 and attrs["z16"]["value"].tolist() == [1.5]
    inits = wide.initializers
    assert (inits["w"].dtype, inits["scale"].dtype, inits["shape"].dtype, inits["flag"].dtype) == (
        np.float64, np.float64, np.int64, np.bool_)
    assert inits["w"].tolist() == [np.float64(np.float32(0.1))] * 2
    assert [v.dtype for v in wide.inputs] == [np.float64] and [v.dtype for v in wide.outputs] == [np.float64]


def test_widen_leaves_its_argument_alone():
    graph = _typed_graph()
    widen_to_float64(graph)
    attrs = {n.name: n.attrs for n in graph.nodes}
    assert attrs["c32"]["to"] == 1 and "stash_type" not in attrs["ln"] and "value_float" in attrs["k1"]
    assert "value" not in attrs["z"] and graph.initializers["w"].dtype == np.float32
    assert graph.inputs[0].dtype == np.float32


def test_widen_optional_inputs_and_complex():
    w = numpy_helper.from_array(np.ones(2, np.float32), "w")
    model = _model([helper.make_node("Add", ["x", "w"], ["y"], name="y")], [_vi("x"), _vi("w", shape=(2,))],
                   [_vi("y")], [w])
    graph = from_onnx(model)
    assert [v.name for v in graph.optional_inputs] == ["w"]
    assert [v.dtype for v in widen_to_float64(graph).optional_inputs] == [np.float64]
    c = from_onnx(_model([helper.make_node("Identity", ["x"], ["y"], name="y")], [_vi("x", TensorProto.COMPLEX64)],
                         [_vi("y", TensorProto.COMPLEX64)]))
    assert widen_to_float64(c).inputs[0].dtype == np.complex128


# ------------------------------------------------------------------------------------ prune


def _branches():
    """x -> a = Relu(x) -> y1 = a + w1; x -> b = Tanh(x2) -> y2 = b * w2 (x2 feeds only y2)."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="a"), helper.make_node("Add", ["a", "w1"], ["y1"], name="y1"),
             helper.make_node("Tanh", ["x2"], ["b"], name="b"), helper.make_node("Mul", ["b", "w2"], ["y2"], name="y2")]
    inits = [numpy_helper.from_array(np.ones(2, np.float32), "w1"), numpy_helper.from_array(np.ones(2, np.float32), "w2")]
    return _model(nodes, [_vi("x"), _vi("x2")], [_vi("y1"), _vi("y2")], inits, value_info=[_vi("a"), _vi("b")])


def test_prune_keeps_what_the_chosen_outputs_need_in_the_order_given():
    source = _branches()
    before = source.SerializeToString()
    pruned = prune(source, " y2 , y2 ,, ")
    assert source.SerializeToString() == before
    assert [n.name for n in pruned.graph.node] == ["b", "y2"]
    assert [o.name for o in pruned.graph.output] == ["y2"]
    assert [t.name for t in pruned.graph.initializer] == ["w2"]
    assert [v.name for v in pruned.graph.input] == ["x2"]
    assert [v.name for v in pruned.graph.value_info] == ["b"]
    both = prune(source, ["y2", "y1"])
    assert [o.name for o in both.graph.output] == ["y2", "y1"] and [n.name for n in both.graph.node] == ["a", "y1", "b", "y2"]


def test_prune_makes_a_node_output_a_typed_graph_output():
    pruned = prune(_branches(), "a")
    assert [n.name for n in pruned.graph.node] == ["a"] and [v.name for v in pruned.graph.input] == ["x"]
    out = pruned.graph.output[0]
    assert out.name == "a" and out.type.tensor_type.elem_type == TensorProto.FLOAT
    assert [d.dim_param or d.dim_value for d in out.type.tensor_type.shape.dim] == ["batch", 2]


@pytest.mark.parametrize("names,shown", [("nope", "['nope']"), (",", "[]"), (["y1", "zz"], "['zz']")])
def test_prune_refuses_names_that_are_no_tensors_listing_the_outputs(names, shown):
    with pytest.raises(InputMismatchError) as caught:
        prune(_branches(), names)
    assert str(caught.value) == f"--outputs {shown}: not tensors of the model; its graph outputs are y1, y2"


# ------------------------------------------------------------------------------------ parameters


def _linear(metadata=None, w=None):
    w = np.arange(6, dtype=np.float32).reshape(2, 3) if w is None else w
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "B"),
             numpy_helper.from_array(np.array([-1, 2], np.int64), "shape")]
    nodes = [helper.make_node("Gemm", ["x", "W", "B"], ["h"], name="h", transB=1),
             helper.make_node("Reshape", ["h", "shape"], ["y"], name="y")]
    return _model(nodes, [_vi("x", shape=("batch", 3))], [_vi("y")], inits, metadata=metadata)


def test_without_metadata_each_parameter_maps_to_itself():
    assert parameter_map(_linear()) == {
        "W": {"name": "W", "transpose": None, "zeros": None, "value": None, "also": []},
        "B": {"name": "B", "transpose": None, "zeros": None, "value": None, "also": []}}
    weights = extract_weights(_linear())
    assert list(weights) == ["W", "B"] and weights["W"].shape == (2, 3)


def test_metadata_maps_names_undoes_transposes_and_copies_tied_parameters():
    meta = {PARAMETERS_KEY: json.dumps({"W": {"name": "fc/kernel", "transpose": [1, 0], "also": ["tied/kernel"]},
                                        "B": "fc/bias"})}
    model = _linear(meta)
    assert parameter_map(model)["B"] == {"name": "fc/bias", "transpose": None, "zeros": None, "value": None, "also": []}
    weights = extract_weights(model)
    assert list(weights) == ["fc/kernel", "tied/kernel", "fc/bias"]
    kernel = np.arange(6, dtype=np.float32).reshape(2, 3).T
    assert np.array_equal(weights["fc/kernel"], kernel) and weights["fc/kernel"].flags.c_contiguous
    assert np.array_equal(weights["tied/kernel"], kernel) and weights["tied/kernel"] is not weights["fc/kernel"]
    weights["tied/kernel"][0, 0] = 99.0
    assert weights["fc/kernel"][0, 0] == 0.0


def test_a_three_axis_transpose_is_undone_by_its_inverse():
    w = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    stored = np.transpose(w, (2, 0, 1))  # what the converter wrote: source.transpose(perm)
    model = _model([helper.make_node("Mul", ["x", "W"], ["y"], name="y")], [_vi("x", shape=(4, 2, 3))],
                   [_vi("y", shape=(4, 2, 3))], [numpy_helper.from_array(np.ascontiguousarray(stored), "W")],
                   metadata={PARAMETERS_KEY: json.dumps({"W": {"name": "w", "transpose": [2, 0, 1]}})})
    assert np.array_equal(extract_weights(model)["w"], w)


def test_zero_parameters_an_exporter_dropped_are_rebuilt():
    meta = {PARAMETERS_KEY: json.dumps({"W": "fc/kernel", "fc/bias": {"name": "fc/bias", "zeros": {"shape": [2], "dtype": "float32"}}})}
    weights = extract_weights(_linear(meta))
    assert list(weights) == ["fc/kernel", "fc/bias"]
    assert weights["fc/bias"].dtype == np.float32 and weights["fc/bias"].tolist() == [0.0, 0.0]
    held = {PARAMETERS_KEY: json.dumps({"B": {"name": "fc/bias", "zeros": {"shape": [2], "dtype": "float32"}}})}
    with pytest.raises(BadModelError, match="rebuilds 'B' as zeros, but the graph holds it"):
        extract_weights(_linear(held))


@pytest.mark.parametrize("raw,message", [
    ("{not json", "is not valid JSON"),
    (json.dumps({"W": {"transpose": [1, 0]}}), "is malformed: 'name'"),
    (json.dumps({"b": {"name": "b", "zeros": {"shape": [2], "dtype": "complex64"}}}), "rebuilds zeros of dtype complex64"),
    (json.dumps({"b": {"name": "b", "zeros": {"shape": [-2], "dtype": "float32"}}}), r"shape \[-2\]"),
    (json.dumps(["W"]), "is malformed"),
])
def test_malformed_parameter_metadata_is_a_bad_model(raw, message):
    with pytest.raises(BadModelError, match=f"metadata 'policyport.parameters' {message}" if message.startswith("is")
                       else message):
        parameter_map(_linear({PARAMETERS_KEY: raw}))


def test_two_initializers_naming_one_parameter_are_refused():
    meta = {PARAMETERS_KEY: json.dumps({"W": "p", "B": "p"})}
    with pytest.raises(BadModelError, match="two initializers map to the source parameter 'p'"):
        extract_weights(_linear(meta))


def test_which_initializers_are_parameters():
    f = np.ones(2, np.float32)
    inits = [numpy_helper.from_array(f, n) for n in ("w", "via_identity", "shape_only", "passed_on", "clip_min")]
    inits += [numpy_helper.from_array(np.array([2], np.int64), "ints"), numpy_helper.from_array(f.astype(np.float16), "half")]
    nodes = [helper.make_node("Add", ["x", "w"], ["a"], name="a"),
             helper.make_node("Identity", ["via_identity"], ["alias"], name="alias"),
             helper.make_node("Identity", ["alias"], ["alias2"], name="alias2"),
             helper.make_node("Mul", ["a", "alias2"], ["b"], name="b"),
             helper.make_node("Shape", ["shape_only"], ["s"], name="s"),
             helper.make_node("Identity", ["passed_on"], ["out2"], name="out2"),
             helper.make_node("Clip", ["b", "clip_min"], ["c"], name="c"),
             helper.make_node("Reshape", ["c", "ints"], ["y"], name="y"),
             helper.make_node("Sub", ["y", "half"], ["z"], name="z")]
    graph = _model(nodes, [_vi("x", shape=(2,))], [_vi("z", shape=(2,)), _vi("out2", shape=(2,)),
                                                   _vi("s", TensorProto.INT64, (1,))], inits).graph
    assert parameter_names(graph) == {"w", "via_identity", "half"}


# ------------------------------------------------------------------------------------ free_dims


def test_free_dims_frees_zero_and_negative_dims_in_a_copy():
    plain = _linear()
    assert free_dims(plain) is plain
    model = _model([helper.make_node("Relu", ["x"], ["y"], name="y")], [_vi("x", shape=(-1, 3))], [_vi("y", shape=(0, 3))],
                   value_info=[_vi("v", shape=(2, -5))])
    before = model.SerializeToString()
    freed = free_dims(model)
    assert model.SerializeToString() == before and freed is not model

    def dims(info):
        return [(d.HasField("dim_value"), d.dim_value) for d in info.type.tensor_type.shape.dim]

    assert dims(freed.graph.input[0]) == [(False, 0), (True, 3)]
    assert dims(freed.graph.output[0]) == [(False, 0), (True, 3)]
    assert dims(freed.graph.value_info[0]) == [(True, 2), (False, 0)]


# ------------------------------------------------------------------------------------ expose


def test_expose_types_a_tensor_of_a_foreign_domain_by_running_it_on_onnxruntime():
    """com.microsoft's FastGelu: ONNX shape inference does not know it and the numpy backend lacks it,
    so its output is typed (element type and rank) from one onnxruntime run."""
    nodes = [helper.make_node("FastGelu", ["x"], ["g"], name="g", domain="com.microsoft"),
             helper.make_node("Relu", ["g"], ["y"], name="y")]
    graph = helper.make_graph(nodes, "g", [_vi("x", shape=(2, 3))], [_vi("y", shape=None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    exposed = expose(model, "g")
    types = {o.name: o.type.tensor_type for o in exposed.graph.output}
    assert list(types) == ["y", "g"]
    assert types["g"].elem_type == TensorProto.FLOAT and len(types["g"].shape.dim) == 2
    assert all(not d.HasField("dim_value") for d in types["g"].shape.dim)
    assert types["y"].elem_type == TensorProto.FLOAT and len(types["y"].shape.dim) == 2


def test_expose_says_why_a_tensor_cannot_be_typed():
    nodes = [helper.make_node("NoSuchOp", ["x"], ["g"], name="g", domain="example.nowhere"),
             helper.make_node("Relu", ["g"], ["y"], name="y")]
    graph = helper.make_graph(nodes, "g", [_vi("x", shape=(2, 3))], [_vi("y", shape=(2, 3))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("example.nowhere", 1)])
    model.ir_version = 8
    with pytest.raises(BadModelError, match=r"cannot expose 'g': ONNX shape inference gives it no element type, "
                                            r"and one run of the model to find it failed \(Fail: .*NoSuchOp"):
        expose(model, "g")
    onnx.checker.check_model(expose(_linear(), "*"), full_check=True)


# ------------------------------------------------------------------------------------ more rules


def test_each_pass_names_the_extra_that_installs_onnx(monkeypatch):
    import policyport.graph.passes as passes
    import policyport.runtime.expose as exposing
    from policyport.errors import MissingDependencyError

    def missing(module, extra, purpose):
        raise MissingDependencyError(module, extra, purpose)

    monkeypatch.setattr(passes, "require", missing)
    monkeypatch.setattr(exposing, "require", missing)
    for call, purpose in [(lambda: extract_weights(_linear()), "extracting weights"),
                          (lambda: expose(_linear()), "exposing tensors"),
                          (lambda: passes.infer_shapes(_linear()), "inferring tensor shapes")]:
        with pytest.raises(MissingDependencyError) as caught:
            call()
        assert str(caught.value) == (f"{purpose} needs the Python package 'onnx', which is not installed; "
                                     "install it with: pip install 'policyport[onnx]'")


def test_typing_by_onnxruntime_names_its_extra_too(monkeypatch):
    import policyport.runtime.expose as passes
    from policyport.errors import MissingDependencyError, require

    model = _fast_gelu()
    graph = from_onnx(model)
    feeds = {"x": np.zeros((2, 3), np.float32)}
    for absent in ("onnx", "onnxruntime"):
        def partly(module, extra, purpose, absent=absent):
            if module == absent:
                raise MissingDependencyError(module, extra, purpose)
            return require(module, extra, purpose)

        monkeypatch.setattr(passes, "require", partly)
        with pytest.raises(MissingDependencyError) as caught:
            passes._run_untyped(model, graph, feeds, ["g"])
        assert str(caught.value) == (f"finding the type of a tensor needs the Python package '{absent}', which is "
                                     "not installed; install it with: pip install 'policyport[onnx]'")


def _fast_gelu():
    nodes = [helper.make_node("FastGelu", ["x"], ["g"], name="g", domain="com.microsoft"),
             helper.make_node("Relu", ["g"], ["y"], name="y")]
    graph = helper.make_graph(nodes, "g", [_vi("x", shape=(2, 3))], [_vi("y", shape=None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    return model


def test_run_untyped_computes_only_what_the_names_need_on_numpy():
    import policyport.graph.passes as passes

    model = _branches()
    feeds = {"x": np.array([[-1.0, 2.0]], np.float32), "x2": np.array([[0.5, 0.0]], np.float32)}
    values = exposing._run_untyped(model, from_onnx(model), feeds, ["b", "a"])
    assert np.array_equal(values[0], np.tanh(feeds["x2"])) and np.array_equal(values[1], [[0.0, 2.0]])
    assert exposing._run_untyped(_fast_gelu(), from_onnx(_fast_gelu()), {"x": np.zeros((2, 3), np.float32)},
                               ["g"])[0].shape == (2, 3)


def test_zero_parameters_may_be_empty_and_unplaced_entries_are_skipped():
    meta = {PARAMETERS_KEY: json.dumps({"gone": "nowhere", "empty": {"name": "e", "zeros": {"shape": [0, 2], "dtype": "int64"}},
                                        "W": "w"})}
    weights = extract_weights(_linear(meta))
    assert list(weights) == ["e", "w"] and weights["e"].shape == (0, 2) and weights["e"].dtype == np.int64


def test_expose_exact_takes_patterns_as_names():
    with pytest.raises(InputMismatchError):
        expose(_branches(), "y*", exact=True)
    assert [o.name for o in expose(_branches(), "a", exact=True).graph.output] == ["y1", "y2", "a"]
    assert [o.name for o in expose(_branches(), "[ab]").graph.output] == ["y1", "y2", "a", "b"]


def test_a_shapeless_graph_output_gets_the_shape_inference_gives():
    model = _model([helper.make_node("Relu", ["x"], ["y"], name="y")], [_vi("x", shape=("batch", 4))], [_vi("y", shape=None)])
    out = expose(model).graph.output[0]
    assert [d.dim_param or d.dim_value for d in out.type.tensor_type.shape.dim] == ["batch", 4]


def _computed_reshape():
    """y = Reshape(x, Concat(Shape(x)[0:1], [6])): only data propagation tells y is (batch, 6)."""
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="s"),
             helper.make_node("Slice", ["s", "zero", "one"], ["b"], name="b"),
             helper.make_node("Concat", ["b", "six"], ["shape"], name="shape", axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["y"], name="y")]
    inits = [numpy_helper.from_array(np.array([0], np.int64), "zero"), numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.array([6], np.int64), "six")]
    return _model(nodes, [_vi("x", shape=("batch", 2, 3))], [_vi("y", shape=None)], inits)


def test_infer_shapes_propagates_computed_shapes():
    import policyport.graph.passes as passes

    inferred = passes.infer_shapes(_computed_reshape())
    y = next(o for o in inferred.graph.output if o.name == "y")
    assert [d.dim_param or d.dim_value for d in y.type.tensor_type.shape.dim] == ["batch", 6]


def test_widen_complex_and_integer_inputs_and_layer_norm_only():
    inits = [numpy_helper.from_array(np.array([1 + 2j], np.complex64), "c")]
    model = _model([helper.make_node("Add", ["x", "c"], ["y"], name="y"), helper.make_node("Identity", ["i"], ["j"], name="j")],
                   [_vi("x", TensorProto.COMPLEX64, (1,)), _vi("i", TensorProto.INT64, (1,))],
                   [_vi("y", TensorProto.COMPLEX64, (1,)), _vi("j", TensorProto.INT64, (1,))], inits)
    wide = widen_to_float64(from_onnx(model))
    assert wide.initializers["c"].dtype == np.complex128 and wide.initializers["c"].tolist() == [1 + 2j]
    assert [v.dtype for v in wide.inputs] == [np.complex128, np.int64]
    assert [v.dtype for v in wide.outputs] == [np.complex128, np.int64]
    assert all("stash_type" not in n.attrs for n in wide.nodes)


def test_free_dims_keeps_dims_of_one():
    model = _model([helper.make_node("Relu", ["x"], ["y"], name="y")], [_vi("x", shape=(1, -1))], [_vi("y", shape=(1, 3))])
    freed = free_dims(model)
    assert [d.dim_value for d in freed.graph.input[0].type.tensor_type.shape.dim] == [1, 0]
    assert not freed.graph.input[0].type.tensor_type.shape.dim[1].HasField("dim_value")
    assert [d.dim_value for d in freed.graph.output[0].type.tensor_type.shape.dim] == [1, 3]


# ------------------------------------------------------------------------------------ split_at


def _chain(extra_nodes=(), extra_outputs=()):
    """y = (Relu(x) * w + Relu(x)) - Neg(x): a cut at "a" (the Relu) leaves Neg in the first stage."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="a"),
             helper.make_node("Neg", ["x"], ["n"], name="n"),
             helper.make_node("Mul", ["a", "w"], ["b"], name="b"),
             helper.make_node("Add", ["b", "a"], ["c"], name="c"),
             helper.make_node("Sub", ["c", "n"], ["y"], name="y"),
             *extra_nodes]
    inits = [numpy_helper.from_array(np.array([2.0, -3.0], np.float32), "w")]
    return _model(nodes, [_vi("x")], [_vi("y"), *extra_outputs], inits)


def _run_stages(stages, feeds):
    import onnxruntime as ort

    values = dict(feeds)
    for stage in stages:
        session = ort.InferenceSession(stage.model.SerializeToString(), providers=["CPUExecutionProvider"])
        values.update(zip(stage.outputs, session.run(stage.outputs, {n: values[n] for n in stage.inputs})))
    return values


def test_split_at_one_tensor_makes_two_stages_that_compute_the_model():
    from policyport.graph.passes import split_at

    model = _chain()
    before = model.SerializeToString()
    stages = split_at(model, ["a"])
    assert model.SerializeToString() == before
    assert [(s.inputs, s.outputs) for s in stages] == [(["x"], ["a", "n"]), (["a", "n"], ["y"])]
    assert [[n.name for n in s.model.graph.node] for s in stages] == [["a", "n"], ["b", "c", "y"]]
    assert [[t.name for t in s.model.graph.initializer] for s in stages] == [[], ["w"]]
    assert [s.model.graph.name for s in stages] == ["g_stage0", "g_stage1"]
    for stage in stages:
        assert stage.model.opset_import == model.opset_import and stage.model.ir_version == model.ir_version
        for v in [*stage.model.graph.input, *stage.model.graph.output]:
            assert v.type.tensor_type.elem_type == TensorProto.FLOAT
            assert [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] == ["batch", 2]
        onnx.checker.check_model(stage.model, full_check=True)
    x = np.array([[-1.0, 2.0], [3.0, -4.0]], np.float32)
    values = _run_stages(stages, {"x": x})
    a = np.maximum(x, 0)
    assert np.array_equal(values["y"], a * np.array([2.0, -3.0], np.float32) + a + x)


def test_split_at_several_tensors_and_kept_tensors():
    from policyport.graph.passes import split_at

    stages = split_at(_chain(), ["a", "b"], keep=["c"])
    assert [(s.inputs, s.outputs) for s in stages] == [(["x"], ["a", "n"]), (["a"], ["b"]), (["b", "a", "n"], ["c", "y"])]
    assert [[n.name for n in s.model.graph.node] for s in stages] == [["a", "n"], ["b"], ["c", "y"]]
    assert [[t.name for t in s.model.graph.initializer] for s in stages] == [[], ["w"], []]
    x = np.array([[0.5, -0.5]], np.float32)
    values = _run_stages(stages, {"x": x})
    assert np.array_equal(values["c"], np.array([[1.5, 0.0]], np.float32))
    assert np.array_equal(values["y"], np.array([[2.0, -0.5]], np.float32))
    # without cuts the whole graph is one stage returning its outputs
    assert [(s.inputs, s.outputs) for s in split_at(_chain(), [])] == [(["x"], ["y"])]


def test_split_at_leaves_out_a_stage_that_returns_nothing():
    from policyport.graph.passes import split_at

    unused = helper.make_node("Abs", ["y"], ["unused"], name="unused")
    stages = split_at(_chain([unused]), ["y"])
    assert [(s.inputs, s.outputs) for s in stages] == [(["x"], ["y"])]
    assert [n.name for n in stages[0].model.graph.node] == ["a", "n", "b", "c", "y"]


def test_split_at_refuses_tensors_no_node_makes_and_tensors_inference_cannot_type():
    from policyport.graph.passes import split_at

    with pytest.raises(InputMismatchError, match=r"^cannot split at \['x', 'zz'\]: no node produces them$"):
        split_at(_chain(), ["a", "x", "zz"])
    with pytest.raises(BadModelError, match=r"^cannot split the model at 'g': ONNX shape inference gives it no "
                                            r"element type$"):
        split_at(_fast_gelu(), ["g"])


def test_split_at_carries_the_model_local_functions():
    from policyport.graph.passes import split_at

    double = helper.make_function("local", "Double", ["t"], ["u"], [helper.make_node("Add", ["t", "t"], ["u"])],
                                  [helper.make_opsetid("", 17)])
    nodes = [helper.make_node("Double", ["x"], ["d"], name="d", domain="local"),
             helper.make_node("Relu", ["d"], ["y"], name="y")]
    graph = helper.make_graph(nodes, "", [_vi("x")], [_vi("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
                              functions=[double])
    model.ir_version = 8
    stages = split_at(model, ["d"])
    assert [s.model.graph.name for s in stages] == ["graph_stage0", "graph_stage1"]
    assert all([f.name for f in s.model.functions] == ["Double"] for s in stages)
    values = _run_stages(stages, {"x": np.array([[-1.0, 2.0]], np.float32)})
    assert values["d"].tolist() == [[-2.0, 4.0]] and values["y"].tolist() == [[0.0, 4.0]]


# ------------------------------------------------------------------------------------ rebuilt entries, order


def test_zero_and_value_entries_keep_bool_unsigned_and_float_dtypes_and_empty_shapes():
    entries = {"flag": {"name": "flag", "zeros": {"shape": [2], "dtype": "bool"}},
               "count": {"name": "count", "zeros": {"shape": [1], "dtype": "uint8"}},
               "mask": {"name": "mask", "value": {"dtype": "bool", "shape": [2], "data": [True, False]}},
               "steps": {"name": "steps", "value": {"dtype": "uint16", "shape": [1], "data": [7]}},
               "scale": {"name": "scale", "value": {"dtype": "float32", "shape": [2], "data": [0.1, 2.5]}},
               "none": {"name": "none", "value": {"dtype": "int64", "shape": [0, 3], "data": []}},
               "full": {"name": "full", "value": {"dtype": "int8", "shape": [8, 8], "data": [1] * 64}}}
    weights = extract_weights(_linear({PARAMETERS_KEY: json.dumps(entries)}))
    assert {k: (v.dtype.name, v.shape) for k, v in weights.items()} == {
        "flag": ("bool", (2,)), "count": ("uint8", (1,)), "mask": ("bool", (2,)), "steps": ("uint16", (1,)),
        "scale": ("float32", (2,)), "none": ("int64", (0, 3)), "full": ("int8", (8, 8))}
    assert weights["flag"].tolist() == [False, False] and weights["mask"].tolist() == [True, False]
    assert weights["scale"].tolist() == [np.float32(0.1), 2.5] and int(weights["steps"][0]) == 7


@pytest.mark.parametrize("value,message", [
    ({"dtype": "int64", "shape": [2], "data": [1]}, "rebuilds 1 values of dtype int64 and shape [2]"),
    ({"dtype": "int64", "shape": [-1], "data": [1]}, "rebuilds 1 values of dtype int64 and shape [-1]"),
    ({"dtype": "float32", "shape": [65], "data": [0.0] * 65}, "rebuilds 65 values of dtype float32 and shape [65]"),
    ({"dtype": "str", "shape": [1], "data": ["a"]}, "rebuilds 1 values of dtype <U0 and shape [1]"),
])
def test_a_malformed_value_entry_says_what_it_rebuilds(value, message):
    with pytest.raises(BadModelError) as caught:
        parameter_map(_linear({PARAMETERS_KEY: json.dumps({"v": {"name": "v", "value": value}})}))
    assert str(caught.value) == f"metadata 'policyport.parameters' is malformed: 'v' {message}"


def test_names_the_recorded_order_leaves_out_follow_in_their_own_order():
    meta = {PARAMETERS_KEY: json.dumps({"W": "fc/kernel", "B": "fc/bias",
                                        "z": {"name": "z", "zeros": {"shape": [1], "dtype": "float32"}}}),
            "policyport.parameter_order": json.dumps(["fc/bias"])}
    assert list(extract_weights(_linear(meta))) == ["fc/bias", "fc/kernel", "z"]
    meta["policyport.parameter_order"] = "[not json"
    with pytest.raises(BadModelError, match=r"^model metadata 'policyport.parameter_order' is not valid JSON: Expecting value"):
        extract_weights(_linear(meta))


def test_run_untyped_never_runs_nodes_the_names_do_not_need():
    """A node no runtime can run, on a branch the names do not need, is never run."""
    import policyport.graph.passes as passes

    nodes = [helper.make_node("Relu", ["x"], ["a"], name="a"),
             helper.make_node("NoSuchOp", ["x"], ["odd"], name="odd", domain="example.nowhere"),
             helper.make_node("Neg", ["a"], ["b"], name="b")]
    graph = helper.make_graph(nodes, "g", [_vi("x", shape=(1, 2))], [_vi("b", shape=(1, 2)), _vi("odd", shape=None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("example.nowhere", 1)])
    model.ir_version = 8
    values = exposing._run_untyped(model, from_onnx(model), {"x": np.array([[-1.0, 2.0]], np.float32)}, ["b", "a"])
    assert values[0].tolist() == [[-0.0, -2.0]] and values[1].tolist() == [[0.0, 2.0]]


def test_expose_keeps_the_element_type_of_a_tensor_of_unknown_rank():
    """A tensor inference leaves rank-less but declares typed (a value_info without a shape), which no run can
    reach, is exposed with that element type and no shape."""
    nodes = [helper.make_node("NoSuchOp", ["x"], ["g"], name="g", domain="example.nowhere"),
             helper.make_node("Relu", ["g"], ["y"], name="y")]
    graph = helper.make_graph(nodes, "g", [_vi("x", shape=(2, 3))], [_vi("y", shape=(2, 3))],
                              value_info=[_vi("g", TensorProto.DOUBLE, shape=None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("example.nowhere", 1)])
    model.ir_version = 8
    out = expose(model, "g").graph.output
    assert [o.name for o in out] == ["y", "g"]
    assert out[1].type.tensor_type.elem_type == TensorProto.DOUBLE and not out[1].type.tensor_type.HasField("shape")
