"""The torch exporter's parts one by one: the graph passes on graphs built here with onnx.helper (the
renaming, the parameter matching, the exporters' initializer aliases), the naming of outputs and input
shapes, the errors and their messages, the exported graph of small modules (op types, names, opset,
metadata), the reference forward pass against torch itself, TorchScript files and the torch primitives
of the weight-only reference."""

from __future__ import annotations

import hashlib
import json
import logging
import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import policyport as pp  # noqa: E402
from policyport.converter import ConvertOptions, convert_source  # noqa: E402
from policyport.converter.sources import torch_module as tm  # noqa: E402
from policyport.converter.sources.reference import torch_ops  # noqa: E402
from policyport.errors import BadModelError, OptionError, UnreadableFileError  # noqa: E402

FLOAT = TensorProto.FLOAT

# TorchScript files are what these tests convert; torch 2.13 announces that scripting is deprecated
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")


def props(model) -> dict[str, str]:
    return {p.key: p.value for p in model.metadata_props}


def graph_of(nodes, inputs=("obs",), outputs=("logits",), initializers=(), value_info=()):
    """A model from nodes: float inputs/outputs of shape (batch, 2), the initializers given as arrays."""
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(i, FLOAT, ["N", 2]) for i in inputs],
        [helper.make_tensor_value_info(o, FLOAT, [None, 2]) for o in outputs],
        [numpy_helper.from_array(np.asarray(a), name) for name, a in initializers],
        value_info=[helper.make_tensor_value_info(v, FLOAT, [2]) for v in value_info],
    )
    return helper.make_model(graph)


# ---------------------------------------------------------------------------------------------
# small pure functions


@pytest.mark.parametrize("name, snake", [("BatchNorm1d", "batch_norm1d"), ("LeakyReLU", "leaky_re_lu"), ("GELU", "gelu"),
                                         ("MatMul", "mat_mul"), ("Tanh", "tanh"), ("a2B", "a2_b")])
def test_snake_case_splits_before_each_capital_after_a_lower_or_digit(name, snake):
    assert tm._snake(name) == snake


def test_class_name_is_the_scripted_original_name_or_the_type():
    linear = torch.nn.Linear(2, 2)
    assert tm._class_name(linear) == "Linear"
    scripted = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    assert type(scripted).__name__ != "Sequential" and tm._class_name(scripted) == "Sequential"


SHAPE_REFUSED = ("cannot tell the observation shape from the module (its first layer is not a Linear); "
                 "give it with --input-shape (input_shape=(2, 3) in Python), without the batch axis")


def test_the_input_shape_is_the_given_one_as_ints_or_the_first_linears_inputs():
    module = torch.nn.Sequential(torch.nn.Tanh(), torch.nn.Sequential(torch.nn.Linear(5, 3)), torch.nn.Linear(3, 7))
    assert tm.input_shape_of(module, None) == (5,)
    assert tm.input_shape_of(module, ()) == (5,)  # nothing given
    shape = tm.input_shape_of(module, (np.int64(2), 3.0))
    assert shape == (2, 3) and all(type(d) is int for d in shape)


@pytest.mark.parametrize("first", [torch.nn.Flatten(), torch.nn.Unflatten(1, (2, 2)), torch.nn.Conv1d(1, 1, 1),
                                   torch.nn.Conv2d(1, 1, 1), torch.nn.Embedding(3, 4)])
def test_a_layer_that_reshapes_before_the_first_linear_makes_the_shape_unreadable(first):
    with pytest.raises(BadModelError) as caught:
        tm.input_shape_of(torch.nn.Sequential(first, torch.nn.Linear(4, 2)), None)
    assert str(caught.value) == SHAPE_REFUSED


def test_a_module_without_a_linear_has_no_readable_shape():
    with pytest.raises(BadModelError, match=r"^cannot tell the observation shape"):
        tm.input_shape_of(torch.nn.Sequential(torch.nn.Tanh()), None)


def test_the_parameter_dtype_is_the_first_floating_parameter_or_buffer_else_float32():
    assert tm._param_dtype(torch.nn.Linear(2, 2).double()) == torch.float64
    assert tm._param_dtype(torch.nn.Linear(2, 2).half()) == torch.float16
    assert tm._param_dtype(torch.nn.Tanh()) == torch.float32
    norm = torch.nn.BatchNorm1d(2, affine=False).double()  # num_batches_tracked (int64) comes after the stats
    assert tm._param_dtype(norm) == torch.float64

    class IntBuffer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("steps", torch.zeros(2, dtype=torch.int64))
            self.register_buffer("scale", torch.zeros(2, dtype=torch.float64))

    assert tm._param_dtype(IntBuffer()) == torch.float64


def test_outputs_are_named_logits_output_i_or_the_dict_keys():
    t = torch.zeros(1)
    assert tm._output_names(t, None) == ["logits"]
    assert tm._output_names((t, t, t), None) == ["output_0", "output_1", "output_2"]
    assert tm._output_names([t, t], None) == ["output_0", "output_1"]
    assert tm._output_names({"pi": t, 3: t}, None) == ["pi", "3"]
    assert tm._output_names((t, t), ("mean", "value")) == ["mean", "value"]
    assert tm._output_names(t, ()) == ["logits"]


@pytest.mark.parametrize("result, kind", [((torch.zeros(1), 2.0), "tuple"), (3, "int"), (None, "NoneType")])
def test_a_result_that_is_not_tensors_is_refused_by_its_type(result, kind):
    with pytest.raises(BadModelError) as caught:
        tm._output_names(result, None)
    assert str(caught.value) == (f"the module returns {kind}; policyport exports a tensor, a tuple of tensors or a dict of tensors")


def test_output_names_given_must_fit_the_outputs_and_not_be_obs():
    t = torch.zeros(1)
    with pytest.raises(OptionError) as caught:
        tm._output_names((t, t), ("a",))
    assert str(caught.value) == "1 output names given (a) for a module with 2 outputs"
    with pytest.raises(OptionError) as caught:
        tm._output_names((t, t), ("a", "obs"))
    assert str(caught.value) == "output names must not be 'obs', the graph input: a, obs"
    with pytest.raises(BadModelError) as caught:
        tm._output_names((t, t), ("a", "a"))
    assert type(caught.value) is BadModelError and str(caught.value) == "output names must be distinct and not 'obs': ['a', 'a']"
    with pytest.raises(BadModelError) as caught:
        tm._output_names({"obs": t}, None)
    assert str(caught.value) == "output names must be distinct and not 'obs': ['obs']"


MODE = {"topic": "mode", "assumes": "eval (Dropout off, BatchNorm on its running statistics)",
        "because": "{} in training mode; it was exported and is checked in eval mode (and put back in training "
                   "mode afterwards), where training mode draws Dropout masks and normalises each batch by its own "
                   "statistics"}


def test_eval_mode_restores_each_submodules_mode_even_on_error():
    module = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout())
    module[1].eval()
    with pytest.raises(KeyError), tm._eval_mode(module):
        assert not module.training and not module[0].training and not module[1].training
        raise KeyError("x")
    assert module.training and module[0].training and not module[1].training
    with tm._eval_mode(module.eval()):
        assert not module.training
    assert not module.training


@pytest.mark.parametrize("what, was, settle", [
    ("a torch module", "the module was", "put the module in eval mode (module.eval()) before converting it"),
    ("a TorchScript file", "the file holds a module saved", "save the module in eval mode (module.eval() before torch.jit.save)"),
])
def test_a_module_in_training_mode_is_assumed_used_in_eval_mode_as_exported(what, was, settle):
    assert [a.topic for a in tm.module_assumptions(what)] == ["observation normalisation"]
    mode = tm.module_assumptions(what, training=True)[1].to_dict()
    assert mode == {**MODE, "because": MODE["because"].format(was), "settle": settle}


def test_quiet_silences_prints_warnings_and_logging_and_restores_the_levels(capfd):
    logger = logging.getLogger("torch.onnx")
    logger.setLevel(logging.INFO)
    with tm._quiet():
        print("printed")
        warnings.warn("warned")
        assert logging.getLogger("torch").level == logging.CRITICAL and logger.level == logging.CRITICAL
    assert logger.level == logging.INFO
    print("after")
    out, err = capfd.readouterr()
    assert out == "after\n" and "warned" not in err
    logger.setLevel(logging.NOTSET)


def test_the_newest_opset_is_torchs_own_per_exporter_with_defaults():
    assert tm._newest_opset(torch, "torchscript") == torch.onnx._constants.ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET == 20
    assert tm._newest_opset(torch, "dynamo") == torch.onnx._constants.ONNX_MAX_OPSET

    class Bare:
        class onnx:
            _constants = object()

    assert tm._newest_opset(Bare, "torchscript") == 20 and tm._newest_opset(Bare, "dynamo") == 23


# ---------------------------------------------------------------------------------------------
# scopes: which module computed a node


@pytest.mark.parametrize("node_name, scope", [
    ("/a/b/b.0/Gemm", "a.b.0"),
    ("/a/b.0/Gemm", "a.b.0"),  # a Sequential child named with its parent
    ("/a/Gemm", "a"),
    ("/x/a/Gemm", ""),  # the first part is no module
    ("/a/f/b/Gemm", "a"),  # a function scope stops the walk
    ("/Gemm", ""),
    ("a/Gemm", None),
    ("/a/b/c/Relu", "a.b.c"),
])
def test_the_ts_scope_walks_the_module_paths_of_a_node_name(node_name, scope):
    modules = {"a", "a.b", "a.b.0", "a.b.c"}
    assert tm._scope_of_ts_name(node_name, modules) == scope


def test_a_sequential_child_named_under_its_parent_extends_the_parent_path():
    modules = {"net", "net.seq", "net.seq.0", "net.0"}
    assert tm._scope_of_ts_name("/net/seq/seq.0/Gemm", modules) == "net.seq.0"
    assert tm._scope_of_ts_name("/seq/seq.0/Gemm", {"seq", "seq.0"}) == "seq.0"


def dynamo_node(scopes: str | None, name: str = "n"):
    node = helper.make_node("Relu", ["x"], ["y"], name=name)
    if scopes is not None:
        entry = node.metadata_props.add()
        entry.key, entry.value = "pkg.torch.onnx.name_scopes", scopes
    other = node.metadata_props.add()
    other.key, other.value = "other", "['a', 'b']"
    return node


@pytest.mark.parametrize("scopes, scope", [
    ("['', 'a', 'a.b', 'relu']", "a.b"),  # the innermost module, the op's own name left out
    ('["", "a", "a.b"]', "a"),
    ("['', 'a', 'zz', 'relu']", "a"),
    ("['', 'zz', 'relu']", ""),
    ("['zz', 'relu']", None),
    ("['a']", None),
    ("", None),
    (None, None),
    ("not json [", None),
])
def test_the_dynamo_scope_is_the_innermost_module_of_the_name_scopes(scopes, scope):
    assert tm._scope_of_dynamo_node(dynamo_node(scopes), {"", "a", "a.b"}) == scope


# ---------------------------------------------------------------------------------------------
# the exporters' aliases: initializers named like outputs, Identity nodes over initializers


def test_an_initializer_named_like_a_node_output_is_renamed_dot_param():
    w = np.ones((2,), np.float32)
    model = graph_of([helper.make_node("Add", ["obs", "log_std"], ["log_std"]),
                      helper.make_node("Mul", ["log_std", "log_std.param"], ["logits"])],
                     initializers=[("log_std", w), ("log_std.param", w), ("keep", w)])
    graph = model.graph
    tm._separate_initializers(graph)
    assert [t.name for t in graph.initializer] == ["log_std.param1", "log_std.param", "keep"]
    assert [list(n.input) for n in graph.node] == [["obs", "log_std.param1"], ["log_std", "log_std.param"]]


def test_an_initializer_renamed_avoids_every_name_taken():
    w = np.ones((2,), np.float32)
    model = graph_of([helper.make_node("Add", ["obs", "w"], ["h"]), helper.make_node("Relu", ["h"], ["w"]),
                      helper.make_node("Add", ["w", "w.param1"], ["w.param"]),
                      helper.make_node("Add", ["w.param", "w"], ["logits"])],
                     inputs=("obs", "w.param1"), initializers=[("w", w)])
    tm._separate_initializers(model.graph)
    assert [t.name for t in model.graph.initializer] == ["w.param2"]
    assert [list(n.input) for n in model.graph.node] == [["obs", "w.param2"], ["h"], ["w", "w.param1"], ["w.param", "w"]]


def test_an_initializer_named_like_an_output_is_read_until_that_output_is_computed():
    """``log_std`` the parameter feeds the node computing ``log_std`` the tensor; the nodes after it
    read the tensor, whose value differs from the parameter's."""
    w = np.full((2,), -0.5, np.float32)
    model = graph_of([helper.make_node("Exp", ["log_std"], ["log_std"]),
                      helper.make_node("Mul", ["obs", "log_std"], ["logits"])], initializers=[("log_std", w)])
    tm._separate_initializers(model.graph)
    assert [list(n.input) for n in model.graph.node] == [["log_std.param"], ["obs", "log_std"]]
    obs = np.ones((3, 2), np.float32)
    np.testing.assert_allclose(pp.load(model).run({"obs": obs})["logits"], obs * np.exp(w), rtol=1e-6)


def test_identities_that_alias_an_initializer_go_and_their_readers_read_it():
    w = np.ones((2,), np.float32)
    model = graph_of([helper.make_node("Identity", ["w"], ["w_alias"]),
                      helper.make_node("Identity", ["obs"], ["copy"]),
                      helper.make_node("Add", ["copy", "w_alias"], ["sum"]),
                      helper.make_node("Identity", ["w"], ["logits"])],
                     initializers=[("w", w)])
    tm._drop_initializer_identities(model.graph)
    assert [(n.op_type, list(n.input), list(n.output)) for n in model.graph.node] == [
        ("Identity", ["obs"], ["copy"]), ("Add", ["copy", "w"], ["sum"]), ("Identity", ["w"], ["logits"])]


def test_a_graph_without_initializer_identities_is_left_as_it_is():
    model = graph_of([helper.make_node("Identity", ["obs"], ["logits"])])
    before = model.SerializeToString()
    tm._drop_initializer_identities(model.graph)
    assert model.SerializeToString() == before

def test_a_transpose_that_alone_reads_an_initializer_is_laid_out_in_it_and_its_value_info_goes():
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    shared, out = np.ones((2, 2), np.float32), np.arange(6, dtype=np.float32).reshape(2, 3) / 4
    model = graph_of([helper.make_node("Transpose", ["w"], ["w_t"], perm=[1, 0]),
                      helper.make_node("MatMul", ["obs", "w"], ["h"]),  # obs (N, 2) @ w (2, 3): w read twice, kept
                      helper.make_node("Transpose", ["w"], ["w_t2"]),
                      helper.make_node("Transpose", ["s"], ["s_t"]),  # read once, by a Transpose that is an output
                      helper.make_node("Transpose", ["v"], ["v_t"]),  # the only reader: laid out
                      helper.make_node("MatMul", ["h", "v_t"], ["logits"])],
                     outputs=("logits", "s_t"), initializers=[("w", w), ("s", shared), ("v", out)], value_info=["v_t"])
    tm._fold_initializer_transposes(model.graph)
    assert [(n.op_type, list(n.input), list(n.output)) for n in model.graph.node] == [
        ("Transpose", ["w"], ["w_t"]), ("MatMul", ["obs", "w"], ["h"]), ("Transpose", ["w"], ["w_t2"]),
        ("Transpose", ["s"], ["s_t"]), ("MatMul", ["h", "v"], ["logits"])]
    arrays = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert np.array_equal(arrays["w"], w) and np.array_equal(arrays["v"], out.T) and arrays["v"].flags.c_contiguous
    assert [vi.name for vi in model.graph.value_info] == []
    obs = np.random.default_rng(2).normal(size=(4, 2)).astype(np.float32)
    assert np.array_equal(pp.load(model).run({"obs": obs})["logits"], (obs @ w) @ out.T)


def test_a_graph_without_initializer_transposes_is_left_as_it_is():
    model = graph_of([helper.make_node("Transpose", ["obs"], ["logits"])])
    before = model.SerializeToString()
    tm._fold_initializer_transposes(model.graph)
    assert model.SerializeToString() == before
    fed = graph_of([helper.make_node("Transpose", ["w"], ["w_t"]), helper.make_node("Add", ["obs", "w_t"], ["logits"])],
                   inputs=("obs", "w"), initializers=[("w", np.ones((2, 2), np.float32))])  # w may be fed: kept
    before = fed.SerializeToString()
    tm._fold_initializer_transposes(fed.graph)
    assert fed.SerializeToString() == before



# ---------------------------------------------------------------------------------------------
# the leaf a node belongs to when the exporter named only an ancestor

LEAVES = ["body.0", "body.1", "body.2", "head"]
CLASSES = {"": "Net", "body": "Sequential", "body.0": "Linear", "body.1": "Tanh", "body.2": "ReLU", "head": "Linear"}


@pytest.mark.parametrize("inputs, scope, previous, op, leaf", [
    (["x", "body.0.weight"], "", None, "Gemm", "body.0"),  # owns a parameter the node reads
    (["x", "body.0.weight"], "body", None, "Gemm", "body.0"),
    (["x", "body.0.weight"], "head", None, "Gemm", None),  # not under the scope named
    (["x", "other.weight"], "", None, "Gemm", None),
    (["x", "body.0.bias_not_init"], "", None, "Gemm", None),  # not an initializer
    (["x"], "", "body.0", "Tanh", "body.1"),  # the leaf after the previous one, its role the op's
    (["x"], "body", "body.0", "Tanh", "body.1"),
    (["x"], "", "body.0", "Relu", None),  # the role differs
    (["x"], "", "body.1", "Relu", "body.2"),
    (["x"], "head", "body.1", "Relu", None),
    (["x"], "", "head", "Gemm", None),  # the last leaf: nothing follows
    (["x"], "", "nowhere", "Tanh", None),
    (["x"], "", None, "Tanh", None),
])
def test_the_leaf_of_a_node_is_its_parameters_owner_or_the_next_leaf_of_its_role(inputs, scope, previous, op, leaf):
    node = helper.make_node(op, inputs, ["y"])
    assert tm._leaf_of(node, scope, previous, LEAVES, CLASSES, {"body.0.weight", "other.weight", "x.weight"}) == leaf


def test_a_leaf_of_an_unlisted_class_has_its_snake_case_role():
    classes = {"a": "Linear", "b": "MyAct"}
    assert tm._leaf_of(helper.make_node("MyAct", ["x"], ["y"]), "", "a", ["a", "b"], classes, set()) == "b"
    assert tm._leaf_of(helper.make_node("Relu", ["x"], ["y"]), "", "a", ["a", "b"], classes, set()) is None


# ---------------------------------------------------------------------------------------------
# the renaming pass on a TorchScript-style graph built here

MODULE_NAMES = {"", "body", "body.0", "body.1", "act", "head"}
TS_CLASSES = {"": "Net", "body": "Sequential", "body.0": "Linear", "body.1": "Tanh", "act": "GELU", "head": "Linear"}
TS_LEAVES = ["body.0", "body.1", "act", "head"]


def ts_graph():
    """obs -> body.0 Gemm -> body.1 Tanh -> a functional Mul by a Constant -> act (GELU spelt out) ->
    head Gemm -> logits, then a functional Split; ``body.0.weight`` is read through an Identity alias."""
    w = np.arange(4, dtype=np.float32).reshape(2, 2)
    b = np.array([1.0, -1.0], np.float32)
    n = helper.make_node
    nodes = [
        n("Identity", ["body.0.weight"], ["onnx::Gemm_9"], name="Identity_0"),
        n("Gemm", ["obs", "onnx::Gemm_9", "body.0.bias"], ["/body/body.0/Gemm_output_0"], name="/body/body.0/Gemm"),
        n("Tanh", ["/body/body.0/Gemm_output_0"], ["/body/body.1/Tanh_output_0"], name="/body/body.1/Tanh"),
        n("Constant", [], ["/Constant_output_0"], name="/Constant", value=numpy_helper.from_array(np.float32(2.0))),
        n("Mul", ["/body/body.1/Tanh_output_0", "/Constant_output_0"], ["/Mul_output_0"], name="/Mul"),
        n("Constant", [], ["/act/Constant_output_0"], name="/act/Constant", value=numpy_helper.from_array(np.float32(0.5))),
        n("Mul", ["/Mul_output_0", "/act/Constant_output_0"], ["/act/Mul_output_0"], name="/act/Mul"),
        n("Erf", ["/act/Mul_output_0"], ["/act/Erf_output_0"], name="/act/Erf"),
        n("Mul", ["/act/Erf_output_0", "/Constant_output_0"], ["/act/Mul_1_output_0"], name="/act/Mul_1"),
        n("Gemm", ["/act/Mul_1_output_0", "head.weight"], ["logits"], name="/head/Gemm"),
        n("Mul", ["logits", "/Constant_output_0"], ["/Mul_1_output_0"], name="/Mul_1"),
        n("Split", ["/Mul_1_output_0"], ["/Split_output_0", "", "/Split_output_2"], name="/Split", axis=1),
    ]
    for node in nodes:
        entry = node.metadata_props.add()
        entry.key, entry.value = "pkg.torch.onnx.name_scopes", "['']"
    model = graph_of(nodes, initializers=[("body.0.weight", w), ("body.0.bias", b), ("head.weight", w)],
                     value_info=["/body/body.1/Tanh_output_0"])
    helper.set_model_props(model, {"exporter": "x"})
    entry = model.graph.input[0].metadata_props.add()
    entry.key, entry.value = "k", "v"
    return model


@pytest.fixture(scope="module")
def ts_renamed():
    raw = ts_graph()
    before = raw.SerializeToString()
    renamed = tm.rename_graph(raw, "torchscript", ["logits"], MODULE_NAMES, TS_CLASSES, TS_LEAVES)
    assert raw.SerializeToString() == before  # the exporter's model is left as it was
    return renamed


def test_each_node_output_is_named_by_module_path_and_role(ts_renamed):
    model, _, _ = ts_renamed
    assert [(n.name, list(n.input), list(n.output)) for n in model.graph.node] == [
        ("body.0/linear", ["obs", "body.0.weight", "body.0.bias"], ["body.0/linear"]),
        ("body.1/tanh", ["body.0/linear"], ["body.1/tanh"]),
        ("constant", [], ["constant"]),
        ("mul", ["body.1/tanh", "constant"], ["mul"]),
        ("act/gelu/constant", [], ["act/gelu/constant"]),
        ("act/gelu/mul", ["mul", "act/gelu/constant"], ["act/gelu/mul"]),
        ("act/gelu/erf", ["act/gelu/mul"], ["act/gelu/erf"]),
        ("act/gelu", ["act/gelu/erf", "constant"], ["act/gelu"]),  # a constant computed outside: not its input
        ("logits", ["act/gelu", "head.weight"], ["logits"]),
        ("mul_1", ["logits", "constant"], ["mul_1"]),
        ("split", ["mul_1"], ["split", "", "split/split"]),
    ]


def test_the_renaming_maps_each_module_to_its_output_and_each_leaf_to_its_input(ts_renamed):
    _, module_tensors, module_inputs = ts_renamed
    assert module_tensors == {"body.0": "body.0/linear", "body.1": "body.1/tanh", "act": "act/gelu", "head": "logits"}
    assert module_inputs == {"body.0": "obs", "body.1": "body.0/linear", "act": "mul", "head": "act/gelu"}


def test_the_renaming_clears_the_exporters_metadata_and_names_the_batch_axis(ts_renamed):
    model, _, _ = ts_renamed
    graph = model.graph
    assert [v.name for v in graph.value_info] == ["body.1/tanh"]
    assert list(model.metadata_props) == [] and all(not n.metadata_props for n in graph.node)
    assert all(not v.metadata_props for v in [*graph.input, *graph.output])
    for v in [*graph.input, *graph.output]:
        dims = v.type.tensor_type.shape.dim
        assert (dims[0].dim_param, dims[1].dim_value, dims[1].dim_param) == ("batch", 2, "")
    assert [t.name for t in graph.initializer] == ["body.0.weight", "body.0.bias", "head.weight"]


def test_a_name_the_graph_holds_already_is_not_given_twice():
    n = helper.make_node
    model = graph_of([n("Relu", ["obs"], ["/Relu_output_0"], name="/Relu"),
                      n("Relu", ["/Relu_output_0"], ["/Relu_1_output_0"], name="/Relu_1"),
                      n("Add", ["/Relu_1_output_0", "relu"], ["logits"], name="/Add")], inputs=("obs", "relu"))
    renamed, tensors, inputs = tm.rename_graph(model, "torchscript", ["logits"], {""}, {"": "Net"}, [])
    assert [list(n.output) for n in renamed.graph.node] == [["relu_1"], ["relu_2"], ["logits"]]
    assert tensors == {} and inputs == {}


def test_the_dynamo_renaming_reads_the_scopes_from_node_metadata():
    n = helper.make_node
    nodes = [n("Gemm", ["obs", "fc.weight"], ["linear"], name="node_linear"),
             n("Relu", ["linear"], ["relu"], name="node_relu"),
             n("Neg", ["relu"], ["logits"], name="node_neg")]
    for node, scopes in zip(nodes, ["['', 'fc', 'linear']", "['', 'act', 'relu']", "['', 'neg']"]):
        entry = node.metadata_props.add()
        entry.key, entry.value = "pkg.torch.onnx.name_scopes", scopes
    model = graph_of(nodes, initializers=[("fc.weight", np.eye(2, dtype=np.float32))])
    classes = {"": "Net", "fc": "Linear", "act": "ReLU"}
    renamed, tensors, inputs = tm.rename_graph(model, "dynamo", ["logits"], {"", "fc", "act"}, classes, ["fc", "act"])
    assert [(n.name, list(n.output)) for n in renamed.graph.node] == [
        ("fc/linear", ["fc/linear"]), ("act/relu", ["act/relu"]), ("logits", ["logits"])]
    assert tensors == {"fc": "fc/linear", "act": "act/relu"} and inputs == {"fc": "obs", "act": "fc/linear"}
    # the same graph read as TorchScript names: no scopes, the leaves found by parameter and role
    renamed, tensors, _ = tm.rename_graph(model, "torchscript", ["logits"], {"", "fc", "act"}, classes, ["fc", "act"])
    assert [n.name for n in renamed.graph.node] == ["fc/linear", "act/relu", "logits"]


def test_a_leaf_read_from_two_tensors_has_no_single_input():
    n = helper.make_node
    model = graph_of([n("Add", ["obs", "other"], ["/add/Add_output_0"], name="/add/Add"),
                      n("Neg", ["/add/Add_output_0"], ["logits"], name="/Neg")], inputs=("obs", "other"))
    _, tensors, inputs = tm.rename_graph(model, "torchscript", ["logits"], {"", "add"}, {"": "Net", "add": "Adder"}, ["add"])
    assert tensors == {"add": "add/adder"} and inputs == {}


# ---------------------------------------------------------------------------------------------
# initializers -> state_dict keys


def parameters_of(model):
    return json.loads(props(model)["policyport.parameters"])


def test_initializers_take_the_key_whose_tensor_they_hold_directly_or_transposed():
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([0.5, -0.5], np.float32)
    n = helper.make_node
    model = graph_of([n("MatMul", ["obs", "onnx::MatMul_7"], ["h"]), n("Add", ["h", "onnx::Add_8"], ["logits"])],
                     inputs=("obs", "onnx::Add_8"), initializers=[("onnx::MatMul_7", w.T.copy()), ("onnx::Add_8", b)])
    state = {"fc.weight": w, "fc.bias": b, "steps": np.array([3], np.int64), "empty": np.zeros(0, np.float32),
             "names": np.array(["a"]), "unused": np.ones(3, np.float32)}
    before = model.SerializeToString()
    out, unmatched = tm.match_parameters(model, state)
    assert model.SerializeToString() == before
    assert [t.name for t in out.graph.initializer] == ["fc.weight", "fc.bias"]
    assert [list(n.input) for n in out.graph.node] == [["obs", "fc.weight"], ["h", "fc.bias"]]
    assert [i.name for i in out.graph.input] == ["obs", "fc.bias"]  # an initializer listed as an input too
    assert parameters_of(out) == {"fc.weight": {"name": "fc.weight", "transpose": [1, 0]}, "fc.bias": "fc.bias"}
    assert unmatched == ["steps", "empty", "names", "unused"]


def test_an_initializers_own_name_wins_else_the_first_free_key_and_the_rest_are_aliases():
    z = np.zeros(2, np.float32)
    model = graph_of([helper.make_node("Add", ["obs", "b.bias"], ["h"]), helper.make_node("Add", ["h", "zeros"], ["logits"])],
                     initializers=[("b.bias", z), ("zeros", z)])
    state = {"a.bias": z, "b.bias": z, "c.bias": z, "d.bias": z}
    out, unmatched = tm.match_parameters(model, state)
    assert [t.name for t in out.graph.initializer] == ["b.bias", "a.bias"]
    assert parameters_of(out) == {"b.bias": {"name": "b.bias", "also": ["c.bias", "d.bias"]}, "a.bias": "a.bias"}
    assert unmatched == []


def test_a_key_another_tensor_is_named_after_is_recorded_without_renaming():
    w = np.ones((2, 2), np.float32) * 3
    model = graph_of([helper.make_node("Add", ["obs", "init"], ["fc.weight"]),
                      helper.make_node("Relu", ["fc.weight"], ["logits"])], initializers=[("init", w)])
    out, _ = tm.match_parameters(model, {"fc.weight": w})
    assert [t.name for t in out.graph.initializer] == ["init"] and parameters_of(out) == {"init": "fc.weight"}


def test_two_initializers_that_would_take_one_name_keep_their_own():
    w = np.eye(2, dtype=np.float32)
    model = graph_of([helper.make_node("Add", ["obs", "i1"], ["h"]), helper.make_node("Add", ["h", "i2"], ["logits"])],
                     initializers=[("i1", w), ("i2", w)])
    out, unmatched = tm.match_parameters(model, {"a": w, "b": w.copy()})  # symmetric: each also matches transposed
    assert [t.name for t in out.graph.initializer] == ["a", "b"]
    assert parameters_of(out) == {"a": "a", "b": "b"} and unmatched == []


def test_a_transposed_match_prefers_an_initializers_own_name():
    w = np.arange(4, dtype=np.float32).reshape(2, 2)
    model = graph_of([helper.make_node("MatMul", ["obs", "fc.weight"], ["logits"])], initializers=[("fc.weight", w.T.copy())])
    out, _ = tm.match_parameters(model, {"other": w, "fc.weight": w})
    assert parameters_of(out) == {"fc.weight": {"name": "fc.weight", "transpose": [1, 0], "also": ["other"]}}
    model = graph_of([helper.make_node("MatMul", ["obs", "x"], ["logits"])], initializers=[("x", w.T.copy())])
    out, unmatched = tm.match_parameters(model, {"fc.weight": w, "also.weight": w, "other": w.T.copy()})
    assert parameters_of(out) == {"other": "other"} and unmatched == ["fc.weight", "also.weight"]


def test_an_initializer_matching_nothing_is_not_recorded_and_a_dtype_must_match():
    model = graph_of([helper.make_node("Add", ["obs", "c"], ["logits"])], initializers=[("c", np.ones(2, np.float32))])
    out, unmatched = tm.match_parameters(model, {"c64": np.ones(2, np.float64), "c2": np.ones(3, np.float32)})
    assert parameters_of(out) == {} and unmatched == ["c64", "c2"] and out.graph.initializer[0].name == "c"


# ---------------------------------------------------------------------------------------------
# exporting small modules


def mlp(dtype=torch.float32, bias=False):
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2, bias=bias)).to(dtype)


@pytest.fixture(scope="module")
def exported():
    module = mlp()
    module.train()
    return module, tm.export_module(module)


def test_an_exported_mlp_reads_like_the_module(exported):
    module, export = exported
    graph = export.model.graph
    assert [(n.op_type, n.name, list(n.input), list(n.output)) for n in graph.node] == [
        ("Gemm", "0/linear", ["obs", "0.weight", "0.bias"], ["0/linear"]),
        ("Tanh", "1/tanh", ["0/linear"], ["1/tanh"]),
        ("MatMul", "logits", ["1/tanh", "2.weight"], ["logits"]),  # bias-free: a pre-transposed constant, folded
    ]
    assert [(d.domain, d.version) for d in export.model.opset_import] == [("", 17)]
    assert [t.name for t in graph.initializer] == ["0.weight", "0.bias", "2.weight"]
    assert json.loads(props(export.model)["policyport.parameters"]) == {
        "0.weight": "0.weight", "0.bias": "0.bias", "2.weight": {"name": "2.weight", "transpose": [1, 0]}}
    assert export.module_tensors == {"0": "0/linear", "1": "1/tanh", "2": "logits"}
    assert export.module_inputs == {"0": "obs", "1": "0/linear", "2": "1/tanh"}
    assert export.output_names == ["logits"] and export.notes == [] and export.training
    assert module.training  # restored
    for v in [graph.input[0], graph.output[0]]:
        assert v.type.tensor_type.elem_type == FLOAT
        assert [(d.dim_param, d.dim_value) for d in v.type.tensor_type.shape.dim] in ([("batch", 0), ("", 3)], [("batch", 0), ("", 2)])
    weights = pp.extract_weights(export.model)
    for key, value in module.state_dict().items():
        assert weights[key].tobytes() == value.numpy().tobytes()


def test_an_export_says_whether_any_submodule_was_in_training_mode():
    module = mlp(bias=True)
    assert tm.export_module(module.eval()).training is False
    module[1].train()  # one submodule in training mode (a Dropout or BatchNorm there would train)
    export = tm.export_module(module)
    assert export.training is True and export.notes == [] and not module.training and module[1].training


def test_an_exported_mlp_runs_at_any_batch_as_torch_does(exported):
    module, export = exported
    obs = np.random.default_rng(4).normal(size=(5, 3)).astype(np.float32)
    with torch.no_grad():
        expected = module.eval()(torch.as_tensor(obs)).numpy()
    module.train()
    for backend in ("numpy", "onnxruntime"):
        np.testing.assert_allclose(pp.load(export.model, backend=backend).run({"obs": obs})["logits"], expected, rtol=1e-6, atol=1e-6)


def test_the_reference_records_each_module_under_its_graph_tensor_in_eval_mode(exported):
    module, export = exported
    obs = np.random.default_rng(5).normal(size=(4, 3))  # float64: run in the module's dtype
    recorded = tm.module_reference(module, export)(obs)
    assert module.training
    x = torch.as_tensor(obs, dtype=torch.float32)
    with torch.no_grad():
        h0 = module[0](x)
        h1 = torch.tanh(h0)
        out = h1 @ module[2].weight.T
    assert list(recorded) == ["0/linear", "1/tanh", "logits"]
    for name, expected in zip(recorded, (h0, h1, out)):
        assert recorded[name].dtype == np.float32
        np.testing.assert_allclose(recorded[name], expected.numpy(), rtol=1e-6, atol=1e-6)
    # the hooks are gone: a second module call records nothing more
    assert not any(m._forward_hooks for m in module.modules())


def test_the_exported_mlp_runs_in_float64_and_float16_in_the_modules_dtype():
    export = tm.export_module(mlp(torch.float64))
    assert export.model.graph.input[0].type.tensor_type.elem_type == TensorProto.DOUBLE
    assert {t.data_type for t in export.model.graph.initializer} == {TensorProto.DOUBLE}
    module = mlp(torch.float64)
    obs = np.random.default_rng(6).normal(size=(3, 3))
    recorded = tm.module_reference(module, export)(obs)
    with torch.no_grad():
        expected = module(torch.as_tensor(obs)).numpy()
    assert recorded["logits"].dtype == np.float64
    np.testing.assert_allclose(recorded["logits"], expected, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(pp.load(export.model, backend="onnxruntime").run({"obs": obs})["logits"], expected, rtol=1e-12, atol=1e-12)
    half = tm.export_module(mlp(torch.float16))
    assert half.model.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    assert {t.data_type for t in half.model.graph.initializer} == {TensorProto.FLOAT16}


def test_export_at_another_opset_and_with_output_names_and_a_state_dict_given():
    module = mlp(bias=True)
    weights = {f"policy.{k}": v.numpy() for k, v in module.state_dict().items()}
    export = tm.export_module(module.eval(), opset=13, output_names=("action",), state_dict=weights)
    assert export.model.opset_import[0].version == 13 and export.output_names == ["action"]
    assert [o.name for o in export.model.graph.output] == ["action"] and export.module_tensors["2"] == "action"
    assert [t.name for t in export.model.graph.initializer] == ["policy.0.weight", "policy.0.bias", "policy.2.weight", "policy.2.bias"]
    assert export.notes == []


def test_state_dict_entries_not_in_the_graph_are_noted_but_not_num_batches_tracked():
    class Spare(torch.nn.Module):
        def __init__(self, norm: bool):
            super().__init__()
            self.fc = torch.nn.Linear(3, 2)
            self.scale = torch.nn.Parameter(torch.full((3,), 0.75))
            if norm:
                self.bn = torch.nn.BatchNorm1d(2, affine=False)
            else:
                self.register_buffer("bn_num_batches_tracked", torch.tensor(4))

        def forward(self, x):
            return self.fc(x)

    module = Spare(True).eval()
    with torch.no_grad():
        module.bn.running_mean.fill_(0.25)
    notes = tm.export_module(module).notes
    assert notes == ["3 state_dict entries are not in the graph, which the module's forward does not read (changing "
                     "them changes no output): scale, bn.running_mean, bn.running_var"]
    export = tm.export_module(Spare(False).eval())  # the unread integer buffer is kept as a value
    assert export.notes == [
        "1 state_dict entry is not in the graph, which the module's forward does not read (changing it changes no "
        "output): scale"]
    assert pp.extract_weights(export.model)["bn_num_batches_tracked"].tolist() == 4


class Baked(torch.nn.Module):
    """Reads its buffer ``gain`` as a Python number, which tracing takes as a constant; it samples noise."""

    def __init__(self, noise: bool):
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)
        self.register_buffer("gain", torch.tensor(-1.5))
        self.unread = torch.nn.Parameter(torch.tensor([0.25, -3.0]))
        self.noise = noise

    def forward(self, x):
        y = self.fc(x) * float(self.gain)
        return y + torch.randn_like(y) if self.noise else y


def test_an_entry_the_forward_reads_but_the_graph_does_not_hold_is_refused_by_name():
    module = Baked(noise=False).eval()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    with pytest.raises(BadModelError) as caught:
        tm.export_module(module)
    assert str(caught.value) == (
        "the module's forward reads the state_dict entry 'gain', but the graph the torchscript exporter wrote does "
        "not hold it: the values were taken as constants (a Python number read from a tensor, float(t) or t.item(), "
        "is traced as one), so extract could not give it back; compute with the tensor itself, or use the dynamo "
        "exporter")
    after = module.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())  # each entry put back bit for bit


def test_reading_an_entry_is_told_on_the_same_random_draws_and_leaves_torchs_random_state_alone():
    module = Baked(noise=True).eval()
    example = torch.ones(2, 3)
    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    assert tm._read_entries(module, example, ["gain", "unread", "fc.bias", "missing"]) == ["gain", "fc.bias"]
    assert torch.equal(torch.rand(4), expected)
    assert tm._read_entries(module, example, []) == [] and tm._read_entries(module, example, ["missing"]) == []


def test_an_entry_whose_change_makes_the_forward_fail_is_read():
    class Sized(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("width", torch.tensor(3))
            self.register_buffer("flag", torch.tensor(True))

        def forward(self, x):
            return x.reshape(-1, int(self.width))

    module = Sized()
    assert tm._read_entries(module, torch.ones(2, 3), ["width", "flag"]) == ["width"]  # a bool entry is not changed
    assert module.width.item() == 3 and module.training


def test_an_unknown_exporter_and_dynamo_on_torchscript_are_refused():
    with pytest.raises(OptionError) as caught:
        tm.export_module(mlp(), exporter="onnx")
    assert str(caught.value) == "unknown exporter 'onnx'; choose torchscript or dynamo"
    scripted = torch.jit.script(mlp())
    with pytest.raises(OptionError) as caught:
        tm.export_module(scripted, exporter="dynamo")
    assert str(caught.value) == "the dynamo exporter cannot trace a TorchScript module; use --exporter torchscript"


def test_an_opset_newer_than_the_exporter_writes_is_refused_naming_the_newest():
    version = torch.__version__.split("+")[0]
    with pytest.raises(OptionError) as caught:
        tm.export_module(mlp(), opset=21)
    assert str(caught.value) == (f"opset 21 is out of range for the torchscript exporter: torch {version} writes opset 20 "
                                 "at most with it; choose --opset 20 or lower (or --exporter dynamo)")
    with pytest.raises(OptionError) as caught:
        tm.export_module(mlp(), exporter="dynamo", opset=24)
    assert str(caught.value) == (f"opset 24 is out of range for the dynamo exporter: torch {version} writes opset 23 "
                                 "at most with it; choose --opset 23 or lower")


def test_a_forward_that_fails_on_the_observation_asks_for_the_shape():
    class Reshape(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 2)

        def forward(self, x):
            return self.fc(x.reshape(-1, 5))

    with pytest.raises(BadModelError) as caught:
        tm.export_module(Reshape())
    assert str(caught.value) == ("the module's forward fails on an observation of shape (batch, 3): RuntimeError: shape '[-1, 5]' "
                                 "is invalid for input of size 6; give the shape with --input-shape")
    assert isinstance(caught.value.__cause__, RuntimeError)


def test_the_export_uses_the_input_shape_given():
    module = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(6, 2))
    export = tm.export_module(module, input_shape=(2, 3))
    dims = export.model.graph.input[0].type.tensor_type.shape.dim
    assert [(d.dim_param, d.dim_value) for d in dims] == [("batch", 0), ("", 2), ("", 3)]
    assert export.module_tensors == {"0": "0/flatten", "1": "logits"}


# ---------------------------------------------------------------------------------------------
# Softplus with its beta and threshold


def softplus_constants(model):
    values = {}
    for node in model.graph.node:
        if node.op_type == "Constant":
            t = node.attribute[0].t
            values[node.output[0]] = (t.data_type, numpy_helper.to_array(t).item())
    return values


@pytest.mark.parametrize("dtype, beta, ops, constants", [
    (torch.float32, 1.0, ["Gemm", "Softplus", "Constant", "Greater", "Where"], [(FLOAT, 5.0)]),
    (torch.float32, 2.0, ["Gemm", "Constant", "Mul", "Softplus", "Constant", "Div", "Constant", "Greater", "Where"],
     [(FLOAT, 2.0), (FLOAT, 2.0), (FLOAT, 5.0)]),
    (torch.float64, 1.0, ["Gemm", "Exp", "Constant", "Add", "Log", "Constant", "Greater", "Where"],
     [(TensorProto.DOUBLE, 1.0), (TensorProto.DOUBLE, 5.0)]),
    (torch.float64, 3.0, ["Gemm", "Constant", "Mul", "Exp", "Constant", "Add", "Log", "Constant", "Div", "Constant", "Greater", "Where"],
     [(TensorProto.DOUBLE, 3.0), (TensorProto.DOUBLE, 1.0), (TensorProto.DOUBLE, 3.0), (TensorProto.DOUBLE, 5.0)]),
    (torch.float16, 2.0, ["Gemm", "Constant", "Mul", "Softplus", "Constant", "Div", "Constant", "Greater", "Where"],
     [(TensorProto.FLOAT16, 2.0), (TensorProto.FLOAT16, 2.0), (TensorProto.FLOAT16, 5.0)]),
])
def test_softplus_is_spelt_with_its_beta_and_threshold(dtype, beta, ops, constants):
    torch.manual_seed(7)
    module = torch.nn.Sequential(torch.nn.Linear(3, 64), torch.nn.Softplus(beta=beta, threshold=5.0)).to(dtype)
    with torch.no_grad():
        module[0].weight.mul_(4)
    export = tm.export_module(module)
    assert [n.op_type for n in export.model.graph.node] == ops
    assert list(softplus_constants(export.model).values()) == constants
    if dtype == torch.float16:
        return
    obs = np.random.default_rng(8).normal(size=(16, 3)).astype(np.float64 if dtype == torch.float64 else np.float32)
    with torch.no_grad():
        pre = module[0](torch.as_tensor(obs)) * beta
        expected = module(torch.as_tensor(obs)).numpy()
    assert (pre > 5).any() and (pre < 5).any()
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    got = pp.load(export.model, backend="onnxruntime").run({"obs": obs})["logits"]
    np.testing.assert_allclose(got, expected, rtol=tol, atol=tol)


def test_softplus_is_exported_as_torch_writes_it_once_policyport_is_done():
    tm.export_module(torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Softplus()))
    import io

    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(torch.nn.Softplus(), (torch.zeros(1, 2),), f, dynamo=False, opset_version=17)
    assert "Where" not in {n.op_type for n in onnx.load_from_string(f.getvalue()).graph.node}


# ---------------------------------------------------------------------------------------------
# the converters: options refused, provenance, TorchScript files


@pytest.mark.parametrize("option, error, message", [
    ({"head": "categorical"}, OptionError, "--head applies to weight files; {} exports its own outputs"),
    ({"obs_norm": "vecnormalize.pkl"}, BadModelError, "an observation-normalisation file applies to SB3 sources, not to {}"),
    ({"activation": "relu"}, OptionError, "--activation applies to weight files; {} carries its own activations"),
])
def test_both_converters_refuse_the_options_of_weight_files(option, error, message, tmp_path):
    with pytest.raises(error) as caught:
        tm.convert_torch(mlp(), ConvertOptions(**option))
    assert type(caught.value) is error and str(caught.value) == message.format("a torch module")
    with pytest.raises(error) as caught:
        tm.convert_torchscript(tmp_path / "absent.pt", ConvertOptions(**option))
    assert str(caught.value) == message.format("a TorchScript file")


def test_a_converted_module_records_its_provenance_and_passes_the_checker():
    c = tm.convert_torch(mlp().eval(), ConvertOptions(output_names=("q",)))
    assert c.kind == "torch" and c.notes == []
    meta = props(c.model)
    assert json.loads(meta["policyport.source"]) == {"kind": "torch", "class": "Sequential", "exporter": "torchscript"}
    assert meta["policyport.head"] == "none" and "policyport.parameters" in meta
    assert c.model.producer_name == "policyport" and c.model.producer_version == pp.__version__
    assert [o.name for o in c.model.graph.output] == ["q"] and list(c.reference(np.zeros((2, 3), np.float32))) == ["0/linear", "1/tanh", "q"]


def test_finish_keeps_the_models_metadata_and_refuses_a_model_the_checker_refuses():
    model = graph_of([helper.make_node("Relu", ["obs"], ["logits"])])
    model.opset_import[0].version = 17
    helper.set_model_props(model, {"kept": "1", "policyport.head": "old"})
    tm._finish(model, {"kind": "x"})
    assert props(model) == {"kept": "1", "policyport.head": "none", "policyport.source": '{"kind": "x"}'}
    broken = graph_of([helper.make_node("Relu", ["missing"], ["logits"])])
    with pytest.raises(BadModelError) as caught:
        tm._finish(broken, {})
    assert str(caught.value).startswith("the exported model fails onnx.checker: ") and "missing" in str(caught.value)
    assert isinstance(caught.value.__cause__, onnx.checker.ValidationError)


class Custom(torch.nn.Module):
    """A custom forward over two leaves: scripted, it takes no hooks and is no Sequential."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 4)
        self.mid = torch.nn.Linear(4, 4)
        self.out = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.out(self.mid(torch.relu(self.fc(x)) * 2.0))


@pytest.fixture(scope="module")
def scripted_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ts")
    torch.manual_seed(9)
    files = {}
    for name, module in [("seq", mlp(bias=True).eval()), ("custom", Custom().eval())]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.jit.save(torch.jit.script(module), folder / f"{name}.pt")
        files[name] = (folder / f"{name}.pt", module)
    return files


def test_a_torchscript_file_saved_in_training_mode_is_exported_in_eval_mode_and_says_so(tmp_path):
    module = mlp(bias=True)  # training mode, as torch.nn modules start
    path = tmp_path / "training.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(torch.jit.script(module), path)
    c = convert_source(str(path), trust=True)
    assert c.notes == [] and [a.topic for a in c.assumptions] == ["observation normalisation", "mode"]
    recorded = json.loads(props(c.model)["policyport.assumptions"])
    assert recorded[1] == {**MODE, "because": MODE["because"].format("the file holds a module saved"),
                           "settle": "save the module in eval mode (module.eval() before torch.jit.save)"}
    report = pp.verify(c.model, np.zeros((2, 3), np.float32), reference=c.reference, reference_oracle=c.oracle)
    assert [(a["assumes"], a["side"], a["checked"]) for a in report.assumptions if a["topic"] == "mode"] == [
        (MODE["assumes"], "both", False)]  # torch ran it in eval mode too: the source side settles nothing there
    obs = np.random.default_rng(11).normal(size=(4, 3)).astype(np.float32)
    with torch.no_grad():
        expected = module.eval()(torch.as_tensor(obs)).numpy()
    np.testing.assert_allclose(pp.load(c.model).run({"obs": obs})["logits"], expected, rtol=1e-5, atol=1e-6)


def test_a_torchscript_file_records_its_name_and_digest(scripted_files):
    path, module = scripted_files["seq"]
    c = tm.convert_torchscript(str(path), ConvertOptions(trust=True))
    assert c.kind == "torchscript"
    assert json.loads(props(c.model)["policyport.source"]) == {
        "kind": "torchscript", "file": "seq.pt", "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "exporter": "torchscript"}
    assert tm._sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest()
    obs = np.random.default_rng(10).normal(size=(5, 3)).astype(np.float32)
    recorded = c.reference(obs)
    assert list(recorded) == ["0/linear", "1/tanh", "logits"]  # a scripted Sequential runs child by child
    with torch.no_grad():
        h0 = module[0](torch.as_tensor(obs))
        expected = [h0, torch.tanh(h0), module(torch.as_tensor(obs))]
    for name, value in zip(recorded, expected):
        np.testing.assert_allclose(recorded[name], value.numpy(), rtol=1e-6, atol=1e-6)
    assert pp.verify(c.model, obs, reference=c.reference, atol=1e-5, rtol=1e-5).passed


def test_a_scripted_custom_forward_runs_each_leaf_on_the_graphs_input_to_it(scripted_files):
    path, module = scripted_files["custom"]
    c = tm.convert_torchscript(path, ConvertOptions(trust=True))
    names = [n.output[0] for n in c.model.graph.node]
    assert names == ["fc/linear", "relu", "constant", "mul", "mid/linear", "logits"]
    obs = np.random.default_rng(11).normal(size=(4, 3)).astype(np.float32)
    recorded = c.reference(obs)
    with torch.no_grad():
        h = module.fc(torch.as_tensor(obs))
        expected = {"logits": module(torch.as_tensor(obs)), "fc/linear": h, "mid/linear": module.mid(torch.relu(h) * 2)}
    assert sorted(recorded) == ["fc/linear", "logits", "mid/linear"]
    for name, value in expected.items():
        np.testing.assert_allclose(recorded[name], value.numpy(), rtol=1e-6, atol=1e-6)


def test_run_scripted_keeps_each_sequential_childs_output_by_path():
    torch.manual_seed(12)
    inner = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU())
    module = torch.nn.Sequential(inner, torch.nn.Linear(3, 1)).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted = torch.jit.script(module)
    kept = {}
    x = torch.randn(4, 2)
    out = tm._run_scripted(scripted, "", x, lambda path, value: kept.setdefault(path, value))
    assert list(kept) == ["0.0", "0.1", "0", "1", ""]
    with torch.no_grad():
        h = inner[0](x)
        np.testing.assert_allclose(kept["0.0"].detach().numpy(), h.numpy(), rtol=1e-6)
        np.testing.assert_allclose(kept["0"].detach().numpy(), torch.relu(h).numpy(), rtol=1e-6)
        np.testing.assert_allclose(out.detach().numpy(), module(x).numpy(), rtol=1e-6)
    assert kept[""] is out


def test_a_file_of_another_layout_is_told_for_what_it_is_before_trust_is_asked_for(tmp_path):
    path = tmp_path / "junk.pt"
    path.write_bytes(b"not a zip archive\n")
    for trust in (False, True):
        with pytest.raises(UnreadableFileError) as caught:
            tm.convert_torchscript(path, ConvertOptions(trust=trust))
        assert str(caught.value) == (f"{path} is not a TorchScript file (torch.jit.save writes a zip archive holding "
                                     "data.pkl, constants.pkl and code/): it is a text file")
    torch.save({"w": torch.zeros(2)}, tmp_path / "sd.pt")
    with pytest.raises(UnreadableFileError, match=r"it is a PyTorch file \(torch\.save\); policyport converts it with "
                                                  r"--from state-dict$"):
        tm.convert_torchscript(tmp_path / "sd.pt", ConvertOptions())
    with pytest.raises(UnreadableFileError, match=r"absent\.pt: no such file$"):
        tm.convert_torchscript(tmp_path / "absent.pt", ConvertOptions())


def test_an_unreadable_torchscript_file_is_refused_by_its_first_line(tmp_path):
    import zipfile

    path = tmp_path / "broken.pt"
    with zipfile.ZipFile(path, "w") as zf:  # a TorchScript file's layout, not its contents
        for name in ("broken/data.pkl", "broken/constants.pkl", "broken/version"):
            zf.writestr(name, b"junk")
    with pytest.raises(pp.TrustRequiredError):
        tm.convert_torchscript(path, ConvertOptions())
    with pytest.raises(UnreadableFileError) as caught:
        tm.convert_torchscript(path, ConvertOptions(trust=True))
    message = str(caught.value)
    assert message.startswith(f"{path} is not a readable TorchScript file: ") and "\n" not in message
    assert isinstance(caught.value.__cause__, Exception)


# ---------------------------------------------------------------------------------------------
# torch primitives of the weight-only reference forward pass


@pytest.fixture
def ops():  # per test (it is cheap): a mutation tool maps a module-scoped fixture's call to its first test only
    return torch_ops()


ACTIVATIONS = {
    "tanh": torch.tanh, "relu": torch.relu, "elu": torch.nn.functional.elu, "selu": torch.selu,
    "swish": torch.nn.functional.silu, "softplus": torch.nn.functional.softplus, "gelu": torch.nn.functional.gelu,
    "mish": torch.nn.functional.mish, "hardswish": torch.nn.functional.hardswish, "sigmoid": torch.sigmoid,
    "linear": lambda x: x, "leaky_relu": lambda x: torch.nn.functional.leaky_relu(x, 0.3),
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_each_activation_step_is_the_torch_function(ops, name):
    from policyport.converter.activations import Activation
    from policyport.converter.build import Step

    x = torch.linspace(-4, 4, 17, dtype=torch.float64).reshape(1, 17)
    act = Activation(name, 0.3 if name == "leaky_relu" else None)
    got = ops.step(Step("activation", "fc", act), x)
    assert got.dtype == torch.float64 and not got.requires_grad
    np.testing.assert_array_equal(got.numpy(), ACTIVATIONS[name](x).numpy())
    np.testing.assert_allclose(got.numpy(), act.reference(x.numpy()), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layout", ["in_out", "out_in"])
@pytest.mark.parametrize("bias", [True, False])
def test_the_affine_map_is_an_nn_linear_with_the_layers_weight(ops, layout, bias):
    from policyport.converter.build import Dense

    rng = np.random.default_rng(13)
    w = rng.normal(size=(3, 4))  # [in, out]
    b = rng.normal(size=4) if bias else None
    layer = Dense("fc", w if layout == "in_out" else w.T.copy(), "fc.weight", b, "fc.bias" if bias else None, layout)
    x = rng.normal(size=(5, 3))
    got = ops.affine(layer, ops.tensor(x))
    assert got.dtype == torch.float64 and not got.requires_grad
    expected = x @ w + (b if bias else 0)
    np.testing.assert_allclose(ops.to_numpy(got), expected, rtol=1e-12, atol=1e-12)


def test_the_norm_steps_are_torchs_layer_and_batch_norm(ops):
    from policyport.converter.build import Step

    rng = np.random.default_rng(14)
    x = torch.as_tensor(rng.normal(size=(6, 4)))
    weight, bias = rng.normal(size=4), rng.normal(size=4)
    mean, var = rng.normal(size=4), rng.uniform(0.5, 2, size=4)
    step = Step("layer_norm", "ln", params={"weight": ("ln.weight", weight), "bias": ("ln.bias", bias)}, eps=0.25)
    expected = torch.nn.functional.layer_norm(x, (4,), torch.as_tensor(weight), torch.as_tensor(bias), 0.25)
    np.testing.assert_array_equal(ops.step(step, x).numpy(), expected.numpy())
    bare = ops.step(Step("layer_norm", "ln", eps=0.25), x).numpy()
    centred = x.numpy() - x.numpy().mean(1, keepdims=True)
    np.testing.assert_allclose(bare, centred / np.sqrt((centred ** 2).mean(1, keepdims=True) + 0.25), rtol=1e-12)
    params = {"running_mean": ("bn.running_mean", mean), "running_var": ("bn.running_var", var),
              "weight": ("bn.weight", weight), "bias": ("bn.bias", bias)}
    got = ops.step(Step("batch_norm", "bn", params=params, eps=0.5), x).numpy()
    np.testing.assert_allclose(got, (x.numpy() - mean) / np.sqrt(var + 0.5) * weight + bias, rtol=1e-12)
    del params["weight"], params["bias"]
    got = ops.step(Step("batch_norm", "bn", params=params, eps=0.5), x).numpy()
    np.testing.assert_allclose(got, (x.numpy() - mean) / np.sqrt(var + 0.5), rtol=1e-12)


def test_the_remaining_primitives_compute_as_numpy_does(ops):
    from policyport.converter.build import ObsNorm
    from policyport.converter.sources.reference import _NumpyOps

    rng = np.random.default_rng(15)
    x = rng.normal(size=(3, 2, 2)).astype(np.float32)
    t = ops.tensor(x)
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32
    assert ops.to_numpy(ops.flatten(t)).tolist() == x.reshape(3, 4).tolist()
    flat = ops.flatten(t)
    norm = ObsNorm(mean=np.full(4, 0.5), var=np.full(4, 4.0), epsilon=1e-8, clip_obs=0.3)
    np.testing.assert_array_equal(ops.obs_norm(norm, flat).numpy(), _NumpyOps.obs_norm(norm, flat.numpy()))
    assert ops.concat([flat, flat[:, :1]]).numpy().tolist() == np.concatenate([x.reshape(3, 4), x.reshape(3, 4)[:, :1]], 1).tolist()
    v = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert ops.broadcast(v, flat).numpy().tolist() == [[1.0, 2.0, 3.0, 4.0]] * 3
    scores = torch.tensor([[0.0, 3.0, 1.0], [5.0, -1.0, 2.0]])
    assert ops.argmax(scores).tolist() == [1, 0]
    low, high = torch.tensor([-0.5, 0.0, 1.0]), torch.tensor([0.5, 2.0, 1.5])
    assert ops.clip(scores, low, high).tolist() == [[0.0, 2.0, 1.0], [0.5, 0.0, 1.5]]
    assert ops.tanh(scores).tolist() == torch.tanh(scores).tolist()
    as64 = ops.asarray([1, 2], torch.zeros(1, dtype=torch.float64))
    assert as64.dtype == torch.float64 and as64.tolist() == [1.0, 2.0]


# ---------------------------------------------------------------------------------------------
# the dynamo exporter


@pytest.fixture(scope="module")
def dynamo_exports():
    pytest.importorskip("onnxscript")
    module = mlp().eval()
    return module, tm.export_module(module, exporter="dynamo"), tm.export_module(module, exporter="dynamo", opset=20,
                                                                                  output_names=("q",))


@pytest.mark.slow
def test_the_dynamo_export_reads_like_the_module_and_runs_at_any_batch(dynamo_exports):
    module, export, at20 = dynamo_exports
    graph = export.model.graph
    assert [(n.op_type, n.name, list(n.input), list(n.output)) for n in graph.node] == [
        ("Gemm", "0/linear", ["obs", "0.weight", "0.bias"], ["0/linear"]),
        ("Tanh", "1/tanh", ["0/linear"], ["1/tanh"]),
        ("Gemm", "logits", ["1/tanh", "2.weight"], ["logits"]),
    ]
    assert export.notes == ["the dynamo exporter writes opset 18 or newer; exported at opset 18"]
    assert [(d.domain, d.version) for d in export.model.opset_import] == [("", 18)]
    assert [(d.domain, d.version) for d in at20.model.opset_import] == [("", 20)] and at20.notes == []
    assert [o.name for o in at20.model.graph.output] == ["q"] and at20.module_tensors["2"] == "q"
    assert export.module_tensors == {"0": "0/linear", "1": "1/tanh", "2": "logits"}
    assert export.module_inputs == {"0": "obs", "1": "0/linear", "2": "1/tanh"}
    obs = np.random.default_rng(16).normal(size=(5, 3)).astype(np.float32)
    with torch.no_grad():
        expected = module(torch.as_tensor(obs)).numpy()
    for model in (export.model, at20.model):
        np.testing.assert_allclose(pp.load(model, backend="onnxruntime").run({"obs": obs})[model.graph.output[0].name],
                                   expected, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# missing frameworks: each step names the package and the extra that installs it


def missing(module: str, purpose: str, extra: str) -> str:
    return (f"{purpose} needs the Python package {module!r}, which is not installed; "
            f"install it with: pip install 'policyport[{extra}]'")


def test_without_onnx_each_graph_step_names_the_onnx_extra(monkeypatch):
    model = graph_of([helper.make_node("Relu", ["obs"], ["logits"])])
    monkeypatch.setitem(__import__("sys").modules, "onnx", None)
    for call in (lambda: tm.match_parameters(model, {}), lambda: tm._finish(model, {}),
                 lambda: tm.rename_graph(model, "torchscript", ["logits"], {""}, {"": "Net"}, [])):
        with pytest.raises(pp.MissingDependencyError) as caught:
            call()
        assert str(caught.value) == missing("onnx", "building an ONNX model", "onnx") and caught.value.extra == "onnx"


def test_without_torch_each_entry_point_says_what_needed_it(monkeypatch, tmp_path):
    module = mlp()
    script = Path(__file__).resolve().parents[2] / "fixtures" / "torch" / "tied.torchscript.pt"
    monkeypatch.setitem(__import__("sys").modules, "torch", None)
    for call, purpose in [(lambda: tm.export_module(module), "converting a torch module"),
                          (lambda: torch_ops(), "the torch reference forward pass"),
                          (lambda: tm.convert_torchscript(script, ConvertOptions(trust=True)),
                           "converting a TorchScript file"),
                          (lambda: tm.input_shape_of(module, (3,)) and tm._param_dtype(module), "converting a torch module")]:
        with pytest.raises(pp.MissingDependencyError) as caught:
            call()
        assert str(caught.value) == missing("torch", purpose, "torch")


class Branch(torch.nn.Module):
    """A forward whose trace depends on the observation's values (a Python branch on a tensor)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(x) * (2.0 if bool(x[0, 0] > 0) else 3.0)


def test_the_export_does_not_depend_on_torchs_global_random_state():
    signs = set()
    for seed in (0, 4):
        torch.manual_seed(seed)
        signs.add(bool(torch.randn(2, 3)[0, 0] > 0))
    assert signs == {True, False}  # these seeds would give a random example both branches
    module = Branch().eval()
    exported = set()
    for seed in (0, 4):
        torch.manual_seed(seed)
        exported.add(tm.export_module(module).model.SerializeToString())
    assert len(exported) == 1
