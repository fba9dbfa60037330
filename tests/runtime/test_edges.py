"""The runtime's less travelled paths, each with its exact result or refusal: feeds of other forms,
memory estimates, graphs built by hand, the BLAS limiter, numpy 1's error state, result pools,
worker threads, and golden data of random tensors."""

from __future__ import annotations

import re
import sys
import types

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import policyport as pp
from policyport.graph.model import Graph, Node, ValueInfo, from_onnx
from policyport.runtime import base, blas
from policyport.runtime import numpy as numpy_backend
from policyport.runtime import ort as ort_backend
from policyport.runtime.numpy import floating, registry
from policyport.runtime.numpy import rows as rows_module
from policyport.runtime.numpy.rows import SPLIT_ROWS, ResultPool, reusing
from test_plan import f32, model  # noqa: E402  (pytest puts this folder on sys.path)

F32 = np.dtype(np.float32)
N = helper.make_node


def exactly(message: str) -> str:
    return "^" + re.escape(message) + "$"


def tanh_model(width: int = 4, extra_outputs=(), extra_nodes=(), inits=()):
    return model([helper.make_node("Tanh", ["obs"], ["y"], name="act"), *extra_nodes], [f32("obs", ["batch", width])],
                 [f32("y", ["batch", width]), *extra_outputs], inits)


def two_input_model():
    """a (n, 4) and b (m, 4), named apart: y = Tanh(a), z = Tanh(b)."""
    return model([helper.make_node("Tanh", ["a"], ["y"]), helper.make_node("Tanh", ["b"], ["z"])],
                 [f32("a", ["n", 4]), f32("b", ["m", 4])], [f32("y", ["n", 4]), f32("z", ["m", 4])])


# ------------------------------------------------------------------------------------------ Session


@pytest.mark.parametrize("backend", list(pp.BACKENDS))
def test_feeds_in_any_mapping_and_a_bare_array_only_for_one_input(backend):
    session = pp.load(two_input_model(), backend=backend)
    a, b = np.ones((2, 4), np.float32), np.zeros((3, 4), np.float32)
    got = session.run(types.MappingProxyType({"a": a, "b": b}))
    assert got["y"].tolist() == np.tanh(a).tolist() and got["z"].tolist() == b.tolist()
    for call in (session.run, session.record, lambda f: session.record_iter([f]).__next__()):
        with pytest.raises(pp.BadModelError, match=exactly("the model has 2 inputs ['a', 'b']; pass a dict of feeds")):
            call(a)


def test_observers_and_onnxruntime_sessions_need_what_they_need():
    ort = pp.load(tanh_model(), backend="onnxruntime")
    with pytest.raises(pp.BadModelError, match=exactly("observers need the numpy backend; this session runs on "
                                                       "onnxruntime")):
        ort.observe(np.ones((1, 4), np.float32), lambda i, j, v: v)
    with pytest.raises(pp.BadModelError, match=exactly("the onnxruntime backend needs an ONNX model: pass the "
                                                       "ModelProto or the .onnx path")):
        pp.load(from_onnx(tanh_model()), backend="onnxruntime")
    numpy = pp.load(from_onnx(tanh_model()))  # a Graph runs on numpy
    assert numpy.run(np.zeros((1, 4), np.float32))["y"].tolist() == [[0, 0, 0, 0]]


@pytest.mark.parametrize("backend", list(pp.BACKENDS))
def test_tensor_sizes_extrapolate_the_bytes_of_one_and_two_rows(backend):
    constant = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.ones(3, np.float32)))
    session = pp.load(tanh_model(extra_outputs=[f32("c", [3])], extra_nodes=[constant]), backend=backend)
    obs = np.ones((10, 4), np.float32)
    sizes = session.tensor_sizes(obs)
    # y: 16 bytes (4 elements) a row; c: 12 bytes (3 elements) whatever the rows
    assert sizes.rows == 10 and sizes.nbytes(10) == {"y": 160, "c": 12} and sizes.elements(7) == {"y": 28, "c": 3}
    assert sizes.input_elements(10) == 40 and session.tensor_sizes(obs[:3]).nbytes(3) == {"y": 48, "c": 12}
    assert session.tensor_sizes(obs[:2]) is None and session.tensor_sizes(obs[:0]) is None  # two rows tell nothing more
    assert session.memory_needed(obs[:2]) == 0


def test_memory_needed_of_results_that_do_not_grow_and_of_what_cannot_be_told():
    total = model([helper.make_node("ReduceSum", ["obs"], ["s"], keepdims=0)], [f32("obs", ["batch", 4])], [f32("s", [])])
    assert pp.load(total).tensor_sizes(np.ones((50, 4), np.float32)).nbytes(50) == {"s": 4}  # one float32, whatever the rows
    two = pp.load(two_input_model())
    assert two.memory_needed({"a": np.ones((5, 4), np.float32), "b": np.ones((6, 4), np.float32)}) == 0
    both = two.tensor_sizes({"a": np.ones((5, 4), np.float32), "b": np.ones((5, 4), np.float32)})
    assert both.nbytes(5) == {"y": 80, "z": 80}
    fixed = pp.load(model([helper.make_node("Tanh", ["obs"], ["y"])], [f32("obs", [5, 4])], [f32("y", [5, 4])]))
    assert fixed.memory_needed(np.ones((5, 4), np.float32)) == 0  # no batched input
    # a model that fails on one row: Reshape to (2, -1) needs an even number of elements over the batch
    odd = model([helper.make_node("Reshape", ["obs", "shape"], ["y"])], [f32("obs", ["batch", 3])], [f32("y", None)],
                [numpy_helper.from_array(np.array([2, -1], np.int64), "shape")])
    assert pp.load(odd).memory_needed(np.ones((4, 3), np.float32)) == 0


# ------------------------------------------------------------------------------------------- base


def test_feeds_from_arrays_maps_one_array_to_the_one_input_and_keeps_named_ones():
    arr = np.ones((2, 3), np.float32)
    assert base.feeds_from_arrays({"": arr}, ["obs"], "x.npy") == {"obs": arr}
    assert base.feeds_from_arrays({"anything": arr}, ["obs"], "x.npz") == {"obs": arr}
    named = {"a": arr, "b": arr[:1]}
    got = base.feeds_from_arrays(named, ["a", "b"], "x.npz")
    assert got == named and got is not named
    assert base.feeds_from_arrays({"obs": arr}, ["obs"], "x.npz") == {"obs": arr}
    with pytest.raises(pp.InputMismatchError, match=exactly("x.npy holds one array but the model has inputs ['a', 'b']; "
                                                            "use an .npz keyed by input name")):
        base.feeds_from_arrays({"": arr}, ["a", "b"], "x.npy")
    assert base.feeds_from_arrays({"c": arr}, ["a", "b"], "x.npz") == {"c": arr}  # check_feeds names what is wrong


def test_an_input_of_unknown_rank_takes_any_shape_of_its_dtype():
    inputs = [ValueInfo("x", F32, None), ValueInfo("y", F32, ("n", 2))]
    feeds = {"x": np.ones((3, 1, 2), np.float32), "y": np.ones((5, 2), np.float32)}
    assert base.check_feeds(feeds, inputs) == feeds
    assert base.compile_feed_check(inputs)(feeds) == feeds
    with pytest.raises(pp.InputMismatchError, match=exactly("input 'x' expects dtype float32, got float64; convert it "
                                                            "first (e.g. x.astype(np.float32))")):
        base.check_feeds({"x": np.ones(2), "y": feeds["y"]}, inputs)


@pytest.mark.parametrize("array, rows", [
    (np.float32(np.nan), 1), (np.array(np.inf), 1), (np.float64(2.0), 0), (np.int64(3), 0), (np.array(True), 0),
    (np.zeros((0, 3), np.float32), 0), (np.zeros((2, 0), np.float32), 0),
    (np.array([[1, np.nan], [2, 3], [np.inf, -np.inf]], np.float32), 2),
    (np.array([[[0, 0], [0, np.nan]], [[0, 0], [0, 0]], [[-np.inf, 0], [0, 0]]]), 2),
    (np.array([1 + 1j, complex(0, np.nan)]), 1), (np.arange(6).reshape(3, 2), 0), (np.ones((4, 2), np.float16), 0),
    (np.complex64(complex(np.inf, 0)), 1), (np.complex128(1j), 0),
])
def test_nonfinite_rows_counts_rows_holding_a_nan_or_an_infinity(array, rows):
    assert base.nonfinite_rows(array) == rows and type(base.nonfinite_rows(array)) is int


@pytest.mark.parametrize("inputs, feeds, count", [
    ([ValueInfo("x", F32, None)], {"x": np.float32(1)}, 1),  # unknown rank: axis 0 of the feed, a scalar is one
    ([ValueInfo("x", F32, None)], {"x": np.ones((5, 2))}, 5),
    ([ValueInfo("x", F32, (1, 480))], {"x": np.ones((1, 480))}, 1),  # no batch axis: one observation
    ([ValueInfo("s", F32, ()), ValueInfo("x", F32, ("n", 2))], {"s": np.float32(0), "x": np.ones((7, 2))}, 7),
    ([ValueInfo("a", F32, ("n", 2)), ValueInfo("b", F32, ("m",))], {"a": np.ones((3, 2)), "b": np.ones(9)}, 3),
    ([ValueInfo("w", F32, ("n",)), ValueInfo("x", F32, ("n", 2))], {"x": np.ones((4, 2))}, 4),  # w not fed
    ([ValueInfo("x", F32, (None, 2))], {"x": np.ones((0, 2))}, 0),
])
def test_count_observations_reads_the_first_batched_input(inputs, feeds, count):
    assert base.count_observations(inputs, feeds) == count


def test_memory_needed_holds_the_tensors_as_each_backend_holds_them():
    """h = tanh(obs) (16 bytes a row), y = -h, z = relu(gemm(h)) (8 bytes a row each), on 5 rows."""
    gemm = N("Gemm", ["h", "w"], ["g"])
    m = model([N("Tanh", ["obs"], ["h"]), N("Neg", ["h"], ["y"]), gemm, N("Relu", ["g"], ["z"])],
              [f32("obs", ["batch", 4])], [f32("y", ["batch", 4]), f32("z", ["batch", 2])],
              [numpy_helper.from_array(np.ones((4, 2), np.float32), "w")])
    obs = np.ones((5, 4), np.float32)
    h, y, g, z = 80, 80, 40, 40
    numpy = pp.load(m)
    blas = numpy_backend.BLAS_BUFFER_BYTES
    # run whole: every tensor until the end, z computed over g's array; the Gemm hands h to the BLAS as it
    # is, which packs a panel of it (all of h: 5 rows of 4 float32 columns)
    assert numpy.backend.plan.overwritten() == {"z"}
    packed = h
    assert numpy.memory_needed(obs) == h + y + g + packed + blas
    # a record holds every tensor, apart: z as well, once the product (and its packed panel) is done
    assert numpy.memory_needed(obs, "h") == max(h + y + g + packed, h + y + g + z) + blas
    # onnxruntime frees a tensor after its last reader: h lives until Gemm has read it; the Relu, g's last
    # reader, writes z over g's buffer
    ort = pp.load(m, backend="onnxruntime")
    assert ort.memory_needed(obs) == int(ort_backend.ARENA_SLACK * (h + y + g))
    assert ort.memory_needed(obs, "g") == int(ort_backend.ARENA_SLACK * (h + y + g))  # h is gone before z
    assert ort.memory_needed(obs, "h") == int(ort_backend.ARENA_SLACK * (h + y + g))  # h kept to the end, z over g
    assert ort.memory_needed(obs, "g,h") == int(ort_backend.ARENA_SLACK * (h + y + g + z))  # g kept: z needs its own


def test_memory_needed_of_a_batch_in_row_blocks_holds_what_it_returns_and_one_block_a_thread(monkeypatch):
    """h = tanh(obs), y = -h (16 bytes a row each) on six blocks of 512 rows."""
    m = model([N("Tanh", ["obs"], ["h"]), N("Neg", ["h"], ["y"])], [f32("obs", ["batch", 4])], [f32("y", ["batch", 4])])
    obs = np.ones((6 * 512, 4), np.float32)
    session = pp.load(m, threads=2)
    y = h = 16 * 6 * 512
    bounds, block = 6 * rows_module.BOUNDS_BYTES, 2 * 16 * 512 + rows_module.WORKER_BYTES
    monkeypatch.setattr(rows_module, "_blas_one_thread", lambda: object())
    assert session.memory_needed(obs) == y + bounds + 2 * block
    assert session.memory_needed(obs, "y") == h + y + bounds + 2 * block  # a record returns every tensor, then picks
    session.backend.plan.threads = 8  # no more threads than blocks
    assert session.memory_needed(obs) == y + bounds + 6 * block
    monkeypatch.setattr(rows_module, "_blas_one_thread", lambda: None)  # no BLAS limiter: the calling thread alone
    assert session.memory_needed(obs) == y + bounds + block


def test_node_outputs_are_held_from_their_node_until_their_last_reader():
    nodes = [Node("A", ("x",), ("a",)), Node("B", ("a",), ("b", "unread")), Node("C", ("a", "b"), ("c",)),
             Node("D", ("c",), ("d",))]
    nbytes = {"a": 1, "b": 10, "unread": 100, "c": 1000, "d": 10000}
    assert base.held_in_node_order(nodes, nbytes) == 11000  # c, read last by D, while d is made
    assert base.held_in_node_order(nodes, nbytes, ["unread"]) == 11100
    assert base.held_in_node_order(nodes[:3], nbytes) == 1011  # a and b while C makes c
    assert base.held_in_node_order(nodes[:2], nbytes) == 111 and base.held_in_node_order([], nbytes) == 0


def test_an_output_written_over_its_input_takes_the_input_bytes_where_nothing_else_reads_them():
    nodes = [Node("A", ("x",), ("a",)), Node("T", ("a",), ("t",)), Node("U", ("t",), ("u",)), Node("V", ("u", "t"), ("v",))]
    nbytes = {"a": 100, "t": 100, "u": 100, "v": 100}
    every = lambda node: True  # noqa: E731
    assert base.held_in_node_order(nodes, nbytes) == 300  # t, u and v while V runs
    assert base.held_in_node_order(nodes, nbytes, in_place=every) == 200  # t over a, v over u; not u over t (V reads t)
    assert base.held_in_node_order(nodes, nbytes, in_place=lambda n: n.op_type == "T") == 300  # V writes v apart
    assert base.held_in_node_order(nodes, nbytes, ["a"], in_place=every) == 300  # a is returned: t needs its own
    assert base.held_in_node_order(nodes, {**nbytes, "t": 50}, in_place=every) == 150  # t of another size: apart
    assert base.held_in_node_order(nodes, nbytes, in_place=every, temporary=lambda n: 1000 * (n.op_type == "U")) == 1200


# ---------------------------------------------------------------------------------- Plan refusals


def test_a_hand_built_graph_is_refused_where_it_reads_or_returns_what_nothing_makes():
    obs = ValueInfo("obs", F32, ("batch", 4))
    unsorted = Graph([Node("Tanh", ("h",), ("y",), name="second"), Node("Tanh", ("obs",), ("h",), name="first")],
                     [obs], [ValueInfo("y", F32, None)], {}, {"": 17})
    with pytest.raises(pp.BadModelError, match=exactly('Tanh node "second" reads tensor \'h\', which no graph input, '
                                                       "initializer or earlier node produces (nodes must be "
                                                       "topologically sorted)")):
        pp.load(unsorted)
    orphan = Graph([Node("Tanh", ("obs",), ("h",), name="first")], [obs],
                   [ValueInfo("h", F32, None), ValueInfo("z", F32, None), ValueInfo("w", F32, None)], {}, {"": 17})
    with pytest.raises(pp.BadModelError, match=exactly("graph outputs ['z', 'w'] are produced by no node, input or "
                                                       "initializer")):
        pp.load(orphan)


@pytest.mark.parametrize("opset, message", [
    (28, None),
    (29, "the model declares default-domain opset 29, newer than the operator sets the numpy backend knows (up to 28); "
         "its ops may mean something else there — re-export it with --opset 28 or older"),
])
def test_the_newest_opset_the_numpy_backend_follows(opset, message):
    m = model([helper.make_node("Tanh", ["obs"], ["y"])], [f32("obs", ["batch", 2])], [f32("y", ["batch", 2])], opset=opset)
    if message is None:
        assert pp.load(m).run(np.zeros((1, 2), np.float32))["y"].tolist() == [[0, 0]]
        return
    with pytest.raises(pp.UnsupportedOpError, match=exactly(message)):
        pp.load(m)


@pytest.mark.parametrize("node, message", [
    (helper.make_node("Tanh", ["obs", "obs"], ["y"], name="n"),
     'Tanh node "n" (opset 17): it has 2 inputs; the operator takes at most 1 (x)'),
    (helper.make_node("Gemm", ["obs", ""], ["y"], name="n"), 'Gemm node "n" (opset 17): input 1 (b) is required but omitted'),
    (helper.make_node("Gemm", ["obs"], ["y"], name="n"), 'Gemm node "n" (opset 17): input 1 (b) is required but missing'),
    (helper.make_node("Tanh", ["obs"], ["y"], name="n", foo=1, alpha=2.0),
     'Tanh node "n" (opset 17): attribute(s) alpha, foo are not attributes of Tanh-6 (it takes none)'),
    (helper.make_node("Elu", ["obs"], ["y"], name="n", beta=1.0),
     'Elu node "n" (opset 17): attribute(s) beta are not attributes of Elu-6 (it takes alpha)'),
])
def test_a_node_its_operator_page_forbids_is_refused_naming_it(node, message):
    with pytest.raises(pp.BadModelError, match=exactly(message)):
        pp.load(model([node], [f32("obs", ["batch", 4])], [f32("y", None)]))


def test_a_constant_or_cast_that_cannot_be_inferred_is_left_to_the_run_which_names_the_node():
    bad_constant = helper.make_node("Constant", [], ["c"], name="const")  # no value attribute
    m = model([bad_constant, helper.make_node("Add", ["obs", "c"], ["y"])], [f32("obs", ["batch", 2])], [f32("y", None)])
    session = pp.load(m)
    with pytest.raises(pp.BadModelError, match=exactly('Constant node "const" on the numpy backend failed: ValueError: '
                                                       "Constant node has no value attribute (sparse_value is not "
                                                       "supported)")):
        session.run(np.ones((1, 2), np.float32))
    cast = model([helper.make_node("Cast", ["obs"], ["y"], name="cast", to=99)], [f32("obs", ["batch", 2])],
                 [f32("y", None)])
    with pytest.raises(pp.BadModelError, match="^ONNX element type 99 has no numpy equivalent; "):
        pp.load(cast).run(np.ones((1, 2), np.float32))


def test_resolve_names_the_node_and_the_versions_that_exist():
    with pytest.raises(pp.UnsupportedOpError) as caught:
        registry.resolve("Gelu", 19, node_name="g")
    (missing,) = caught.value.missing
    assert (missing.op_type, missing.domain, missing.opset, missing.nodes, missing.versions) == ("Gelu", "", 19, ("g",), (20,))
    assert registry.resolve("Gelu", 20).since == 20 and registry.resolve("Gelu", 28).since == 20
    assert [registry.resolve("Softmax", v).since for v in (1, 12, 13, 28)] == [1, 1, 13, 13]
    assert registry.versions("NoSuchOp") == [] and registry.versions("Softmax") == [1, 13]


def test_observe_is_compiled_once():
    plan = pp.load(tanh_model()).backend.plan
    assert plan.observe is plan.observe and plan.record is plan.record


# ------------------------------------------------------------------------------- row blocks, pools


def test_batched_inputs_of_different_lengths_run_whole():
    session = pp.load(two_input_model(), threads=2)
    a = np.random.default_rng(1).standard_normal((SPLIT_ROWS + 3, 4)).astype(np.float32)
    b = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)
    got = session.record({"a": a, "b": b})
    whole = session.backend.plan._compile("record", split=False)({"a": a, "b": b})
    assert [v.shape for v in got.values()] == [(SPLIT_ROWS + 3, 4), (3, 4)]
    for name in whole:
        assert got[name].tobytes() == whole[name].tobytes()
    same = session.run({"a": a, "b": a})  # one length: in blocks
    assert same["y"].tobytes() == same["z"].tobytes() == np.tanh(a).tobytes()


def test_a_returned_feed_and_a_tensor_returned_twice_are_copied_into_each_blocks_rows():
    m = model([helper.make_node("Tanh", ["obs"], ["y"])], [f32("obs", ["batch", 3])],
              [f32("y", ["batch", 3]), f32("obs", ["batch", 3])])
    session = pp.load(m, threads=2)
    obs = np.random.default_rng(3).standard_normal((SPLIT_ROWS + 10, 3)).astype(np.float32)
    for got in (session.run(obs), session.record(obs)):
        assert got["obs"].tobytes() == obs.tobytes() and not np.shares_memory(got["obs"], obs)
        assert got["y"].tobytes() == np.tanh(obs).tobytes()


def test_row_shapes_are_remembered_for_at_most_16_layouts():
    m = model([helper.make_node("Tanh", ["obs"], ["y"])], [f32("obs", ["batch", "width"])], [f32("y", None)])
    session = pp.load(m)
    for width in range(1, 19):
        obs = np.full((SPLIT_ROWS, width), 0.5, np.float32)
        assert session.run(obs)["y"].tobytes() == np.tanh(obs).tobytes()
    blocks = [v for v in session.backend.plan.run.__globals__.values() if isinstance(v, rows_module.RowBlocks)]
    assert len(blocks) == 1 and len(blocks[0]._layouts) == 16


def test_results_come_from_a_pool_and_go_back_to_it():
    session = pp.load(tanh_model(3))
    obs = np.random.default_rng(4).standard_normal((SPLIT_ROWS, 3)).astype(np.float32)
    pool = ResultPool()
    with reusing(pool) as same:
        assert same is pool
        first = session.record(obs)
    assert rows_module._RESULTS.get() is None  # the context is left as it was
    assert first["y"].tobytes() == np.tanh(obs).tobytes()
    held = first["y"]
    pool.give_back(list(first.values()) + [np.empty((SPLIT_ROWS, 3), np.float32)])  # a foreign array is ignored
    with reusing(pool):
        second = session.record(obs[::-1].copy())
    assert second["y"] is held and second["y"].tobytes() == np.tanh(obs[::-1]).tobytes()
    assert session.record(obs)["y"] is not held  # outside the context: fresh arrays


def test_a_pool_matches_arrays_by_shape_and_dtype_and_takes_back_only_its_own():
    pool = ResultPool()
    a = pool.take((4, 3), np.float32)
    assert a.shape == (4, 3) and a.dtype == np.float32
    pool.give_back([a])
    assert pool.take((4, 3), np.float64) is not a and pool.take((3, 4), np.float32) is not a
    assert pool.take((4, 3), "float32") is a
    assert pool.take((4, 3), np.float32) is not a  # handed out once
    pool.give_back([a, a])  # given back twice: kept once
    assert pool.take((4, 3), np.float32) is a and pool.take((4, 3), np.float32) is not a


@pytest.mark.parametrize("affinity, count, cores", [({0, 1, 2}, 8, 3), (set(), 8, 1), (AttributeError, 6, 6),
                                                    (OSError, None, 1), (AttributeError, 0, 1)])
def test_usable_cores_follow_the_affinity_else_the_cpu_count(monkeypatch, affinity, count, cores):
    def getaffinity(pid):
        assert pid == 0
        if isinstance(affinity, type):
            raise affinity("no affinity here")
        return affinity

    monkeypatch.setattr(rows_module.os, "sched_getaffinity", getaffinity, raising=False)
    monkeypatch.setattr(rows_module.os, "cpu_count", lambda: count)
    assert rows_module.usable_cores() == cores


def test_the_worker_pool_grows_to_the_threads_asked_for_and_is_forgotten_in_a_child(monkeypatch):
    monkeypatch.setattr(rows_module, "_POOL", None)
    monkeypatch.setattr(rows_module, "_POOL_SIZE", 0)
    first, grown = rows_module._pool(2), None
    try:
        assert first._max_workers == 2 and rows_module._pool(1) is first and rows_module._pool(2) is first
        grown = rows_module._pool(3)
        assert grown is not first and grown._max_workers == 3 and rows_module._POOL_SIZE == 3
        assert first._shutdown
        assert grown.submit(lambda: 7).result() == 7
        rows_module._forget_pool()
        assert (rows_module._POOL, rows_module._POOL_SIZE) == (None, 0)
    finally:
        for pool in (first, grown):
            if pool is not None:
                pool.shutdown()


def test_without_the_blas_module_the_row_blocks_have_no_limiter(monkeypatch):
    monkeypatch.setitem(sys.modules, "policyport.runtime.blas", None)
    assert rows_module._blas_one_thread() is None


# ------------------------------------------------------------------------------------------- blas


class FakeController:
    """threadpoolctl's controller as OneThread uses it, counting what it is asked."""

    def __init__(self):
        self.limits, self.restored = [], 0
        self.lib_controllers = [types.SimpleNamespace(info=lambda: {"internal_api": "openblas", "num_threads": 8})]

    def limit(self, limits):
        self.limits.append(limits)
        return types.SimpleNamespace(restore_original_limits=self.restore)

    def restore(self):
        self.restored += 1


def test_one_thread_limits_on_first_entry_and_restores_on_last_exit():
    controller = FakeController()
    one = blas.OneThread(controller)
    with one as entered:
        assert entered is one and controller.limits == [1]
        with one:
            assert controller.limits == [1] and controller.restored == 0
        assert controller.restored == 0
    assert controller.restored == 1 and one._limiter is None and one._depth == 0
    with one:
        assert controller.limits == [1, 1]
    assert controller.restored == 2
    assert one.describe() == [{"internal_api": "openblas", "num_threads": 8}]
    one.__enter__()
    one._forget()  # a forked child: nothing of the parent's runs there
    assert (one._depth, one._limiter) == (0, None) and one._lock.acquire(blocking=False)


def test_one_thread_is_none_without_threadpoolctl_or_without_a_blas(monkeypatch):
    monkeypatch.setattr(blas, "_LOOKED", False)
    monkeypatch.setattr(blas, "_ONE_THREAD", None)
    monkeypatch.setitem(sys.modules, "threadpoolctl", None)
    assert blas.one_thread() is None and blas._LOOKED
    monkeypatch.setattr(blas, "_LOOKED", False)
    empty = types.SimpleNamespace(ThreadpoolController=lambda: types.SimpleNamespace(
        select=lambda user_api: types.SimpleNamespace(lib_controllers=[], user_api=user_api)))
    monkeypatch.setitem(sys.modules, "threadpoolctl", empty)
    assert blas.one_thread() is None
    monkeypatch.setattr(blas, "_LOOKED", False)
    chosen = []
    found = types.SimpleNamespace(ThreadpoolController=lambda: types.SimpleNamespace(
        select=lambda user_api: chosen.append(user_api) or FakeController()))
    monkeypatch.setitem(sys.modules, "threadpoolctl", found)
    monkeypatch.delattr(blas.os, "register_at_fork")
    one = blas.one_thread()
    assert isinstance(one, blas.OneThread) and chosen == ["blas"] and blas.one_thread() is one  # looked once


def test_a_forked_child_forgets_the_parents_one_thread_state(monkeypatch):
    monkeypatch.setattr(blas, "_LOOKED", False)
    monkeypatch.setattr(blas, "_ONE_THREAD", None)
    monkeypatch.setitem(sys.modules, "threadpoolctl", types.SimpleNamespace(
        ThreadpoolController=lambda: types.SimpleNamespace(select=lambda user_api: FakeController())))
    registered = []
    monkeypatch.setattr(blas.os, "register_at_fork", lambda **hooks: registered.append(hooks))
    one = blas.one_thread()
    assert registered == [{"after_in_child": one._forget}]  # a lock held at fork time is not the child's
    assert blas.one_thread() is one and len(registered) == 1


def test_the_real_blas_is_described():
    pytest.importorskip("threadpoolctl")
    one = blas.one_thread()
    if one is None:
        pytest.skip("numpy's BLAS is not one threadpoolctl controls")
    assert all(d["user_api"] == "blas" and d["num_threads"] >= 1 for d in one.describe())


# --------------------------------------------------------------------------------------- floating


@pytest.mark.parametrize("numpy1", [False, True])
def test_quiet_silences_numpy_unless_the_caller_chose_otherwise(monkeypatch, numpy1):
    if numpy1:
        monkeypatch.setattr(floating, "_STATE", None)  # numpy 1 keeps the state in np.geterr/np.seterr

    def inside():
        return np.geterr()

    quiet = floating.quiet(inside)
    assert quiet.__name__ == "inside"
    assert np.geterr() == floating.NUMPY_DEFAULTS  # the test runs under numpy's defaults
    assert quiet() == floating.SILENT
    assert np.geterr() == floating.NUMPY_DEFAULTS  # restored afterwards
    with np.errstate(all="raise"):
        assert quiet() == {"divide": "raise", "over": "raise", "under": "raise", "invalid": "raise"}


# ----------------------------------------------------------------------------------------- packed


def test_verifying_a_folder_skips_the_tensors_of_random_nodes(tmp_path):
    m = model([helper.make_node("RandomNormalLike", ["obs"], ["noise"], name="draw", seed=1.0),
               helper.make_node("Add", ["obs", "noise"], ["y"]), helper.make_node("Tanh", ["obs"], ["t"])],
              [f32("obs", ["batch", 2])], [f32("y", ["batch", 2]), f32("t", ["batch", 2])])
    pp.pack(m, tmp_path / "bundle", samples=3, runtime=False)
    from policyport.handoff.golden import verify_bundle

    report = verify_bundle(tmp_path / "bundle")
    assert report.passed and [c.tensor for c in report.comparisons] == ["t"]
    assert [(s.tensor, s.reason) for s in report.skipped] == [
        ("noise", "depends on the random RandomNormalLike node 'draw'"),
        ("y", "depends on the random RandomNormalLike node 'draw'")]


# ------------------------------------------------------------------------------- ops at their edges


def const_init(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def typed(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


GRID = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
ONES = np.ones((2, 4), np.float32)
RNG = np.random.default_rng(0)
SEQ = RNG.standard_normal((4, 2, 2)).astype(np.float32)
W_GRU, R_GRU = RNG.standard_normal((1, 9, 2)).astype(np.float32), RNG.standard_normal((1, 9, 3)).astype(np.float32)
W_RNN, R_RNN = RNG.standard_normal((2, 3, 2)).astype(np.float32), RNG.standard_normal((2, 3, 3)).astype(np.float32)

REFUSED = {  # model, feeds, the numpy backend's message (BadModelError, at load or run)
    "a Clip bound fed as a vector": (
        model([N("Clip", ["x", "lo"], ["y"], name="c")], [f32("x", ["n", 3]), f32("lo", ["k"])], [f32("y", None)],
              opset=13), {"x": np.ones((2, 3), np.float32), "lo": np.zeros(2, np.float32)},
        'Clip node "c" on the numpy backend failed: ValueError: min has shape (2,); it must be a scalar'),
    "an unknown auto_pad": (
        model([N("Conv", ["x", "w"], ["y"], name="c", auto_pad="FOO")], [f32("x", [1, 1, 4, 4])], [f32("y", None)],
              [const_init("w", np.ones((1, 1, 2, 2)))]), {"x": GRID},
        'Conv node "c" on the numpy backend failed: ValueError: auto_pad must be NOTSET, VALID, SAME_UPPER or '
        "SAME_LOWER, not 'FOO'"),
    "a kernel_shape the weights contradict": (
        model([N("Conv", ["x", "w"], ["y"], name="c", kernel_shape=[3, 3])], [f32("x", [1, 1, 4, 4])],
              [f32("y", None)], [const_init("w", np.ones((1, 1, 2, 2)))]), {"x": GRID},
        'Conv node "c" on the numpy backend failed: ValueError: kernel_shape [3, 3] differs from the weights\' '
        "spatial shape [2, 2]"),
    "a constant Gemm bias of another width": (
        model([N("Gemm", ["x", "w", "b"], ["y"], name="g")], [f32("x", ["n", 2])], [f32("y", None)],
              [const_init("w", np.ones((2, 4))), const_init("b", np.ones(3))]), {"x": ONES[:, :2]},
        'Gemm node "g" (opset 17): C of shape (3,) does not broadcast to (M, 4)'),
    "a fed Gemm bias with more rows than A": (
        model([N("Gemm", ["x", "w", "b"], ["y"], name="g")], [f32("x", ["n", 2]), f32("b", ["p", "q"])],
              [f32("y", None)], [const_init("w", np.ones((2, 4)))]), {"x": ONES[:1, :2], "b": ONES},
        'Gemm node "g" on the numpy backend failed: ValueError: C of shape (2, 4) does not broadcast to (1, 4)'),
    "two -1 in a Reshape": (
        model([N("Reshape", ["x", "s"], ["y"], name="r")], [f32("x", ["n", 4])], [f32("y", None)],
              [const_init("s", [-1, -1], np.int64)]), {"x": ONES},
        'Reshape node "r" (opset 17): shape [-1, -1] has more than one -1'),
    "0 and -1 under allowzero": (
        model([N("Reshape", ["x", "s"], ["y"], name="r", allowzero=1)], [f32("x", ["n", 4])], [f32("y", None)],
              [const_init("s", [0, -1], np.int64)]), {"x": ONES},
        'Reshape node "r" (opset 17): shape [0, -1] has both 0 and -1, which allowzero=1 forbids'),
    "a Slice step of 0": (
        model([N("Slice", ["x", "s", "e", "a", "st"], ["y"], name="s")], [f32("x", ["n", 4])], [f32("y", None)],
              [const_init(n, [v], np.int64) for n, v in (("s", 0), ("e", 2), ("a", 1), ("st", 0))]), {"x": ONES},
        'Slice node "s" (opset 17): steps [0] include 0'),
    "a negative Tile count": (
        model([N("Tile", ["x", "r"], ["y"], name="t")], [f32("x", ["n", 4])], [f32("y", None)],
              [const_init("r", [1, -1], np.int64)]), {"x": ONES},
        'Tile node "t" (opset 17): repeats [1, -1] include a negative count'),
    "Split-18 into more parts than ceil allows": (
        model([N("Split", ["x"], ["a", "b", "c", "d"], name="s", axis=1, num_outputs=4)], [f32("x", ["n", 5])],
              [f32("a", None)], opset=18), {"x": np.ones((2, 5), np.float32)},
        'Split node "s" (opset 18): an axis of length 5 cannot be split into 4 parts of ceil(5/4)'),
    "a Gather axis beyond the rank": (
        model([N("Gather", ["x", "i"], ["y"], name="g", axis=2)], [f32("x", ["n", 4])], [f32("y", None)],
              [const_init("i", [0], np.int64)]), {"x": ONES},
        'Gather node "g" on the numpy backend failed: AxisError: axis 2 is out of bounds for array of dimension 2'),
    "fed Tile repeats of another count than the rank": (
        model([N("Tile", ["x", "r"], ["y"], name="t")], [f32("x", ["n", 4]), typed("r", TensorProto.INT64, ["k"])],
              [f32("y", None)]), {"x": ONES, "r": np.array([1, 1, 2], np.int64)},
        'Tile node "t" on the numpy backend failed: ValueError: Tile needs one repeat per axis: 3 repeats for 2 axes'),
    "Multinomial of a vector": (
        model([N("Multinomial", ["x"], ["y"], name="m", sample_size=2)], [f32("x", ["k"])],
              [typed("y", TensorProto.INT32, None)]), {"x": np.zeros(4, np.float32)},
        'Multinomial node "m" on the numpy backend failed: ValueError: Multinomial takes (batch, classes) '
        "log-probabilities, got shape (4,)"),
    "RNN weights for two directions": (
        model([N("RNN", ["x", "W", "R"], ["y", "h"], name="r", hidden_size=3)], [f32("x", [4, 2, 2])],
              [f32("y", None), f32("h", None)], [const_init("W", W_RNN), const_init("R", R_RNN)]), {"x": SEQ},
        'RNN node "r" on the numpy backend failed: ValueError: W (2, 3, 2) and R (2, 3, 3) do not fit 1 direction(s), '
        "1 gates and hidden_size 3"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_an_operator_page_forbids_is_refused_naming_the_node(case):
    m, feeds, message = REFUSED[case]
    with pytest.raises(pp.BadModelError, match=exactly(message)):
        pp.load(m).run(feeds)
    with pytest.raises(pp.BadModelError):  # onnxruntime refuses it too, at load or run
        pp.load(m, backend="onnxruntime").run(feeds)


def test_einsum_operands_whose_ellipses_do_not_broadcast_are_left_to_numpy_which_names_them():
    m = model([N("Einsum", ["a", "b"], ["y"], name="e", equation="...i,...i->...")], [f32("a", [2, 3, 4]), f32("b", [5, 4])],
              [f32("y", None)])
    with pytest.raises(pp.BadModelError, match=r'^Einsum node "e" on the numpy backend failed: ValueError: operands could '
                                               r"not be broadcast together"):
        pp.load(m).run({"a": np.ones((2, 3, 4), np.float32), "b": np.ones((5, 4), np.float32)})


AGREE = {  # model, feeds: numpy gives what onnxruntime gives
    "Hardmax of no rows": (model([N("Hardmax", ["x"], ["y"])], [f32("x", ["n", 4])], [f32("y", None)]),
                           {"x": np.ones((0, 4), np.float32)}),
    "MaxPool-1": (model([N("MaxPool", ["x"], ["y"], kernel_shape=[2, 2])], [f32("x", [1, 1, 4, 4])], [f32("y", None)],
                        opset=7), {"x": GRID}),
    "AveragePool-1, padding excluded (onnxruntime: as AveragePool-7 computes it)": (
        model([N("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])], [f32("x", [1, 1, 4, 4])],
              [f32("y", None)], opset=6), {"x": GRID}),
    "RandomUniformLike with low = high": (
        model([N("RandomUniformLike", ["x"], ["y"], low=2.0, high=2.0, seed=1.0)], [f32("x", ["n", 4])],
              [f32("y", None)]), {"x": ONES}),
    "Constant strings": (model([N("Constant", [], ["y"], value_strings=["a", "b"])], [f32("x", ["n", 4])],
                               [typed("y", TensorProto.STRING, None)]), {"x": ONES}),
    "GRU linear_before_reset without biases": (
        model([N("GRU", ["x", "W", "R"], ["y", "h"], hidden_size=3, linear_before_reset=1)], [f32("x", [4, 2, 2])],
              [f32("y", None), f32("h", None)], [const_init("W", W_GRU), const_init("R", R_GRU)]), {"x": SEQ}),
}


@pytest.mark.parametrize("case", list(AGREE))
def test_numpy_agrees_with_onnxruntime_at_the_edges_of_an_op(case):
    m, feeds = AGREE[case]
    oracle = m
    if "AveragePool-7" in case:  # onnxruntime has no AveragePool-1; version 7 only adds count_include_pad (default 0)
        oracle = type(m)()
        oracle.CopyFrom(m)
        oracle.opset_import[0].version = 7
    got, expected = pp.load(m).run(feeds), pp.load(oracle, backend="onnxruntime").run(feeds)
    assert list(got) == list(expected)
    for name in expected:
        assert got[name].dtype == expected[name].dtype and got[name].shape == expected[name].shape
        if got[name].dtype == object:
            assert got[name].tolist() == expected[name].tolist()
        else:
            np.testing.assert_allclose(got[name], expected[name], rtol=2e-6, atol=1e-6)


def test_batch_normalization_in_training_mode_with_one_output_normalizes_by_the_batch():
    x = RNG.standard_normal((4, 2, 3)).astype(np.float32)
    scale, bias = np.array([1, 2], np.float32), np.array([0, 1], np.float32)
    m = model([N("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], training_mode=1)], [f32("x", ["n", 2, 3])],
              [f32("y", None)], [const_init("s", scale), const_init("b", bias), const_init("m", np.zeros(2)),
                                 const_init("v", np.ones(2))], opset=15)
    mean, var = x.mean(axis=(0, 2), keepdims=True), x.var(axis=(0, 2), keepdims=True)
    expected = (x - mean) / np.sqrt(var + 1e-5) * scale[None, :, None] + bias[None, :, None]
    np.testing.assert_allclose(pp.load(m).run({"x": x})["y"], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("through", [16, 21])  # bfloat16, uint4
def test_casts_to_int4_from_other_small_types_truncate_then_wrap(through):
    """float32 -> bfloat16/uint4 -> int4: the documented rule at every step (a float truncates toward
    zero and keeps its low bits; an integer keeps its low bits, as the Cast page defines), and the
    ONNX reference evaluator's values wherever its input is in range (the page leaves the rest
    undefined, and the reference gives what the installed ml_dtypes gives)."""
    from onnx.reference import ReferenceEvaluator

    first = model([N("Cast", ["x"], ["y"], to=through)], [f32("x", ["n"])], [typed("y", through, None)], opset=21)
    both = model([N("Cast", ["x"], ["c"], to=through), N("Cast", ["c"], ["y"], to=22)], [f32("x", ["n"])],
                 [typed("y", 22, None)], opset=21)
    x = np.array([3, -2.7, 9, -9, 0.5, 15, -8, 7.9], np.float32)
    got = pp.load(both).run({"x": x})["y"]
    assert got.dtype.name == "int4" and got.tolist() == [3, -2, -7, 7, 0, -1, -8, 7]
    # the reference evaluator, where defined: each step in range (ml_dtypes 0.5 cannot cast uint4 to int4)
    step = pp.load(first).run({"x": x})["y"].astype(np.float32)
    with np.errstate(all="ignore"):
        reference = ReferenceEvaluator(first).run(None, {"x": x})[0].astype(np.float32)
    in_range = (np.trunc(x) >= (0 if through == 21 else -np.inf)) & (np.trunc(x) <= 15)
    assert step[in_range].tolist() == reference[in_range].tolist()


def test_strings_cast_to_int4_as_the_floats_they_spell():
    m = model([N("Cast", ["x"], ["y"], to=22)], [typed("x", TensorProto.STRING, ["n"])], [typed("y", 22, None)], opset=21)
    got = pp.load(m).run({"x": np.array(["3", "-2.7", "9", "-0.5"], dtype=object)})["y"]
    floats = pp.load(model([N("Cast", ["x"], ["y"], to=22)], [f32("x", ["n"])], [typed("y", 22, None)], opset=21))
    assert got.tolist() == floats.run({"x": np.array([3, -2.7, 9, -0.5], np.float32)})["y"].tolist() == [3, -2, -7, 0]


# --------------------------------------------------------------------------------------- registry


@pytest.fixture
def own_registry(monkeypatch):
    """An empty registry the test fills (the real one is put back afterwards)."""
    monkeypatch.setattr(registry, "_REGISTRY", {})
    return registry._REGISTRY


def test_registering_reads_inputs_and_attributes_from_the_signature(own_registry):
    @registry.op("Mix", since=3, domain="test.domain")
    def mix(a, b, c=None, /, *, alpha=1.0, node_outputs, rng):
        return a

    @registry.op("Many", since=1)
    def many(*inputs, axis=0):
        return inputs[0]

    @registry.op("Loose", since=1)
    def loose(x, y=None, **attrs):
        return x

    impl = own_registry[("test.domain", "Mix")][3]
    assert (impl.op_type, impl.since, impl.fn, impl.domain) == ("Mix", 3, mix, "test.domain")
    assert (impl.input_names, impl.required_inputs, impl.max_inputs) == (("a", "b", "c"), 2, 3)
    assert impl.attribute_names == {"alpha"} and impl.wants_node_outputs and impl.wants_rng and impl.check is None
    many_impl = own_registry[("", "Many")][1]
    assert (many_impl.input_names, many_impl.required_inputs, many_impl.max_inputs) == ((), 0, None)
    assert many_impl.attribute_names == {"axis"} and not many_impl.wants_node_outputs and not many_impl.wants_rng
    loose_impl = own_registry[("", "Loose")][1]
    assert (loose_impl.input_names, loose_impl.required_inputs, loose_impl.attribute_names) == (("x", "y"), 1, None)
    assert registry.supported_ops() == {"Loose": [1], "Many": [1]}  # the default domain only, by name
    assert registry.versions("Mix", "test.domain") == [3] and registry.versions("Mix") == []


def test_an_op_registered_twice_at_one_version_is_refused(own_registry):
    def first(x):
        return x

    def second(x):
        return x

    registry.op("Twice", since=5)(first)
    registry.op("Twice", since=6)(second)  # another version: fine
    with pytest.raises(ValueError, match=exactly(
            "Twice since opset 5 is registered twice: test_edges.test_an_op_registered_twice_at_one_version_is_refused."
            "<locals>.first and test_edges.test_an_op_registered_twice_at_one_version_is_refused.<locals>.second")):
        registry.op("Twice", since=5)(second)
    assert registry.versions("Twice") == [5, 6]
    assert registry.resolve("Twice", 5).fn is first and registry.resolve("Twice", 7).fn is second
    with pytest.raises(pp.UnsupportedOpError):
        registry.resolve("Twice", 4)


def test_the_op_table_lists_each_op_with_its_versions_in_rows_of_columns(own_registry):
    for name, since in (("A", 1), ("B", 7), ("B", 13), ("C", 2), ("D", 4), ("E", 9)):
        registry.op(name, since=since)(lambda x: x)
    registry.op("Z", since=1, domain="other")(lambda x: x)
    assert registry.op_table_markdown(columns=2) == (
        "| op (since opset) | op (since opset) |\n"
        "|---|---|\n"
        "| A (1) | B (7, 13) |\n"
        "| C (2) | D (4) |\n"
        "| E (9) |  |\n")
    assert registry.op_table_markdown().splitlines()[:3] == [
        "| op (since opset) | op (since opset) | op (since opset) | op (since opset) |", "|---|---|---|---|",
        "| A (1) | B (7, 13) | C (2) | D (4) |"]


def test_missing_ops_names_each_op_once_with_every_node_in_order_of_first_use():
    m = model([N("Foo", ["obs"], ["a"], name="f1"), N("Tanh", ["a"], ["b"], name="t"), N("Bar", ["b"], ["c"], name="b1"),
               N("Foo", ["c"], ["y"], name="f2"), N("Gelu", ["y"], ["z"], name="g")],
              [f32("obs", ["batch", 2])], [f32("z", None)], opset=19)
    found = registry.missing_ops(from_onnx(m))
    assert [(x.op_type, x.domain, x.opset, x.nodes, x.versions) for x in found] == [
        ("Foo", "", 19, ("f1", "f2"), ()), ("Bar", "", 19, ("b1",), ()), ("Gelu", "", 19, ("g",), (20,))]


# ----------------------------------------------------------------------------------- feed checks


def test_valid_feeds_pass_the_compiled_check_as_they_are_and_anything_else_goes_the_long_way():
    inputs = [ValueInfo("a", F32, ("n", 3)), ValueInfo("b", np.dtype(np.int64), (2,))]
    check = base.compile_feed_check(inputs, [ValueInfo("w", F32, (3,))])
    feeds = {"a": np.ones((4, 3), np.float32), "b": np.zeros(2, np.int64)}
    assert check(feeds) is feeds  # nothing copied, nothing rebuilt
    with_optional = {**feeds, "w": np.ones(3, np.float32)}
    got = check(with_optional)
    assert got is not with_optional and list(got) == ["a", "b", "w"]
    swapped = {"b": feeds["b"], "a": feeds["a"]}  # read by name: any order passes as it is
    assert check(swapped) is swapped
    assert list(base.check_feeds(swapped, inputs)) == ["a", "b"]  # the long way: in graph-input order
    for bad, message in (
            ({"a": feeds["a"]}, "the model's inputs are ['a', 'b'] (and optionally ['w']); the feeds have missing ['b']"),
            ({**feeds, "a": feeds["a"].astype(np.float64)}, "input 'a' expects dtype float32, got float64; convert it "
                                                            "first (e.g. x.astype(np.float32))"),
            ({**feeds, "a": np.ones((4, 3, 1), np.float32)}, "input 'a' expects rank 2 with shape (n, 3), got rank 3 "
                                                             "with shape (4, 3, 1)"),
            ({**feeds, "a": np.ones((4, 2), np.float32)}, "input 'a' expects shape (n, 3), got (4, 2) (axis 1 is 2, "
                                                          "the model needs 3)"),
            ({**feeds, "b": np.zeros(3, np.int64)}, "input 'b' expects shape (2,), got (3,) (axis 0 is 3, the model "
                                                    "needs 2)"),
            ({**feeds, "b": np.zeros((1, 2), np.int64)}, "input 'b' expects rank 1 with shape (2,), got rank 2 with "
                                                         "shape (1, 2)"),
            ({**feeds, "b": np.int64(3)}, "input 'b' expects rank 1 with shape (2,), got rank 0 with shape () (add a "
                                          "batch axis: x[None])"),
            ({**feeds, "a": [[1.0, 2.0, 3.0]]}, "input 'a' expects dtype float32, got float64; convert it first (e.g. "
                                                "x.astype(np.float32))")):
        with pytest.raises(pp.InputMismatchError, match=exactly(message)):
            check(bad)


def test_inputs_sharing_a_symbol_must_agree_and_other_byte_orders_are_converted():
    inputs = [ValueInfo("a", F32, ("n", 3)), ValueInfo("b", F32, ("n",))]
    check = base.compile_feed_check(inputs)
    with pytest.raises(pp.InputMismatchError, match=exactly("dimension 'n' is 4 in input 'a' but 5 in input 'b'")):
        check({"a": np.ones((4, 3), np.float32), "b": np.ones(5, np.float32)})
    swapped = np.arange(3, dtype=">f4").reshape(1, 3)
    got = check({"a": swapped, "b": np.ones(1, np.float32)})
    assert got["a"].dtype == np.dtype("<f4") and got["a"].tolist() == [[0, 1, 2]]
    assert base.native_order(swapped).dtype.isnative and base.native_order(np.ones(2, np.uint8)).dtype == np.uint8
    kept = np.ones(2, np.float32)
    assert base.native_order(kept) is kept and base.native_order("text") == "text"


# ------------------------------------------------------------------------------------ onnxruntime


def test_onnxruntime_sessions_get_the_threads_asked_for_and_stay_quiet():
    session = pp.load(tanh_model(), backend="onnxruntime", threads=3)
    session.record(np.ones((2, 4), np.float32), "y")  # a recording session is built alike
    for built in [session.backend._session, *session.backend._recording.values()]:
        opts = built.get_session_options()
        assert (opts.intra_op_num_threads, opts.inter_op_num_threads, opts.log_severity_level) == (3, 1, 4)
        assert built.get_providers() == ["CPUExecutionProvider"]
    assert pp.load(tanh_model(), backend="onnxruntime").backend._session.get_session_options().intra_op_num_threads == 0


def test_onnxruntime_records_nothing_more_as_a_plain_run_and_copies_a_fed_output():
    m = model([helper.make_node("Tanh", ["obs"], ["y"])], [f32("obs", ["batch", 2])],
              [f32("y", ["batch", 2]), f32("obs", ["batch", 2])])
    backend = pp.load(m, backend="onnxruntime").backend
    obs = np.array([[0.5, -1.0]], np.float32)
    assert list(backend.record({"obs": obs}, [])) == ["y", "obs"] and backend._recording == {}
    steered = backend.record_steered({"obs": obs}, None, pp.runtime.Steering(parse("y[0]=3"), ["y"]))
    assert steered["y"].tolist() == [[3.0, np.tanh(np.float32(-1.0))]] and steered["obs"].tolist() == obs.tolist()
    assert steered["obs"] is not obs


def parse(spec):
    from policyport.runtime.overrides import parse_overrides

    return parse_overrides(spec)


def test_a_seed_is_a_whole_number_from_0():
    with pytest.raises(pp.InputMismatchError, match=r"^seed must be a finite number >= 0, got -1$"):
        pp.load(tanh_model(), seed=-1)
    assert pp.load(tanh_model(), seed=0).backend.seed == 0


def optional_input_model():
    """y = Tanh(obs * w), w an initializer that is a graph input too (a feed may replace it)."""
    graph = helper.make_graph([helper.make_node("Mul", ["obs", "w"], ["p"]), helper.make_node("Tanh", ["p"], ["y"])], "g",
                              [f32("obs", ["batch", 3]), f32("w", [3])], [f32("y", ["batch", 3])],
                              [numpy_helper.from_array(np.array([1.0, 2.0, 3.0], np.float32), "w")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("backend", list(pp.BACKENDS))
def test_an_optional_input_fed_or_not_in_every_mode_with_and_without_overrides(backend):
    session = pp.load(optional_input_model(), backend=backend)
    assert [v.name for v in session.inputs] == ["obs"] and [v.name for v in session.optional_inputs] == ["w"]
    obs = np.array([[0.1, 0.2, 0.3]], np.float32)
    w = np.array([-1.0, 0.5, 0.0], np.float32)
    default, fed = np.tanh(obs * [1, 2, 3]).astype(np.float32), np.tanh(obs * w).astype(np.float32)
    for _ in range(2):  # each variant compiled once, then reused
        for feeds, expected in (({"obs": obs}, default), ({"obs": obs, "w": w}, fed)):
            np.testing.assert_allclose(session.run(feeds)["y"], expected, rtol=1e-6)
            np.testing.assert_allclose(session.record(feeds, "p")["p"], np.arctanh(expected), rtol=1e-5)
            steered = expected.copy()
            steered[:, 1] = 9
            np.testing.assert_allclose(session.run(feeds, overrides="y[1]=9")["y"], steered, rtol=1e-6)
            recorded = session.record(feeds, overrides="y[1]=9")
            assert list(recorded) == ["p", "y"]
            np.testing.assert_allclose(recorded["y"], steered, rtol=1e-6)
    if backend == "numpy":
        assert sorted(map(sorted, session.backend._plans)) == [[], ["w"]]
        assert len(session.backend._steered) == 4  # run and record, with and without w
