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
    from policyport.files import using_limits

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
    from policyport.files import using_limits

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
