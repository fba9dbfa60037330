"""The compiled plan's memory rules: results never alias feeds or weights, nor change on later calls."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import policyport as pp


def model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def f32(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def test_an_output_that_is_a_weight_is_a_copy_and_weights_stay_intact(tmp_path):
    m = model([helper.make_node("Gemm", ["obs", "W", "B"], ["y"]), helper.make_node("Identity", ["B"], ["bias"])],
              [f32("obs", ["batch", 2])], [f32("y", ["batch", 2]), f32("bias", [2])],
              [numpy_helper.from_array(np.eye(2, dtype=np.float32), "W"),
               helper.make_tensor("B", TensorProto.FLOAT, [2], [0.5, -0.5])])
    pp.pack(m, tmp_path / "bundle")
    obs = np.zeros((1, 2), np.float32)
    for source in (m, tmp_path / "bundle"):
        session = pp.load(source, backend="numpy")
        for run in (session.run, session.record):
            out = run(obs)
            out["bias"] *= 100.0
            np.testing.assert_array_equal(session.run(obs)["y"], [[0.5, -0.5]])


def test_outputs_never_alias_the_feed():
    m = model([helper.make_node("Slice", ["obs", "s", "e", "ax"], ["goal"]), helper.make_node("Identity", ["obs"], ["same"])],
              [f32("obs", ["batch", 4])], [f32("goal", ["batch", 2]), f32("same", ["batch", 4])],
              [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("s", [2]), ("e", [4]), ("ax", [1]))])
    session = pp.load(m, backend="numpy")
    buffer = np.array([[1, 2, 3, 4]], np.float32)
    for run in (session.run, session.record, lambda f: session.observe(f, lambda i, j, v: v)):
        out = run(buffer)
        buffer[:] = 0  # an environment refilling its observation buffer
        np.testing.assert_array_equal(out["goal"], [[3, 4]])
        np.testing.assert_array_equal(out["same"], [[1, 2, 3, 4]])
        buffer[:] = [1, 2, 3, 4]


def test_earlier_results_survive_later_calls(metadrive_model, metadrive_obs):
    session = pp.load(metadrive_model, backend="numpy")
    first, recorded = session.run(metadrive_obs[:3]), session.record(metadrive_obs[:3])
    kept = {k: v.copy() for k, v in first.items()}, {k: v.copy() for k, v in recorded.items()}
    session.run(metadrive_obs[3:6])
    session.record(metadrive_obs[3:6])
    for now, then in zip((first, recorded), kept):
        for name in then:
            np.testing.assert_array_equal(now[name], then[name])


def test_observers_cannot_write_into_weights():
    m = model([helper.make_node("Identity", ["B"], ["b_view"]), helper.make_node("Add", ["obs", "b_view"], ["y"])],
              [f32("obs", ["batch", 2])], [f32("y", ["batch", 2])],
              [helper.make_tensor("B", TensorProto.FLOAT, [2], [0.5, -0.5])])  # float_data: a writable array
    session = pp.load(m, backend="numpy")
    obs = np.zeros((1, 2), np.float32)

    def vandal(node_index, output_index, value):
        value[...] = 100.0  # the Identity output is the weight itself
        return value

    with pytest.raises(ValueError, match="read-only"):
        session.observe(obs, vandal)
    np.testing.assert_array_equal(session.run(obs)["y"], [[0.5, -0.5]])


def test_errors_name_the_failing_node_in_every_mode():
    m = model([helper.make_node("Tanh", ["obs"], ["a"], name="tanh_1"), helper.make_node("Tanh", ["a"], ["b"], name="tanh_2"),
               helper.make_node("Reshape", ["b", "shape"], ["y"], name="bad_reshape")],
              [f32("obs", ["batch", 6])], [f32("y", None)], [numpy_helper.from_array(np.array([4, 4], np.int64), "shape")])
    session = pp.load(m, backend="numpy")
    for run in (session.run, session.record):
        with pytest.raises(pp.BadModelError, match='Reshape node "bad_reshape"'):
            run(np.ones((2, 6), np.float32))


@pytest.mark.parametrize("backend", list(pp.BACKENDS))
def test_a_graph_without_nodes_records_its_output(backend):
    m = model([], [f32("obs", ["batch", 3])], [f32("obs", ["batch", 3])])
    obs = np.ones((2, 3), np.float32)
    recorded = pp.load(m, backend=backend).record(obs)
    assert list(recorded) == ["obs"] and recorded["obs"] is not obs
    np.testing.assert_array_equal(recorded["obs"], obs)


def test_zero_dimensional_results_are_arrays():
    m = model([helper.make_node("MatMul", ["a", "b"], ["d"]), helper.make_node("Tanh", ["d"], ["y"])],
              [f32("a", [3]), f32("b", [3])], [f32("y", [])])
    feeds = {"a": np.ones(3, np.float32), "b": np.ones(3, np.float32)}
    session = pp.load(m, backend="numpy")
    for out in (session.run(feeds), session.record(feeds)):
        assert type(out["y"]) is np.ndarray and out["y"].shape == ()
        assert out["y"] == np.tanh(np.float32(3))


# ------------------------------------------------------------------------------ large and hostile graphs


def relu_chain(length):
    names = ["obs", *(f"r{i}" for i in range(1, length)), "y"]
    return model([helper.make_node("Relu", [names[i]], [names[i + 1]], name=f"relu_{i}") for i in range(length)],
                 [f32("obs", ["batch", 4])], [f32("y", ["batch", 4])])


def test_a_plan_split_into_chunks_computes_bit_for_bit_what_one_function_does(metadrive_model, metadrive_obs, monkeypatch):
    from policyport.runtime.numpy import plan as plan_module

    whole = pp.load(metadrive_model)
    monkeypatch.setattr(plan_module, "CHUNK_LINES", 3)
    chunked = pp.load(metadrive_model)
    assert len(chunked.backend.plan._line_steps) > 3  # several chunk functions were made
    seen = []
    for a, b in ((whole.run(metadrive_obs), chunked.run(metadrive_obs)),
                 (whole.record(metadrive_obs), chunked.record(metadrive_obs)),
                 (whole.observe(metadrive_obs, lambda i, j, v: v), chunked.observe(metadrive_obs, lambda i, j, v: seen.append(i) or v))):
        assert list(a) == list(b)
        for name in a:
            assert a[name].dtype == b[name].dtype and a[name].tobytes() == b[name].tobytes()
    assert seen == list(range(len(metadrive_model.graph.node)))


def test_a_chunked_plan_names_the_failing_node(monkeypatch):
    from policyport.runtime.numpy import plan as plan_module

    monkeypatch.setattr(plan_module, "CHUNK_LINES", 1)
    m = model([helper.make_node("Tanh", ["obs"], ["a"], name="tanh_1"), helper.make_node("Tanh", ["a"], ["b"], name="tanh_2"),
               helper.make_node("Reshape", ["b", "shape"], ["y"], name="bad_reshape")],
              [f32("obs", ["batch", 6])], [f32("y", None)], [numpy_helper.from_array(np.array([4, 4], np.int64), "shape")])
    session = pp.load(m)
    for run in (session.run, session.record):
        with pytest.raises(pp.BadModelError, match='Reshape node "bad_reshape"'):
            run(np.ones((2, 6), np.float32))


def test_a_long_chain_compiles_in_chunks_and_runs():
    session = pp.load(relu_chain(5000))  # 5,000 generated lines: three chunk functions
    obs = np.array([[-1.0, 0.5, 2.0, -0.0]], np.float32)
    np.testing.assert_array_equal(session.run(obs)["y"], [[0.0, 0.5, 2.0, 0.0]])
    assert len(session.record(obs)) == 5000


def test_a_graph_of_more_nodes_than_the_limit_is_refused_before_compiling():
    from policyport.io.limits import using_limits

    with using_limits(nodes=10):
        with pytest.raises(pp.LimitExceededError, match="the graph has 11 nodes, more than the numpy backend's limit of 10; "
                                                         "if you trust the model, raise the limit with POLICYPORT_MAX_NODES=11"):
            pp.load(relu_chain(11))
        assert pp.load(relu_chain(10)).run(np.ones((1, 4), np.float32))["y"].shape == (1, 4)


@pytest.mark.parametrize("op,inputs,inits,shape", [
    ("ConstantOfShape", ["shape"], [("shape", [1024, 257])], (1024, 257)),
    ("Expand", ["obs", "shape"], [("shape", [257, 1, 4])], (257, 1024, 4)),
    ("Tile", ["obs", "repeats"], [("repeats", [1, 65])], (1024, 260)),
    ("Range", ["start", "limit", "delta"], [("start", 0), ("limit", 1024 * 257), ("delta", 1)], (1024 * 257,)),
])
def test_ops_sized_from_a_value_are_refused_above_the_limit_naming_the_node(op, inputs, inits, shape):
    from policyport.io.limits import using_limits

    m = model([helper.make_node(op, inputs, ["y"], name="grow")], [f32("obs", ["batch", 4])], [f32("y", None)],
              [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in inits])
    obs = np.ones((1024, 4), np.float32)
    itemsize = 8 if op == "Range" else 4
    with using_limits(array_bytes=1024 * 256 * itemsize):  # the output is one row of 1024 (or 4) above it
        with pytest.raises(pp.LimitExceededError, match=f'{op} node "grow" on the numpy backend: its output') as e:
            pp.load(m).run(obs)
    assert f"shape {shape})" in str(e.value)
    with using_limits(array_bytes=int(np.prod(shape)) * itemsize):  # exactly at the limit: computed
        assert pp.load(m).run(obs)["y"].shape == shape


def test_range_with_a_zero_or_infinite_step_count_is_a_bad_model_naming_the_node():
    for start, limit, delta, error in ((0.0, 5.0, 0.0, "ZeroDivisionError"), (0.0, np.inf, 1.0, "OverflowError"),
                                       (0.0, np.nan, 1.0, "ValueError")):
        m = model([helper.make_node("Range", ["s", "l", "d"], ["y"], name="count")], [f32("obs", ["batch", 4])],
                  [f32("y", None)], [numpy_helper.from_array(np.array(v, np.float32), n)
                                     for n, v in (("s", start), ("l", limit), ("d", delta))])
        with pytest.raises(pp.BadModelError, match=f'Range node "count" on the numpy backend failed: {error}'):
            pp.load(m).run(np.ones((1, 4), np.float32))


def test_running_out_of_memory_in_a_node_names_it(monkeypatch):
    from policyport.runtime.numpy import registry

    def exhausted(a, b):
        raise MemoryError("Unable to allocate 1 TiB")

    monkeypatch.setitem(registry._REGISTRY[("", "Add")], 7, registry.OpImpl("Add", 7, exhausted))
    m = model([helper.make_node("Add", ["obs", "obs"], ["y"], name="sum")], [f32("obs", ["batch", 4])], [f32("y", ["batch", 4])])
    session = pp.load(m)
    for run in (session.run, session.record):
        with pytest.raises(pp.LimitExceededError, match='Add node "sum" on the numpy backend ran out of memory: Unable to allocate 1 TiB'):
            run(np.ones((1, 4), np.float32))


# ------------------------------------------------------------------ what the plan knows before running


def exactly(message: str) -> str:
    import re

    return "^" + re.escape(message) + "$"


def const(name, value, dtype):
    return numpy_helper.from_array(np.asarray(value, dtype), name)


#: Ops whose output keeps the first input's element type (the plan's _SAME_AS_INPUT): op -> its
#: other inputs (constants) and attributes.
KEEPS_TYPE = {op: ([], {}) for op in (
    "Relu", "LeakyRelu", "Elu", "Selu", "Celu", "ThresholdedRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh",
    "Softplus", "Softsign", "Mish", "Gelu", "Neg", "Abs", "Exp", "Log", "Sqrt", "Reciprocal", "Sign", "Floor", "Ceil",
    "Round", "Erf", "Identity", "Softmax", "LogSoftmax", "Hardmax", "Clip", "Dropout")}
KEEPS_TYPE["PRelu"] = ([const("slope", [0.1] * 4, np.float32)], {})
KEEPS_TYPE.update({  # ops whose output type the plan infers otherwise
    "Gemm": ([const("w", np.ones((4, 4)), np.float32)], {}),
    "Flatten": ([], {}),
    "Concat": ([const("other", np.ones((1, 4)), np.float32)], {"axis": 0}),
    "MatMul": ([const("w", np.ones((4, 4)), np.float32)], {}),
    "Add": ([const("other", np.ones(4), np.float32)], {}),
    "Div": ([const("other", np.ones(4), np.float32)], {}),
})


@pytest.mark.parametrize("op", list(KEEPS_TYPE))
def test_an_output_type_known_before_running_refuses_a_mismatch_downstream_at_load(op):
    others, attrs = KEEPS_TYPE[op]
    nodes = [helper.make_node(op, ["obs", *(t.name for t in others)], ["o"], name="first", **attrs),
             helper.make_node("Add", ["o", "k"], ["y"], name="sum")]
    m = model(nodes, [f32("obs", ["batch", 4])], [f32("y", None)], [*others, const("k", np.ones(4), np.float64)], opset=20)
    with pytest.raises(pp.BadModelError, match=exactly('Add node "sum" (opset 20): its inputs must share one element '
                                                       "type; found input 0 float32, input 1 float64")):
        pp.load(m)


@pytest.mark.parametrize("op, dtype", [("Equal", "bool"), ("Greater", "bool"), ("Less", "bool"),
                                       ("GreaterOrEqual", "bool"), ("LessOrEqual", "bool"), ("Cast", "float64"),
                                       ("Constant", "int64"), ("Not", "bool"), ("Or", "bool"), ("And", "bool")])
def test_comparisons_casts_and_constants_have_their_own_output_type(op, dtype):
    if op == "Constant":
        first = helper.make_node("Constant", [], ["o"], name="first", value=numpy_helper.from_array(np.ones(4, np.int64)))
    elif op == "Cast":
        first = helper.make_node("Cast", ["obs"], ["o"], name="first", to=TensorProto.DOUBLE)
    elif op in ("Not", "And", "Or"):
        first = helper.make_node(op, ["b"] * (1 if op == "Not" else 2), ["o"], name="first")
    else:
        first = helper.make_node(op, ["obs", "obs"], ["o"], name="first")
    other = "float32" if dtype != "float32" else "float64"
    m = model([first, helper.make_node("Where", ["c", "o", "k"], ["y"], name="pick")],
              [f32("obs", ["batch", 4]), helper.make_tensor_value_info("b", TensorProto.BOOL, ["batch", 4])],
              [f32("y", None)], [const("c", [True] * 4, np.bool_), const("k", np.ones(4), np.dtype(other))], opset=20)
    with pytest.raises(pp.BadModelError, match=exactly(f'Where node "pick" (opset 20): its inputs must share one '
                                                       f"element type; found input 1 {dtype}, input 2 {other}")):
        pp.load(m)


@pytest.mark.parametrize("op, inputs, found", [
    ("Sub", ["obs", "d"], "input 0 float32, input 1 float64"),
    ("Mul", ["d", "obs"], "input 0 float64, input 1 float32"),
    ("Div", ["obs", "d"], "input 0 float32, input 1 float64"),
    ("Greater", ["obs", "d"], "input 0 float32, input 1 float64"),
    ("MatMul", ["obs", "dm"], "input 0 float32, input 1 float64"),
    ("Gemm", ["obs", "fm", "d"], "input 0 float32, input 1 float32, input 2 float64"),
    ("PRelu", ["obs", "d"], "input 0 float32, input 1 float64"),
    ("Concat", ["obs", "obs", "dm"], "input 0 float32, input 1 float32, input 2 float64"),
    ("Sum", ["obs", "f", "d"], "input 0 float32, input 1 float32, input 2 float64"),
    ("Mean", ["d", "obs"], "input 0 float64, input 1 float32"),
    ("Max", ["obs", "d"], "input 0 float32, input 1 float64"),
    ("Min", ["obs", "f", "f", "d"], "input 0 float32, input 1 float32, input 2 float32, input 3 float64"),
    ("Where", ["c", "obs", "d"], "input 1 float32, input 2 float64"),
])
def test_inputs_of_one_type_variable_must_share_one_element_type(op, inputs, found):
    inits = [const("d", np.ones(4), np.float64), const("f", np.ones(4), np.float32), const("c", [True] * 4, np.bool_),
             const("dm", np.ones((4, 4)), np.float64), const("fm", np.ones((4, 4)), np.float32)]
    attrs = {"axis": 0} if op == "Concat" else {}
    m = model([helper.make_node(op, inputs, ["y"], name="n", **attrs)], [f32("obs", ["batch", 4])], [f32("y", None)],
              inits, opset=20)
    with pytest.raises(pp.BadModelError, match=exactly(f'{op} node "n" (opset 20): its inputs must share one element '
                                                       f"type; found {found}")):
        pp.load(m)


def test_where_compares_only_the_two_values_and_casts_nothing():
    m = model([helper.make_node("Where", ["c", "obs", "f"], ["y"])], [f32("obs", ["batch", 2])], [f32("y", None)],
              [const("c", [True, False], np.bool_), const("f", [7.0, 8.0], np.float32)])
    assert pp.load(m).run(np.zeros((1, 2), np.float32))["y"].tolist() == [[0.0, 8.0]]


@pytest.mark.parametrize("seed, expected", [(0.0, 0), (-0.0, 0), (3.0, 3), (-1.0, int(np.float64(-1.0).view(np.uint64))),
                                            (2.5, int(np.float64(2.5).view(np.uint64)))])
def test_a_nodes_own_seed_seeds_its_generator(seed, expected):
    from policyport.runtime.numpy.plan import node_generator

    assert node_generator(seed).integers(1 << 62, size=3).tolist() == \
        np.random.default_rng(expected).integers(1 << 62, size=3).tolist()


GEMM_W = np.arange(12, dtype=np.float32).reshape(3, 4) / 7 - 0.5  # (K=3, N=4)


@pytest.mark.parametrize("attrs, bias, kind", [
    ({}, np.arange(4, dtype=np.float32), "gemm"),
    ({}, None, "gemm"),
    ({}, np.arange(4, dtype=np.float32).reshape(1, 4), "gemm"),
    ({}, np.float32(0.5), "gemm"),
    ({"transB": 1}, np.arange(4, dtype=np.float32), "gemm"),
    ({"alpha": 2.0}, np.arange(4, dtype=np.float32), "call"),
    ({"beta": 0.5}, np.arange(4, dtype=np.float32), "call"),
    ({"beta": 0.5}, None, "gemm"),  # beta scales no bias
    ({"transA": 1}, np.arange(4, dtype=np.float32), "call"),
    ({}, "omitted", "gemm"),  # C named "": as if absent
    ({}, np.arange(12, dtype=np.float32).reshape(3, 4), "gemm"),  # a bias of M rows (M = 3 here)
])
def test_gemm_takes_the_dot_and_add_path_only_where_it_computes_the_same(attrs, bias, kind):
    w = GEMM_W.T.copy() if attrs.get("transB") else GEMM_W
    a_shape = [3, 3]
    given = bias is not None and not isinstance(bias, str)
    inits = [numpy_helper.from_array(w, "W")] + ([numpy_helper.from_array(np.asarray(bias), "C")] if given else [])
    node = helper.make_node("Gemm", ["a", "W"] + (["C"] if given else [""] if bias == "omitted" else []), ["y"], **attrs)
    m = model([node], [f32("a", a_shape)], [f32("y", None)], inits)
    session = pp.load(m)
    assert [s.kind for s in session.backend.plan.steps] == [kind]
    a = np.random.default_rng(9).standard_normal((3, 3)).astype(np.float32)
    expected = pp.load(m, backend="onnxruntime").run({"a": a})["y"]
    np.testing.assert_allclose(session.run({"a": a})["y"], expected, rtol=1e-6, atol=1e-6)
    assert pp.load(m).record({"a": a})["y"].tolist() == session.run({"a": a})["y"].tolist()


def test_gemm_with_weights_or_a_bias_that_are_not_constant_or_alike_is_called():
    w64 = numpy_helper.from_array(GEMM_W.astype(np.float64), "W")
    c64 = numpy_helper.from_array(np.arange(4, dtype=np.float64), "C")
    cases = [  # (nodes, inputs, inits)
        ([helper.make_node("Gemm", ["a", "w", "C"], ["y"])], [f32("a", [2, 3]), f32("w", [3, 4])],
         [numpy_helper.from_array(np.arange(4, dtype=np.float32), "C")]),  # B fed
        ([helper.make_node("Gemm", ["a", "W", "c"], ["y"])], [f32("a", [2, 3]), f32("c", [4])],
         [numpy_helper.from_array(GEMM_W, "W")]),  # C fed
    ]
    for nodes, inputs, inits in cases:
        session = pp.load(model(nodes, inputs, [f32("y", None)], inits))
        assert [s.kind for s in session.backend.plan.steps] == ["call"]
    with pytest.raises(pp.BadModelError, match="its inputs must share one element type"):  # C of another type: refused
        pp.load(model([helper.make_node("Gemm", ["a", "W", "C"], ["y"])], [f32("a", [2, 3])], [f32("y", None)],
                      [numpy_helper.from_array(GEMM_W, "W"), c64]))
    one_d = model([helper.make_node("Gemm", ["a", "W"], ["y"])], [f32("a", [2, 3])], [f32("y", None)], [w64])
    with pytest.raises(pp.BadModelError):
        pp.load(one_d)


@pytest.mark.parametrize("starts, ends, axes, steps, kind", [
    ([1], [3], [1], None, "index"),
    ([1], [3], None, None, "index"),  # axes default to 0, 1 ...
    ([0, 1], [2, 9], [0, 1], [1, 2], "index"),
    ([3], [0], [1], [-1], "index"),
    ([-3], [-1], [1], [1], "index"),
    ([1], [3], [-1], [1], "call"),  # a negative axis needs the data's rank
    ([1, 0], [3, 9], [1, 0], [1, 1], "index"),  # axes in any order
])
def test_a_constant_slice_is_one_prebuilt_index_where_python_slicing_agrees(starts, ends, axes, steps, kind):
    names = ["x", "s", "e"] + (["ax"] if axes is not None else []) + (["st"] if steps is not None else [])
    inits = [numpy_helper.from_array(np.array(v, np.int64), n)
             for n, v in (("s", starts), ("e", ends), ("ax", axes), ("st", steps)) if v is not None]
    m = model([helper.make_node("Slice", names, ["y"])], [f32("x", [4, 5])], [f32("y", None)], inits)
    session = pp.load(m)
    assert [s.kind for s in session.backend.plan.steps] == [kind]
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    expected = pp.load(m, backend="onnxruntime").run({"x": x})["y"]
    got = session.run({"x": x})["y"]
    assert got.shape == expected.shape and got.tolist() == expected.tolist()


def test_a_slice_naming_an_axis_twice_is_refused_at_load():
    inits = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("s", [1, 0]), ("e", [3, 2]), ("ax", [1, 1]))]
    m = model([helper.make_node("Slice", ["x", "s", "e", "ax"], ["y"], name="cut")], [f32("x", [4, 5])], [f32("y", None)],
              inits)
    with pytest.raises(pp.BadModelError, match=exactly('Slice node "cut" (opset 17): axes [1, 1] repeat an axis')):
        pp.load(m)


def in_place_chain():
    """Which results a run may overwrite in place, and which it must keep: a Gemm's product read twice
    (Tanh and Sub), MatMul -> Tanh (a product that may be a numpy scalar), an Add's sum that is a graph
    output and read by Exp, then Neg -> Abs -> Sqrt -> Relu; and Gemm -> Tanh, whose product the
    Tanh alone reads."""
    rng = np.random.default_rng(11)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 6)).astype(np.float32) / 2, "W"),
             numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "B"),
             numpy_helper.from_array(rng.standard_normal((6, 5)).astype(np.float32) / 2, "W2"),
             numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "B2"),
             numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "W3")]
    nodes = [helper.make_node("Gemm", ["obs", "W", "B"], ["g"]), helper.make_node("Tanh", ["g"], ["t"]),
             helper.make_node("Sub", ["g", "t"], ["d"]), helper.make_node("MatMul", ["t", "W2"], ["m"]),
             helper.make_node("Tanh", ["m"], ["mt"]), helper.make_node("Add", ["mt", "B2"], ["a"]),
             helper.make_node("Exp", ["a"], ["e"]), helper.make_node("Neg", ["e"], ["n"]),
             helper.make_node("Abs", ["n"], ["ab"]), helper.make_node("Sqrt", ["ab"], ["s"]),
             helper.make_node("Relu", ["s"], ["r"]), helper.make_node("Gemm", ["obs", "W3"], ["g2"]),
             helper.make_node("Tanh", ["g2"], ["t2"])]
    return model(nodes, [f32("obs", ["batch", 4])], [f32("r", ["batch", 5]), f32("a", ["batch", 5]), f32("d", ["batch", 6]),
                                                     f32("t2", ["batch", 3])], inits)


@pytest.mark.parametrize("rows", [3, 1100])
def test_results_written_in_place_are_those_nothing_else_reads(rows):
    m = in_place_chain()
    obs = np.random.default_rng(12).standard_normal((rows, 4)).astype(np.float32)
    expected = pp.load(m, backend="onnxruntime").record(obs)
    session = pp.load(m, threads=2)
    for got in (session.run(obs), session.record(obs), session.record(obs, overrides="t[0]*=1")):
        assert set(got) <= set(expected)
        for name in got:
            np.testing.assert_allclose(got[name], expected[name], rtol=2e-6, atol=2e-6, err_msg=name)
    recorded = session.record(obs)
    assert list(recorded) == ["g", "t", "d", "m", "mt", "a", "e", "n", "ab", "s", "r", "g2", "t2"]
    assert (recorded["n"] < 0).all() and (recorded["e"] > 0).all()  # Neg's input kept: not overwritten by Neg
    assert (np.abs(recorded["g2"]) > 1).any()  # the product, not its tanh


@pytest.mark.parametrize("mode", ["run", "record"])
def test_an_output_that_is_an_initializer_itself_is_a_writable_copy(mode):
    m = model([helper.make_node("Tanh", ["obs"], ["y"])], [f32("obs", ["batch", 2])], [f32("y", ["batch", 2]), f32("B", [2])],
              [numpy_helper.from_array(np.array([0.5, -0.5], np.float32), "B")])
    session = pp.load(m)
    out = getattr(session, mode)(np.zeros((1, 2), np.float32))
    out["B"] *= 100.0  # the caller's array
    assert getattr(session, mode)(np.zeros((1, 2), np.float32))["B"].tolist() == [0.5, -0.5]


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("rows", [1, 7, 1100])
def test_relu_after_a_gemm_compares_against_a_row_of_zeros_and_keeps_a_product_read_twice(trans_b, rows):
    """A Relu's zero is a (1, N) row where N is known (a Gemm's constant B gives it, transposed or
    not): numpy's maximum against a 0-d zero takes its slow scalar loop. A run overwrites the
    product the Relu alone reads; a product that is also a graph output is kept."""
    rng = np.random.default_rng(21)
    w = rng.standard_normal((3, 5)).astype(np.float32)  # K=3, N=5: a wrong N would not broadcast
    inits = [numpy_helper.from_array(w.T.copy() if trans_b else w, "W"),
             numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "B")]
    nodes = [helper.make_node("Gemm", ["obs", "W", "B"], ["g"], transB=trans_b), helper.make_node("Relu", ["g"], ["r"]),
             helper.make_node("Gemm", ["obs", "W"], ["g2"], transB=trans_b), helper.make_node("Relu", ["g2"], ["r2"]),
             helper.make_node("Relu", ["obs"], ["r3"])]
    m = model(nodes, [f32("obs", ["batch", 3])], [f32("r", ["batch", 5]), f32("g2", ["batch", 5]), f32("r2", ["batch", 5]),
                                                  f32("r3", ["batch", 3])], inits)
    session = pp.load(m, threads=2)
    plan = session.backend.plan
    zeros = [plan._consts[s.args[1]] for s in plan.steps if s.kind == "relu"]
    assert [z.shape for z in zeros] == [(1, 5), (1, 5), (1, 3)] and not any(z.any() for z in zeros)
    obs = rng.standard_normal((rows, 3)).astype(np.float32)
    expected = pp.load(m, backend="onnxruntime").record(obs)
    for got in (session.run(obs), session.record(obs)):
        for name in got:
            np.testing.assert_allclose(got[name], expected[name], rtol=1e-6, atol=1e-6, err_msg=name)
    assert (session.run(obs)["g2"] < 0).any()  # the product, not its relu


def test_relu_of_a_tensor_whose_last_axis_is_unknown_compares_against_a_0d_zero():
    m = model([helper.make_node("Relu", ["obs"], ["r"])], [f32("obs", ["batch", "width"])], [f32("r", None)])
    step, = pp.load(m).backend.plan.steps
    assert step.kind == "relu" and pp.load(m).backend.plan._consts[step.args[1]].shape == ()
    obs = np.array([[-1.0, 2.0, -0.0, np.nan]], np.float32)
    np.testing.assert_array_equal(pp.load(m).run(obs)["r"], [[0.0, 2.0, 0.0, np.nan]])


def test_a_chunked_plan_keeps_a_feed_it_reads_again_after_many_nodes(monkeypatch):
    """In a chunked plan the feeds and node outputs share one list: a feed read at the end (a residual
    Add) must still hold the feed, not a node output stored in its place."""
    from policyport.runtime.numpy import plan as plan_module

    nodes = [helper.make_node("Neg", ["obs"], ["n0"]), *(helper.make_node("Neg", [f"n{i}"], [f"n{i + 1}"]) for i in range(5)),
             helper.make_node("Add", ["n5", "obs"], ["y"])]
    m = model(nodes, [f32("obs", ["batch", 4])], [f32("y", ["batch", 4])])
    monkeypatch.setattr(plan_module, "CHUNK_LINES", 2)
    session = pp.load(m)
    assert len(session.backend.plan._line_steps) > 2
    obs = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(session.run(obs)["y"], 2 * obs)  # six negations of obs, plus obs


def test_a_failure_outside_any_node_is_blamed_on_the_numpy_backend():
    session = pp.load(relu_chain(2))
    error = session.backend.plan.explain(ValueError("bad"))  # no frame of the plan's code in its traceback
    assert type(error) is pp.BadModelError and str(error) == "the numpy backend failed: ValueError: bad"


def test_reduce_log_sum_exp_without_keepdims_drops_only_the_reduced_axis():
    m = model([helper.make_node("ReduceLogSumExp", ["x"], ["y"], axes=[2], keepdims=0)], [f32("x", [2, 1, 3])],
              [f32("y", None)], opset=13)
    x = np.log(np.arange(1, 7, dtype=np.float32)).reshape(2, 1, 3)
    for backend in ("numpy", "onnxruntime"):
        y = pp.load(m, backend=backend).run({"x": x})["y"]
        assert y.shape == (2, 1)
        np.testing.assert_allclose(y, np.log([[6.0], [15.0]]), rtol=1e-6)
