"""The Keras converter's graph passes, on ONNX graphs shaped as tf2onnx writes them (no TensorFlow).

tf2onnx names tensors after TensorFlow's scopes (``StatefulPartitionedCall/fc/BiasAdd:0``), folds
normalizations into anonymous constants and drops all-zero biases; these passes give the graph the
Keras layers' names back. Each pass is run here on a small graph built by hand, its result read node
by node, and where it computes something the graph is run by onnxruntime against numpy.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import policyport as pp
from policyport.converter import ConvertOptions
from policyport.converter.sources import keras as kc

RNG = np.random.default_rng(7)


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _graph(nodes, inputs=(("obs", [None, 4]),), inits=(), outputs=(), elem=TensorProto.FLOAT):
    """A ``_Graph`` over a model of ``nodes``; ``inits``: {name: array} or names (a float32 ones(4))."""
    arrays = inits if isinstance(inits, dict) else {n: np.ones(4, np.float32) for n in inits}
    graph = helper.make_graph(nodes, "g", [_vi(n, s, elem) for n, s in inputs], [_vi(n, s, elem) for n, s in outputs],
                              [numpy_helper.from_array(a, n) for n, a in arrays.items()])
    return kc._Graph(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def _listing(graph):
    return [(n.op_type, n.name, list(n.input), list(n.output)) for n in graph.g.node]


def _run(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


# ------------------------------------------------------------------------------------- _Graph


def test_the_graph_view_counts_only_inputs_that_are_not_initializers():
    g = _graph([], inputs=[("obs", [None, 4]), ("W", [4])], inits=["W", "b"])
    assert g.inputs == ["obs"] and sorted(g.init) == ["W", "b"] and g.g is g.proto.graph
    assert g.init["W"] is g.g.initializer[0]


def test_producers_map_every_output_of_a_node_and_consumers_list_a_node_once_per_read():
    g = _graph([helper.make_node("Split", ["obs"], ["a", "b"], name="s", axis=1, num_outputs=2),
                helper.make_node("Mul", ["a", "a"], ["c"], name="m")])
    producers = g.producers()
    assert sorted(producers) == ["a", "b", "c"] and producers["a"].name == producers["b"].name == "s"
    assert {k: [n.name for n in v] for k, v in g.consumers().items()} == {"obs": ["s"], "a": ["m", "m"]}


def test_used_names_are_initializers_graph_inputs_and_node_outputs():
    g = _graph([helper.make_node("Add", ["obs", "b"], ["sum"], name="add"),
                helper.make_node("Split", ["sum"], ["", "half"], name="split", axis=1, num_outputs=2)], inits=["b"])
    assert g.used_names() == {"obs", "b", "sum", "", "half"}


def test_rename_reaches_node_inputs_and_outputs_value_infos_and_initializers():
    g = _graph([helper.make_node("Add", ["obs", "b"], ["t"], name="add"), helper.make_node("Relu", ["t"], ["y"], name="r"),
                helper.make_node("Mul", ["t", "t"], ["z"], name="m")], inits=["b"])
    g.g.value_info.extend([_vi("t", [None, 4]), _vi("y", [None, 4])])
    g.rename("t", "fc/BiasAdd")
    g.rename("b", "fc/bias")
    assert _listing(g) == [("Add", "add", ["obs", "fc/bias"], ["fc/BiasAdd"]), ("Relu", "r", ["fc/BiasAdd"], ["y"]),
                           ("Mul", "m", ["fc/BiasAdd", "fc/BiasAdd"], ["z"])]
    assert [v.name for v in g.g.value_info] == ["fc/BiasAdd", "y"]
    assert [t.name for t in g.g.initializer] == ["fc/bias"] and list(g.init) == ["fc/bias"]
    assert g.init["fc/bias"] is g.g.initializer[0]
    before = g.proto.SerializeToString()
    g.rename("y", "y")  # the same name: nothing changes
    assert g.proto.SerializeToString() == before


def test_remove_nodes_drops_the_nodes_with_those_outputs_and_keeps_the_others_in_order():
    nodes = [helper.make_node("Relu", ["obs"], [f"t{i}"], name=f"n{i}") for i in range(4)]
    g = _graph(nodes)
    g.remove_nodes([g.g.node[1], helper.make_node("Tanh", ["x"], ["t3"])])  # told by outputs, not by identity
    assert [n.name for n in g.g.node] == ["n0", "n2"]


def test_unused_initializers_are_dropped_in_order_and_the_lookup_follows():
    g = _graph([helper.make_node("Add", ["obs", "c"], ["t"]), helper.make_node("Add", ["t", "a"], ["u"])],
               inits=["a", "b", "c", "d"])
    g.drop_unused_initializers()
    assert [t.name for t in g.g.initializer] == ["a", "c"] and sorted(g.init) == ["a", "c"]
    assert g.init["c"] is g.g.initializer[1]


def test_an_added_initializer_keeps_its_dtype_and_bits_and_is_looked_up_by_name():
    g = _graph([])
    value = np.array([[1.5, -0.0], [np.inf, 3]], np.float64)
    assert g.add_initializer(value, "fc/kernel") == "fc/kernel"
    assert g.g.initializer[-1].name == "fc/kernel" and g.init["fc/kernel"] is g.g.initializer[-1]
    back = numpy_helper.to_array(g.init["fc/kernel"])
    assert back.dtype == np.float64 and back.tobytes() == value.tobytes()
    assert numpy_helper.to_array(g.init[g.add_initializer([1, 2], "list")]).tolist() == [1, 2]


def test_topological_sort_moves_a_node_after_what_it_reads_and_keeps_the_order_otherwise():
    g = _graph([helper.make_node("Relu", ["u"], ["v"], name="late"), helper.make_node("Tanh", ["obs"], ["t"], name="a"),
                helper.make_node("Add", ["t", "W"], ["u"], name="b"), helper.make_node("Neg", ["obs"], ["w"], name="c"),
                helper.make_node("Clip", ["w", "", "W"], ["x"], name="d")], inits=["W"])
    g.topological_sort()
    assert [n.name for n in g.g.node] == ["a", "b", "c", "d", "late"]  # "" is an omitted optional input


def test_topological_sort_refuses_a_cycle_or_a_dangling_input_naming_the_first_node_stuck():
    g = _graph([helper.make_node("Relu", ["obs"], ["ok"], name="fine"), helper.make_node("Relu", ["q"], ["p"], name="p_node"),
                helper.make_node("Relu", ["p"], ["q"], name="q_node")])
    with pytest.raises(pp.BadModelError) as caught:
        g.topological_sort()
    assert str(caught.value) == "the converted graph has a cycle or a dangling input at node 'p_node'"
    g = _graph([helper.make_node("Relu", ["missing"], ["y"], name="reader")])
    with pytest.raises(pp.BadModelError, match=r"^the converted graph has a cycle or a dangling input at node 'reader'$"):
        g.topological_sort()


# ------------------------------------------------------------------------ tensors and their roots


def test_a_tensors_root_follows_identities_only():
    g = _graph([helper.make_node("Relu", ["obs"], ["r"]), helper.make_node("Identity", ["r"], ["i1"]),
                helper.make_node("Identity", ["i1"], ["i2"]), helper.make_node("Neg", ["i2"], ["n"]),
                helper.make_node("Identity", ["n"], ["i3"])])
    producers = g.producers()
    assert [kc._root(g, t, producers) for t in ("i2", "i1", "r", "obs", "i3", "unknown")] == ["r", "r", "r", "obs", "n", "unknown"]


def test_settle_names_gives_the_first_name_the_producer_and_later_names_identities_right_after_it():
    # tf2onnx: fc's BiasAdd is also the model output "fc_out" and a second call's tensor "fc_call1"
    g = _graph([helper.make_node("MatMul", ["obs", "W"], ["sp/fc/MatMul:0"], name="mm"),
                helper.make_node("Add", ["sp/fc/MatMul:0", "b"], ["sp/fc/BiasAdd:0"], name="add"),
                helper.make_node("Identity", ["sp/fc/BiasAdd:0"], ["fc"], name="id_fc"),
                helper.make_node("Relu", ["fc"], ["act"], name="relu"),
                helper.make_node("Identity", ["sp/fc/BiasAdd:0"], ["fc_out"], name="id_out"),
                helper.make_node("Identity", ["fc"], ["fc_again"], name="id_again")],
               inits={"W": np.ones((4, 4), np.float32), "b": np.ones(4, np.float32)})
    kc._settle_names(g, ["fc", "act", "never_produced", "fc_out", "fc_again"])
    assert _listing(g) == [
        ("MatMul", "mm", ["obs", "W"], ["sp/fc/MatMul:0"]),
        ("Add", "add", ["sp/fc/MatMul:0", "b"], ["fc"]),  # the root takes the first name
        ("Identity", "fc_out", ["fc"], ["fc_out"]),  # later names of the same value, right after it
        ("Identity", "fc_again", ["fc"], ["fc_again"]),
        ("Relu", "relu", ["fc"], ["act"]),
    ]


def test_settle_names_of_a_value_produced_once_changes_nothing_but_identities_in_between():
    g = _graph([helper.make_node("Relu", ["obs"], ["t"], name="relu"), helper.make_node("Identity", ["t"], ["x"], name="i"),
                helper.make_node("Neg", ["x"], ["y"], name="neg")])
    kc._settle_names(g, ["y"])
    assert _listing(g) == [("Relu", "relu", ["obs"], ["t"]), ("Identity", "i", ["t"], ["x"]), ("Neg", "neg", ["x"], ["y"])]
    kc._settle_names(g, ["x"])  # x's root is t: the Identity goes, t is renamed x
    assert _listing(g) == [("Relu", "relu", ["obs"], ["x"]), ("Neg", "neg", ["x"], ["y"])]


def test_a_layers_span_stops_at_other_named_tensors_inputs_and_initializers():
    g = _graph([helper.make_node("MatMul", ["obs", "W"], ["m"], name="mm"), helper.make_node("Add", ["m", "b"], ["fc"], name="add"),
                helper.make_node("Relu", ["fc"], ["r"], name="relu"), helper.make_node("Mul", ["r", "r"], ["sq"], name="sq"),
                helper.make_node("Clip", ["sq", "", "r"], ["act"], name="clip")],
               inits={"W": np.ones((4, 4), np.float32), "b": np.ones(4, np.float32)})
    producers = g.producers()
    assert [n.name for n in kc._span(g, ["act"], {"fc"}, producers)] == ["clip", "relu", "sq"]
    assert [n.name for n in kc._span(g, ["fc"], set(), producers)] == ["add", "mm"]
    assert [n.name for n in kc._span(g, ["fc", "m"], set(), producers)] == ["mm", "add"]  # each node once
    assert kc._span(g, ["obs", "W"], set(), producers) == []


def test_a_spans_external_inputs_are_what_it_reads_from_outside_once_each_in_order():
    g = _graph([helper.make_node("Add", ["x", "b"], ["s"]), helper.make_node("Clip", ["s", "", "lo"], ["c"]),
                helper.make_node("Mul", ["c", "x"], ["y"])], inits=["b"])
    assert kc._external_inputs(g, list(g.g.node)) == ["x", "lo"]
    assert kc._external_inputs(g, list(g.g.node)[1:]) == ["s", "lo", "x"]


def test_same_bits_means_dtype_shape_and_bytes():
    a = np.array([0.0, 1.0], np.float32)
    assert kc._same_bits(a, a.copy())
    assert not kc._same_bits(a, np.array([-0.0, 1.0], np.float32))  # equal values, other bits
    assert not kc._same_bits(a, a.astype(np.float64)) and not kc._same_bits(a, a.reshape(1, 2))
    assert not kc._same_bits(np.zeros(2, np.int32), np.zeros(2, np.float32))  # the same bytes, another dtype
    nan = np.array([np.nan], np.float32)
    assert kc._same_bits(nan, nan.copy())


# --------------------------------------------------------------------------------- normalizations


class _Weight:
    def __init__(self, name, value):
        self.name, self._value = name, value

    def numpy(self):
        return self._value


def _norm_layer(names=("gamma", "beta"), width=4, epsilon=1e-3, axis=-1, dtype="float32", **extra):
    """A stand-in for a Keras normalization layer: what ``_rebuild_norm`` reads of it."""
    values = {"gamma": RNG.uniform(0.5, 2, width), "beta": RNG.normal(size=width), "moving_mean": RNG.normal(size=width),
              "moving_variance": RNG.uniform(0.5, 2, width)}
    weights = [_Weight(n, values[n].astype(dtype or "float32")) for n in names]
    return SimpleNamespace(axis=axis, epsilon=epsilon, weights=weights, compute_dtype=dtype, **extra)


def _folded(layer_name="ln", width=4, elem=TensorProto.FLOAT, dtype=np.float32):
    """tf2onnx's folded form of a normalization: x * c + d into the layer's tensor, and a Relu after it."""
    nodes = [helper.make_node("Mul", ["x", "c"], ["sp/ln/mul:0"], name="mul"),
             helper.make_node("Add", ["sp/ln/mul:0", "d"], [layer_name], name="add"),
             helper.make_node("Relu", [layer_name], ["y"], name="relu")]
    g = _graph(nodes, inputs=[("x", [None, width])], outputs=[("y", [None, width])], elem=elem,
               inits={"c": np.full(width, 2, dtype), "d": np.full(width, 3, dtype)})
    return g, list(g.g.node)[:2]


def _rebuild(g, span, layer, kind, opset=17, shape=(None, 4), layer_name="ln"):
    parameters, claimed = {}, set()
    done = kc._rebuild_norm(g, layer_name, kind, layer, shape, span, opset, parameters, claimed)
    return done, parameters, claimed


def _weights(layer):
    return {w.name: w.numpy() for w in layer.weights}


def test_a_batch_norm_becomes_one_node_reading_the_keras_weights_with_the_layers_epsilon():
    g, span = _folded("bn")
    layer = _norm_layer(("gamma", "beta", "moving_mean", "moving_variance"), epsilon=0.0123)
    done, parameters, claimed = _rebuild(g, span, layer, "bn", layer_name="bn")
    names = ["bn/gamma", "bn/beta", "bn/moving_mean", "bn/moving_variance"]
    assert done and parameters == {n: n for n in names} and claimed == set(names)
    (relu, bn) = g.g.node
    assert relu.op_type == "Relu" and (bn.op_type, bn.name, list(bn.input), list(bn.output)) == (
        "BatchNormalization", "bn", ["x", *names], ["bn"])
    assert [(a.name, a.f) for a in bn.attribute] == [("epsilon", pytest.approx(0.0123))]
    assert helper.get_attribute_value(bn.attribute[0]) == np.float32(0.0123)
    for name, value in _weights(layer).items():
        assert numpy_helper.to_array(g.init[f"bn/{name}"]).tobytes() == value.tobytes()
    g.topological_sort()
    x = RNG.normal(size=(5, 4)).astype(np.float32)
    w = _weights(layer)
    expected = np.maximum((x - w["moving_mean"]) / np.sqrt(w["moving_variance"] + np.float32(0.0123)) * w["gamma"] + w["beta"], 0)
    np.testing.assert_allclose(_run(g.proto, {"x": x})["y"], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("missing, value", [("gamma", 1.0), ("beta", 0.0), ("moving_mean", 0.0), ("moving_variance", 1.0)])
def test_a_batch_norm_weight_keras_does_not_have_gets_its_neutral_value_unclaimed(missing, value):
    g, span = _folded("bn", width=3, elem=TensorProto.DOUBLE, dtype=np.float64)
    present = [n for n in ("gamma", "beta", "moving_mean", "moving_variance") if n != missing]
    layer = _norm_layer(present, width=3, dtype="float64")
    done, parameters, claimed = _rebuild(g, span, layer, "bn", shape=(None, 3), layer_name="bn")
    assert done and sorted(parameters) == sorted(f"bn/{n}" for n in present) and claimed == set(parameters)
    bn = g.g.node[-1]
    assert list(bn.input)[1:] == [f"bn/{n}" if n != missing else f"bn/{n}_default"
                                  for n in ("gamma", "beta", "moving_mean", "moving_variance")]
    default = numpy_helper.to_array(g.init[f"bn/{missing}_default"])
    assert default.dtype == np.float64 and default.tolist() == [value] * 3


def test_a_layer_norm_at_opset_17_is_one_layer_normalization_over_the_last_axis():
    g, span = _folded()
    layer = _norm_layer(epsilon=0.25)
    done, parameters, claimed = _rebuild(g, span, layer, "ln", opset=17)
    assert done and parameters == {"ln/gamma": "ln/gamma", "ln/beta": "ln/beta"} and claimed == {"ln/gamma", "ln/beta"}
    ln = g.g.node[-1]
    assert (ln.op_type, ln.name, list(ln.input), list(ln.output)) == ("LayerNormalization", "ln", ["x", "ln/gamma", "ln/beta"], ["ln"])
    assert {a.name: helper.get_attribute_value(a) for a in ln.attribute} == {"axis": -1, "epsilon": np.float32(0.25)}
    assert sorted(g.init) == ["c", "d", "ln/beta", "ln/gamma"]  # tf2onnx's constants go when unused, later


def _layer_norm(x, gamma, beta, eps):
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + eps) * gamma + beta


@pytest.mark.parametrize("opset", [17, 16, 13])
@pytest.mark.parametrize("dtype, elem", [("float32", TensorProto.FLOAT), ("float64", TensorProto.DOUBLE)])
def test_a_rebuilt_layer_norm_computes_keras_formula_at_every_opset(opset, dtype, elem):
    g, span = _folded(width=6, elem=elem, dtype=np.dtype(dtype))
    g.proto.opset_import[0].version = opset
    layer = _norm_layer(width=6, epsilon=0.5, dtype=dtype)
    assert _rebuild(g, span, layer, "ln", opset=opset, shape=(None, 6))[0]
    g.topological_sort()
    g.drop_unused_initializers()
    onnx.checker.check_model(g.proto, full_check=True)
    x = RNG.normal(size=(7, 6)).astype(dtype) * 3
    w = _weights(layer)
    expected = np.maximum(_layer_norm(x.astype(np.float64), w["gamma"], w["beta"], 0.5), 0)
    np.testing.assert_allclose(_run(g.proto, {"x": x})["y"], expected, rtol=1e-5, atol=1e-5)


def test_below_opset_17_a_layer_norm_is_spelled_out_step_by_step_under_the_layers_name():
    g, span = _folded()
    layer = _norm_layer(("gamma",), epsilon=0.75)
    assert _rebuild(g, span, layer, "ln", opset=16)[0]
    p = "ln/"
    assert [tuple(x) for x in _listing(g)[1:]] == [
        ("ReduceMean", p + "mean", ["x"], [p + "mean"]),
        ("Sub", p + "centered", ["x", p + "mean"], [p + "centered"]),
        ("Mul", p + "squared", [p + "centered", p + "centered"], [p + "squared"]),
        ("ReduceMean", p + "variance", [p + "squared"], [p + "variance"]),
        ("Add", p + "variance_eps", [p + "variance", p + "epsilon"], [p + "variance_eps"]),
        ("Sqrt", p + "std", [p + "variance_eps"], [p + "std"]),
        ("Div", p + "normalized", [p + "centered", p + "std"], [p + "normalized"]),
        ("Mul", p + "scaled", [p + "normalized", p + "gamma"], [p + "scaled"]),
        ("Add", "ln", [p + "scaled", p + "beta_default"], ["ln"]),
    ]
    for n in g.g.node[1:]:
        if n.op_type == "ReduceMean":
            assert {a.name: helper.get_attribute_value(a) for a in n.attribute} == {"axes": [-1], "keepdims": 1}
    eps = numpy_helper.to_array(g.init["ln/epsilon"])
    assert eps.dtype == np.float32 and eps.shape == () and eps == np.float32(0.75)
    assert numpy_helper.to_array(g.init["ln/beta_default"]).tolist() == [0.0] * 4


@pytest.mark.parametrize("axis", [-1, 1, [-1], [1], (1,)])
def test_a_norm_over_the_feature_axis_is_rebuilt_however_keras_spells_the_axis(axis):
    g, span = _folded()
    assert _rebuild(g, span, _norm_layer(axis=axis), "ln")[0]


@pytest.mark.parametrize("case", ["axis 0", "two axes", "rms scaling", "rank 3", "two inputs"])
def test_a_norm_it_cannot_rebuild_is_left_as_tf2onnx_wrote_it(case):
    g, span = _folded()
    layer = _norm_layer(axis={"axis 0": 0, "two axes": [0, 1]}.get(case, -1), rms_scaling=case == "rms scaling")
    shape = (None, 2, 4) if case == "rank 3" else (None, 4)
    if case == "two inputs":
        span[1].input[1] = "x2"  # reads a second tensor from outside the layer
        g.g.input.append(_vi("x2", [None, 4]))
    before = g.proto.SerializeToString()
    assert _rebuild(g, span, layer, "ln", shape=shape) == (False, {}, set())
    assert g.proto.SerializeToString() == before


def test_a_layer_without_compute_dtype_gets_float32_defaults():
    g, span = _folded()
    layer = _norm_layer(("gamma",), dtype=None)
    assert _rebuild(g, span, layer, "ln", opset=13)[0]
    assert numpy_helper.to_array(g.init["ln/beta_default"]).dtype == np.float32
    assert numpy_helper.to_array(g.init["ln/epsilon"]).dtype == np.float32


# ---------------------------------------------------------------------------------- parameters


def _trace(weights=(), **fields):
    return kc._Trace(function=None, input_specs=[], outputs=fields.pop("outputs", ["fc_out"]), weights=list(weights), **fields)


def _dense_graph():
    """Two layers as tf2onnx writes them: fc_1 (MatMul + Add) and fc_2 (MatMul; its zero bias dropped)."""
    k1, b1, k2 = RNG.normal(size=(4, 3)).astype(np.float32), RNG.normal(size=3).astype(np.float32), RNG.normal(size=(3, 2)).astype(np.float32)
    g = _graph([helper.make_node("MatMul", ["obs", "const_0"], ["m1"], name="mm1"),
                helper.make_node("Add", ["m1", "const_1"], ["fc_1"], name="add1"),
                helper.make_node("MatMul", ["fc_1", "const_2"], ["fc_2"], name="mm2")],
               inits={"const_0": k1, "const_1": b1, "const_2": k2})
    weights = [("fc_1/kernel", "fc_1", k1), ("fc_1/bias", "fc_1", b1), ("fc_2/kernel", "fc_2", k2),
               ("fc_2/bias", "fc_2", np.zeros(2, np.float32))]
    spans = {"fc_1": list(g.g.node)[:2], "fc_2": list(g.g.node)[2:]}
    return g, weights, spans


def test_each_keras_weight_renames_the_initializer_of_its_layer_holding_its_bits():
    g, weights, spans = _dense_graph()
    parameters, claimed = {}, set()
    assert kc._name_parameters(g, _trace(weights), spans, parameters, claimed) == ([], [])
    assert _listing(g) == [("MatMul", "mm1", ["obs", "fc_1/kernel"], ["m1"]), ("Add", "add1", ["m1", "fc_1/bias"], ["fc_1"]),
                           ("MatMul", "mm2", ["fc_1", "fc_2/kernel"], ["fc_2"])]
    assert parameters == {"fc_1/kernel": "fc_1/kernel", "fc_1/bias": "fc_1/bias", "fc_2/kernel": "fc_2/kernel",
                          "fc_2/bias": {"name": "fc_2/bias", "zeros": {"shape": [2], "dtype": "float32"}}}
    assert claimed == {"fc_1/kernel", "fc_1/bias", "fc_2/kernel"}
    for name, _, value in weights[:3]:
        assert numpy_helper.to_array(g.init[name]).tobytes() == value.tobytes()


def test_a_weight_is_looked_for_in_its_own_layer_only_and_never_twice():
    g, weights, spans = _dense_graph()
    k1 = weights[0][2]
    # fc_2 holds fc_1's kernel bits too (its own initializer): a second weight of the same bits takes it
    g.add_initializer(k1.copy(), "const_9")
    g.g.node[2].input[1] = "const_9"
    twin = [("fc_1/kernel", "fc_1", k1), ("fc_2/kernel", "fc_2", k1), ("fc_2/kernel_copy", "fc_2", k1)]
    parameters, claimed = {}, set()
    missing, _ = kc._name_parameters(g, _trace(twin), spans, parameters, claimed)
    assert missing == ["fc_2/kernel_copy"]  # fc_2's one matching initializer is claimed already
    assert list(g.g.node[0].input) == ["obs", "fc_1/kernel"] and list(g.g.node[2].input) == ["fc_1", "fc_2/kernel"]


def test_claimed_weights_are_skipped_and_a_layer_without_a_span_finds_nothing():
    g, weights, spans = _dense_graph()
    parameters, claimed = {"fc_1/kernel": "fc_1/kernel"}, {"fc_1/kernel"}
    missing, _ = kc._name_parameters(g, _trace(weights[:2] + [("gone/kernel", "gone", weights[2][2])]), spans, parameters, claimed)
    assert missing == ["gone/kernel"] and "const_0" in g.init  # the claimed weight was not looked for
    assert parameters == {"fc_1/kernel": "fc_1/kernel", "fc_1/bias": "fc_1/bias"}


def test_a_weight_without_a_layer_is_looked_for_in_the_whole_graph():
    g, weights, _ = _dense_graph()
    parameters = {}
    assert kc._name_parameters(g, _trace([("dense/kernel", None, weights[2][2])]), {}, parameters, set()) == ([], [])
    assert list(g.g.node[2].input) == ["fc_1", "dense/kernel"] and parameters == {"dense/kernel": "dense/kernel"}


def test_a_weight_another_layer_also_reads_is_copied_for_this_layer_and_left_to_the_other():
    g, weights, spans = _dense_graph()
    g.g.node[2].input[1] = "const_1"  # fc_2 reads fc_1's bias initializer too (tf2onnx shares equal constants)
    g.g.node[2].op_type = "Add"
    parameters, claimed = {}, set()
    kc._name_parameters(g, _trace([("fc_1/bias", "fc_1", weights[1][2])]), spans, parameters, claimed)
    assert list(g.g.node[1].input) == ["m1", "fc_1/bias"] and list(g.g.node[2].input) == ["fc_1", "const_1"]
    assert numpy_helper.to_array(g.init["fc_1/bias"]).tobytes() == numpy_helper.to_array(g.init["const_1"]).tobytes()
    assert parameters == {"fc_1/bias": "fc_1/bias"} and claimed == {"fc_1/bias"}


@pytest.mark.parametrize("value, recorded", [
    (np.zeros((2, 3), np.float64), {"shape": [2, 3], "dtype": "float64"}),
    (np.zeros(0, np.float32), {"shape": [0], "dtype": "float32"}),
    (np.zeros(3, np.int64), {"shape": [3], "dtype": "int64"}),
    (np.zeros(3, bool), None),  # not a number: a missing weight, not a dropped zero
    (np.array([0, 1e-30], np.float32), None),
])
def test_a_weight_found_nowhere_is_a_dropped_zero_when_it_is_numeric_zeros_and_missing_otherwise(value, recorded):
    g, _, spans = _dense_graph()
    parameters = {}
    missing, _ = kc._name_parameters(g, _trace([("fc_2/w", "fc_2", value)]), spans, parameters, set())
    if recorded is None:
        assert missing == ["fc_2/w"] and parameters == {}
    else:
        assert missing == [] and parameters == {"fc_2/w": {"name": "fc_2/w", "zeros": recorded}}


def test_a_weight_the_model_never_reads_is_recorded_with_its_value_when_small_and_named_when_not():
    """A Normalization layer's ``count`` (an int64 scalar no computation reads) comes back from extract."""
    g, _, spans = _dense_graph()
    count, big = np.array(500, np.int64), np.arange(65, dtype=np.float32)
    parameters = {}
    trace = _trace([("obs_norm/count", "fc_1", count), ("fc_2/table", "fc_2", big)], unread={"obs_norm/count", "fc_2/table"})
    assert kc._name_parameters(g, trace, spans, parameters, set()) == ([], ["fc_2/table"])
    assert parameters == {"obs_norm/count": {"name": "obs_norm/count",
                                             "value": {"shape": [], "dtype": "int64", "data": [500]}}}


def test_captured_constants_become_initializers_and_unread_ones_leave_the_graph_inputs():
    """tf2onnx makes a graph input of every constant a traced function captures; the graph keeps its
    real inputs, the captured constants it reads become initializers of their values."""
    mean = RNG.normal(size=(1, 4)).astype(np.float32)
    nodes = [helper.make_node("Sub", ["obs", "f/obs_norm_1/Sub/y:0"], ["obs_norm"], name="sub")]
    graph = helper.make_graph(nodes, "g", [_vi("obs", [None, 4]), _vi("f/obs_norm_1/Sub/y:0", [1, 4]),
                                           _vi("f/obs_norm_1/Sqrt/x:0", [1, 4])], [_vi("obs_norm", [None, 4])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    captures = {"f/obs_norm_1/Sub/y:0": (mean, "obs_norm/mean"), "f/obs_norm_1/Sqrt/x:0": (mean + 1, "obs_norm/variance")}
    holders = kc._captures_as_initializers(proto, _trace(captures=captures))
    assert holders == {"f/obs_norm_1/Sub/y:0": "obs_norm/mean"}
    assert [i.name for i in proto.graph.input] == ["obs"]
    assert [(t.name, numpy_helper.to_array(t).tobytes()) for t in proto.graph.initializer] == [
        ("f/obs_norm_1/Sub/y:0", mean.tobytes())]
    g = kc._Graph(proto)
    parameters, claimed = {}, set()
    kc._name_held_constants(g, holders, set(), parameters, claimed)
    assert list(g.g.node[0].input) == ["obs", "obs_norm/mean"] and parameters == {"obs_norm/mean": "obs_norm/mean"}
    obs = RNG.normal(size=(5, 4)).astype(np.float32)
    out = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"obs": obs})[0]
    np.testing.assert_array_equal(out, obs - mean)


def test_a_held_constant_keeps_its_tensorflow_name_where_a_weight_has_the_holder_name():
    proto = helper.make_model(helper.make_graph(
        [helper.make_node("Sub", ["obs", "c:0"], ["y"], name="sub")], "g", [_vi("obs", [None, 4])], [_vi("y", [None, 4])],
        [numpy_helper.from_array(np.ones((1, 4), np.float32), "c:0")]), opset_imports=[helper.make_opsetid("", 17)])
    g, parameters = kc._Graph(proto), {}
    kc._name_held_constants(g, {"c:0": "obs_norm/mean"}, {"obs_norm/mean"}, parameters, set())
    assert list(g.g.node[0].input) == ["obs", "c:0"] and parameters == {}


# ----------------------------------------------------------------------------------- readable names


def test_internal_tensors_are_named_after_the_tf_op_under_the_innermost_scope_of_the_layer():
    g = _graph([helper.make_node("MatMul", ["obs", "sp/model/fc_1/MatMul/ReadVariableOp:0"], ["sp/model/fc/fc_1/MatMul:0"]),
                helper.make_node("Add", ["sp/model/fc/fc_1/MatMul:0", "bias__12"], ["sp/other/BiasAdd__3:0"]),
                helper.make_node("Tanh", ["sp/other/BiasAdd__3:0"], ["fc"]),
                helper.make_node("Relu", ["fc"], ["fc/already_named"])],
               inits={"sp/model/fc_1/MatMul/ReadVariableOp:0": np.ones((4, 4), np.float32), "bias__12": np.ones(4, np.float32)})
    kc._readable_names(g, {"fc": list(g.g.node)}, {"obs", "fc"})
    assert _listing(g) == [
        ("MatMul", "fc/MatMul", ["obs", "fc/MatMul/ReadVariableOp"], ["fc/MatMul"]),  # the last scope fc or fc_<n>
        ("Add", "fc/BiasAdd", ["fc/MatMul", "fc/bias"], ["fc/BiasAdd"]),  # no scope of the layer: the last part
        ("Tanh", "fc", ["fc/BiasAdd"], ["fc"]),  # kept names stay
        ("Relu", "fc/already_named", ["fc"], ["fc/already_named"]),
    ]


def test_internal_names_that_collide_get_numbered_and_an_empty_name_falls_back_to_the_op():
    g = _graph([helper.make_node("Relu", ["obs"], ["sp/fc/Relu:0"]), helper.make_node("Relu", ["sp/fc/Relu:0"], ["sp/fc/Relu:1"]),
                helper.make_node("Neg", ["sp/fc/Relu:1"], ["sp/fc/Relu__7"]), helper.make_node("Abs", ["sp/fc/Relu__7"], ["sp/fc/"]),
                helper.make_node("Sign", ["sp/fc/"], ["fc/Relu"])],
               inits={"fc/Relu_3": np.ones(1, np.float32)})
    kc._readable_names(g, {"fc": list(g.g.node)[:4]}, {"obs"})
    assert [list(n.output) for n in g.g.node] == [["fc/Relu_1"], ["fc/Relu_2"], ["fc/Relu_4"], ["fc/Abs"], ["fc/Relu"]]


def test_the_layers_own_scope_decides_even_with_a_numbered_twin_layer_name():
    g = _graph([helper.make_node("Relu", ["obs"], ["sp/fc_10/inner/Relu:0"]), helper.make_node("Neg", ["sp/fc_10/inner/Relu:0"], ["y"])])
    kc._readable_names(g, {"fc_1": list(g.g.node)[:1]}, {"obs", "y"})
    assert g.g.node[0].output[0] == "fc_1/Relu"  # fc_10 is not fc_1 nor fc_1_<n>: only the last part is kept
    g = _graph([helper.make_node("Relu", ["obs"], ["sp/fc_1_2/inner/Relu:0"]), helper.make_node("Neg", ["sp/fc_1_2/inner/Relu:0"], ["y"])])
    kc._readable_names(g, {"fc_1": list(g.g.node)[:1]}, {"obs", "y"})
    assert g.g.node[0].output[0] == "fc_1/inner/Relu"


def test_without_layers_a_bare_tf_graph_keeps_tfs_scopes_without_call_wrappers_and_suffixes():
    g = _graph([helper.make_node("MatMul", ["obs", "W"], ["StatefulPartitionedCall/StatefulPartitionedCall_1/policy/dense/MatMul:0"]),
                helper.make_node("Relu", ["StatefulPartitionedCall/StatefulPartitionedCall_1/policy/dense/MatMul:0"],
                                 ["StatefulPartitionedCall__5:0"]),
                helper.make_node("Neg", ["StatefulPartitionedCall__5:0"], ["policy/dense/MatMul"]),
                helper.make_node("Abs", ["policy/dense/MatMul"], ["out"])], inits=["W"])
    kc._readable_names(g, {}, {"obs", "out"})
    assert [(n.name, list(n.output)) for n in g.g.node] == [
        ("policy/dense/MatMul_1", ["policy/dense/MatMul_1"]), ("Relu", ["Relu"]),
        ("policy/dense/MatMul_2", ["policy/dense/MatMul_2"]), ("out", ["out"])]
    assert list(g.g.node[3].input) == ["policy/dense/MatMul_2"] and "W" in g.init  # initializers keep their names here


def test_every_node_is_named_after_its_first_output_unless_that_is_omitted():
    g = _graph([helper.make_node("Split", ["obs"], ["", "b"], name="tf_split", axis=1, num_outputs=2),
                helper.make_node("Relu", ["b"], ["y"], name="tf_relu")])
    kc._readable_names(g, {"layer": []}, {"obs"})
    assert [n.name for n in g.g.node] == ["tf_split", "y"]


# ---------------------------------------------------------------------------------------- heads


def _head_graph(width=6, elem=TensorProto.FLOAT, shape=None):
    g = _graph([helper.make_node("Identity", ["obs"], ["fc_out"], name="fc_out")], inputs=[("obs", [None, width])],
               outputs=[("fc_out", shape or [None, width])], elem=elem)
    return g


def test_a_diag_gaussian_head_slices_the_output_into_mean_and_log_std_halves():
    g = _head_graph(6, TensorProto.DOUBLE)
    infos = kc._add_head(g, "fc_out", "diag-gaussian", 17)
    assert [(v.name, v.type.tensor_type.elem_type, [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim])
            for v in infos] == [("action", TensorProto.DOUBLE, ["batch", 3]), ("log_std", TensorProto.DOUBLE, ["batch", 3])]
    assert _listing(g)[1:] == [("Slice", "action", ["fc_out", "head/zero", "head/mid", "head/axes"], ["action"]),
                               ("Slice", "log_std", ["fc_out", "head/mid", "head/end", "head/axes"], ["log_std"])]
    assert {n: numpy_helper.to_array(g.init[n]).tolist() for n in ("head/axes", "head/mid", "head/zero", "head/end")} == {
        "head/axes": [1], "head/mid": [3], "head/zero": [0], "head/end": [6]}
    assert all(numpy_helper.to_array(t).dtype == np.int64 for t in g.g.initializer)
    g.g.output.extend(infos)
    x = RNG.normal(size=(5, 6))
    got = _run(g.proto, {"obs": x})
    np.testing.assert_array_equal(got["action"], x[:, :3])
    np.testing.assert_array_equal(got["log_std"], x[:, 3:])


def test_a_categorical_head_is_the_argmax_over_the_logits_as_int64_actions():
    g = _head_graph(5)
    infos = kc._add_head(g, "fc_out", "categorical", 17)
    argmax = g.g.node[-1]
    assert (argmax.op_type, argmax.name, list(argmax.input), list(argmax.output)) == ("ArgMax", "action", ["fc_out"], ["action"])
    assert {a.name: helper.get_attribute_value(a) for a in argmax.attribute} == {"axis": 1, "keepdims": 0}
    assert [(v.name, v.type.tensor_type.elem_type, [d.dim_param for d in v.type.tensor_type.shape.dim]) for v in infos] == [
        ("action", TensorProto.INT64, ["batch"])]
    g.g.output.extend(infos)
    x = RNG.normal(size=(9, 5)).astype(np.float32)
    got = _run(g.proto, {"obs": x})["action"]
    assert got.dtype == np.int64 and got.tolist() == np.argmax(x, axis=1).tolist()


UNDECLARED = "its declared shape is not (batch, width) of a fixed width"


@pytest.mark.parametrize("shape, said", [([None, 5], "it has 5 outputs (an odd number)"), ([None, "width"], UNDECLARED),
                                         ([None, 2, 4], UNDECLARED), ([None, 0], UNDECLARED)])
@pytest.mark.parametrize("head", ["diag-gaussian", "diag-gaussian:halves"])
def test_a_diag_gaussian_head_refuses_an_output_it_cannot_halve(shape, said, head):
    g = _head_graph(4, shape=shape)
    with pytest.raises(pp.OptionError) as caught:
        kc._add_head(g, "fc_out", head, 17)
    assert str(caught.value) == (f"--head {head} splits 'fc_out' into mean and log_std halves, but {said}; "
                                 "use --head categorical (or none)")
    g = _head_graph(4, shape=shape)
    del g.g.output[0].type.tensor_type.shape.dim[:]
    g.g.output[0].type.tensor_type.ClearField("shape")
    with pytest.raises(pp.OptionError) as caught:
        kc._add_head(g, "fc_out", head, 17)
    assert f"but {UNDECLARED}; " in str(caught.value)


# -------------------------------------------------------------------------------- the whole finish


def _tf2onnx_like(batch="unk__12", fixed_out=False):
    """A model as tf2onnx writes it for fc_1 (Dense, tanh) -> ln (LayerNormalization) -> fc_out (Dense, zero
    bias), traced by the Keras converter: the function returns every layer's tensor under the layer's name."""
    k1, b1 = RNG.normal(size=(4, 6)).astype(np.float32), RNG.normal(size=6).astype(np.float32)
    k2 = RNG.normal(size=(6, 2)).astype(np.float32)
    ln = _norm_layer(width=6, epsilon=0.01)
    nodes = [
        helper.make_node("MatMul", ["obs", "sp/fc_1/Cast/ReadVariableOp:0"], ["sp/fc_1/MatMul:0"], name="sp/fc_1/MatMul"),
        helper.make_node("Add", ["sp/fc_1/MatMul:0", "const_fold_opt__9"], ["sp/fc_1/BiasAdd:0"], name="sp/fc_1/BiasAdd"),
        helper.make_node("Tanh", ["sp/fc_1/BiasAdd:0"], ["sp/fc_1/Tanh:0"], name="sp/fc_1/Tanh"),
        helper.make_node("Identity", ["sp/fc_1/Tanh:0"], ["fc_1"], name="Identity_2"),
        helper.make_node("Mul", ["sp/fc_1/Tanh:0", "ln_scale_folded"], ["sp/ln/mul:0"], name="sp/ln/mul"),
        helper.make_node("Add", ["sp/ln/mul:0", "ln_shift_folded"], ["sp/ln/add:0"], name="sp/ln/add"),
        helper.make_node("Identity", ["sp/ln/add:0"], ["ln"], name="Identity_1"),
        helper.make_node("MatMul", ["sp/ln/add:0", "sp/fc_out/Cast/ReadVariableOp:0"], ["sp/fc_out/MatMul:0"], name="sp/fc_out/MatMul"),
        helper.make_node("Identity", ["sp/fc_out/MatMul:0"], ["fc_out"], name="Identity"),
    ]
    inits = {"sp/fc_1/Cast/ReadVariableOp:0": k1, "const_fold_opt__9": b1, "ln_scale_folded": np.full(6, 0.5, np.float32),
             "ln_shift_folded": np.full(6, 0.1, np.float32), "sp/fc_out/Cast/ReadVariableOp:0": k2}
    g = _graph(nodes, inputs=[("obs", [batch, 4])],
               outputs=[("fc_1", [batch, 6]), ("ln", [batch, 6]), ("fc_out", [1 if fixed_out else batch, 2])], inits=inits)
    g.g.value_info.append(_vi("sp/fc_1/Tanh:0", [batch, 6]))
    g.proto.metadata_props.add(key="tf2onnx", value="something")
    weights = [("fc_1/kernel", "fc_1", k1), ("fc_1/bias", "fc_1", b1), *((f"ln/{w.name}", "ln", w.numpy()) for w in ln.weights),
               ("fc_out/kernel", "fc_out", k2), ("fc_out/bias", "fc_out", np.zeros(2, np.float32))]
    trace = _trace(weights, outputs=["fc_out"], layer_tensors={"fc_1": "fc_1", "ln": "ln", "fc_out": "fc_out"},
                   norms={"ln": ("ln", ln)}, shapes={"fc_1": (None, 6), "ln": (None, 6), "fc_out": (None, 2)})
    return g.proto, trace, {w.name: w.numpy() for w in ln.weights}


def _finish(proto, trace, **options):
    return kc._finish(None, trace, proto, ConvertOptions(**options), {"kind": "keras", "object": "Functional"})


def _expected(proto_before, trace, gamma_beta, x):
    w = {name: value for name, _, value in trace.weights}
    h = np.tanh(x @ w["fc_1/kernel"] + w["fc_1/bias"])
    return _layer_norm(h, gamma_beta["gamma"], gamma_beta["beta"], 0.01) @ w["fc_out/kernel"]


def test_finish_names_every_layer_and_weight_after_keras_and_keeps_only_the_models_outputs():
    proto, trace, ln = _tf2onnx_like()
    model, notes = _finish(proto, trace)
    assert notes == []
    assert _listing(SimpleNamespace(g=model.graph)) == [
        ("MatMul", "fc_1/MatMul", ["obs", "fc_1/kernel"], ["fc_1/MatMul"]),
        ("Add", "fc_1/BiasAdd", ["fc_1/MatMul", "fc_1/bias"], ["fc_1/BiasAdd"]),
        ("Tanh", "fc_1", ["fc_1/BiasAdd"], ["fc_1"]),
        ("LayerNormalization", "ln", ["fc_1", "ln/gamma", "ln/beta"], ["ln"]),
        ("MatMul", "fc_out", ["ln", "fc_out/kernel"], ["fc_out"]),
    ]
    # tf2onnx's initializers renamed where they are, then the rebuilt norm's; its folded constants gone
    assert [t.name for t in model.graph.initializer] == ["fc_1/kernel", "fc_1/bias", "fc_out/kernel", "ln/gamma", "ln/beta"]
    assert [(v.name, [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim])
            for v in [*model.graph.input, *model.graph.output]] == [("obs", ["batch", 4]), ("fc_out", ["batch", 2])]
    assert len(model.graph.value_info) == 0 and model.graph.name == "policy"
    assert (model.producer_name, model.producer_version) == ("policyport", pp.__version__)
    props = {p.key: p.value for p in model.metadata_props}
    assert sorted(props) == ["policyport.head", "policyport.parameters", "policyport.source"]
    assert props["policyport.head"] == "none" and json.loads(props["policyport.source"]) == {"kind": "keras", "object": "Functional"}
    parameters = json.loads(props["policyport.parameters"])
    assert list(parameters) == ["fc_1/kernel", "fc_1/bias", "ln/gamma", "ln/beta", "fc_out/kernel", "fc_out/bias"]  # Keras' order
    assert parameters["fc_out/bias"] == {"name": "fc_out/bias", "zeros": {"shape": [2], "dtype": "float32"}}
    assert all(parameters[n] == n for n in list(parameters)[:5])
    x = RNG.normal(size=(5, 4)).astype(np.float32)
    np.testing.assert_allclose(_run(model, {"obs": x})["fc_out"], _expected(proto, trace, ln, x), rtol=1e-4, atol=1e-5)
    weights = pp.extract_weights(model)
    for name, _, value in trace.weights:
        assert weights[name].tobytes() == value.tobytes()


def test_finish_keeps_a_fixed_batch_size_and_leaves_dims_it_knows():
    proto, trace, _ = _tf2onnx_like(fixed_out=True)
    model, _ = _finish(proto, trace)
    assert [d.dim_param or d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim] == [1, 2]


def test_finish_leaves_a_scalar_output_without_a_batch_axis():
    g = _graph([helper.make_node("ReduceSum", ["obs"], ["score"], name="sum", keepdims=0)],
               inputs=[("obs", ["unk__1", 4])], outputs=[("score", [])])
    model, notes = _finish(g.proto, _trace(outputs=["score"]))
    assert notes == [] and [n.name for n in model.graph.node] == ["score"]
    score = model.graph.output[0].type.tensor_type
    assert score.HasField("shape") and len(score.shape.dim) == 0  # rank 0: no batch axis to name
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    x = RNG.normal(size=(3, 4)).astype(np.float32)
    assert _run(model, {"obs": x})["score"] == pytest.approx(x.sum(), rel=1e-5)


def test_finish_notes_a_normalization_it_kept_folded_and_the_weights_it_therefore_cannot_name():
    proto, trace, _ = _tf2onnx_like()
    trace.shapes["ln"] = (None, 2, 3)
    model, notes = _finish(proto, trace)
    assert notes == [
        "ln: kept tf2onnx's folded form of this normalization (not a (batch, features) tensor over its feature axis); "
        "its parameters are not extractable",
        "tf2onnx folded ln/gamma, ln/beta into other constants; extract cannot return them"]
    assert [n.op_type for n in model.graph.node if n.name.startswith("ln")] == ["Mul", "Add"]
    assert [n.name for n in model.graph.node if n.name.startswith("ln")] == ["ln/mul", "ln"]
    assert "ln/gamma" not in json.loads({p.key: p.value for p in model.metadata_props}["policyport.parameters"])


@pytest.mark.parametrize("head, recorded", [("diag-gaussian:halves", "diag-gaussian"), ("categorical", "categorical")])
def test_finish_adds_a_head_after_the_models_output_and_records_it(head, recorded):
    proto, trace, ln = _tf2onnx_like()
    if head == "diag-gaussian:halves":  # a Keras model does not say its output holds both halves: the split is stated
        with pytest.raises(pp.OptionError) as caught:
            _finish(proto, trace, head="diag-gaussian")
        assert str(caught.value) == (
            "--head diag-gaussian: nothing in the Keras model says that fc_out's 2 outputs are a mean and a log_std half "
            "(it holds no log_std parameter, and its layout is not one whose convention splits them, as RLlib's is). If "
            "the first is the mean and the second the log_std, say so with --head diag-gaussian:halves; if all 2 are "
            "the mean (the log std kept elsewhere), --head none exports them as logits")
        proto, trace, ln = _tf2onnx_like()
    model, _ = _finish(proto, trace, head=head)
    assert [o.name for o in model.graph.output] == (["fc_out", "action", "log_std"] if recorded == "diag-gaussian" else ["fc_out", "action"])
    assert {p.key: p.value for p in model.metadata_props}["policyport.head"] == recorded
    x = RNG.normal(size=(5, 4)).astype(np.float32)
    got = _run(model, {"obs": x})
    if head == "categorical":
        assert got["action"].tolist() == np.argmax(got["fc_out"], axis=1).tolist()
    else:
        np.testing.assert_array_equal(np.concatenate([got["action"], got["log_std"]], axis=1), got["fc_out"])


def test_finish_refuses_a_head_on_a_model_of_several_outputs():
    proto, trace, _ = _tf2onnx_like()
    trace.outputs = ["fc_1", "fc_out"]
    with pytest.raises(pp.OptionError) as caught:  # exit 2, as every head that does not fit the source
        _finish(proto, trace, head="categorical")
    assert str(caught.value) == "a categorical head needs a model with one output; this one has 2: fc_1, fc_out"


def test_finish_orders_outputs_as_the_model_does_and_blames_a_graph_the_checker_refuses():
    proto, trace, _ = _tf2onnx_like()
    trace.outputs = ["fc_out", "fc_1"]
    model, _ = _finish(proto, trace)
    assert [o.name for o in model.graph.output] == ["fc_out", "fc_1"]
    proto, trace, _ = _tf2onnx_like()
    proto.graph.node[2].op_type = "NotAnOnnxOp"
    with pytest.raises(pp.BadModelError, match=r"^the converted model fails onnx.checker: .*NotAnOnnxOp"):
        _finish(proto, trace)


# ---------------------------------------------------------------------------------- the reference


def _reference(head=None, outputs=("fc_out",), inputs=("obs",)):
    """The converter's reference over a stand-in for TensorFlow: the traced function doubles its inputs."""
    calls = []

    def function(*tensors):
        calls.append(tensors)
        return {name: sum(tensors) * (i + 1) for i, name in enumerate(outputs)} | {"fc_1": tensors[0] + 1}

    fw = SimpleNamespace(tf=SimpleNamespace(convert_to_tensor=lambda a, dtype: np.asarray(a, dtype)))
    trace = _trace(outputs=list(outputs))
    trace.function, trace.input_specs = function, [SimpleNamespace(name=n, dtype=np.float64) for n in inputs]
    return kc._reference(trace, head, fw), calls


def test_the_reference_runs_the_traced_function_on_the_observation_and_returns_numpy_arrays():
    reference, calls = _reference()
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    out = reference(x)
    assert sorted(out) == ["fc_1", "fc_out"] and all(type(v) is np.ndarray for v in out.values())
    np.testing.assert_array_equal(out["fc_out"], x)
    assert calls[0][0].dtype == np.float64  # converted to the input's own dtype
    assert reference({"obs": x.tolist()})["fc_1"].tolist() == (x + 1).tolist()


def test_the_reference_takes_every_input_by_name_and_names_those_missing():
    reference, calls = _reference(inputs=("pos", "vel"))
    out = reference({"vel": np.ones((2, 1)), "pos": np.full((2, 1), 3.0), "extra": np.zeros(1)})
    assert out["fc_out"].tolist() == [[4.0], [4.0]] and calls[0][0].tolist() == [[3.0], [3.0]]
    with pytest.raises(pp.BadModelError) as caught:
        reference({"pos": np.ones((2, 1))})
    assert str(caught.value) == "the model takes inputs pos, vel; no observations for vel"
    with pytest.raises(pp.BadModelError, match="; no observations for vel$"):
        reference(np.ones((2, 1)))  # an array feeds the first input


@pytest.mark.parametrize("head", [None, "categorical", "diag-gaussian"])
def test_the_reference_adds_the_heads_outputs_as_the_graph_computes_them(head):
    reference, _ = _reference(head=head)
    x = np.array([[0.5, 3.0, -1.0, 2.0], [4.0, 1.0, 0.0, -2.0]])
    out = reference(x)
    assert sorted(out) == sorted({None: ["fc_out", "fc_1"], "categorical": ["fc_out", "fc_1", "action"],
                                  "diag-gaussian": ["fc_out", "fc_1", "action", "log_std"]}[head])
    if head == "categorical":
        assert out["action"].dtype == np.int64 and out["action"].tolist() == [1, 0]
    elif head == "diag-gaussian":
        assert out["action"].tolist() == x[:, :2].tolist() and out["log_std"].tolist() == x[:, 2:].tolist()


def test_the_reference_of_a_model_of_several_outputs_adds_no_head():
    reference, _ = _reference(head="categorical", outputs=("a", "b"))
    assert sorted(reference(np.ones((2, 2)))) == ["a", "b", "fc_1"]
