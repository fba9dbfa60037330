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

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import policyport as pp  # noqa: E402
from policyport.converter import ConvertOptions, convert_source  # noqa: E402
from policyport.converter import torch_module as tm  # noqa: E402
from policyport.errors import BadModelError, OptionError, UnreadableFileError  # noqa: E402

FLOAT = TensorProto.FLOAT


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


TRAINING_NOTE = ("the module was in training mode; it was exported in eval mode (Dropout off, "
                 "BatchNorm on running statistics) and put back in training mode afterwards")


def test_eval_mode_notes_training_and_restores_each_submodules_mode_even_on_error():
    module = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout())
    module[1].eval()
    notes: list[str] = []
    with pytest.raises(KeyError), tm._eval_mode(module, notes):
        assert not module.training and not module[0].training
        raise KeyError("x")
    assert notes == [TRAINING_NOTE]
    assert module.training and module[0].training and not module[1].training
    notes = []
    with tm._eval_mode(module.eval(), notes):
        pass
    assert notes == [] and not module.training


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
        n("Mul", ["/act/Erf_output_0", "/Mul_output_0"], ["/act/Mul_1_output_0"], name="/act/Mul_1"),
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
        ("act/gelu", ["act/gelu/erf", "mul"], ["act/gelu"]),
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
