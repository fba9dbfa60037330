"""Large batches in row blocks on several threads: the same bits on any thread count, the same rows
as a call on each block, whole-batch semantics wherever rows are not independent."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import policyport as pp
from policyport.runtime.numpy import rows as rows_module
from policyport.runtime.numpy.rows import BLOCK_ROWS, SPLIT_ROWS, blocks
from test_plan import f32, model  # noqa: E402  (pytest puts this folder on sys.path)

threadpoolctl = pytest.importorskip("threadpoolctl")


def same_bits(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert a[name].tobytes() == b[name].tobytes(), name


@pytest.fixture(scope="module")
def big_obs():
    return np.random.default_rng(7).uniform(0, 1, (4096 + 77, 275)).astype(np.float32)


@pytest.fixture(scope="module")
def relu_model():
    rng = np.random.default_rng(0)
    sizes = [64, 256, 256, 8]
    weights = {}
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        name = f"fc_{i + 1}" if i < len(sizes) - 2 else "fc_out"
        weights[f"{name}/kernel"] = (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32)
        weights[f"{name}/bias"] = rng.standard_normal(b).astype(np.float32)
    return pp.convert(weights, activation="relu", head="categorical")


def test_blocks_cover_the_batch_in_near_equal_pieces_of_at_most_block_rows():
    for rows in (SPLIT_ROWS, 1025, 4096, 4173, 10_000):
        bounds = blocks(rows)
        assert bounds[0][0] == 0 and bounds[-1][1] == rows
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
        sizes = {hi - lo for lo, hi in bounds}
        assert max(sizes) <= BLOCK_ROWS and max(sizes) - min(sizes) <= 1 and min(sizes) > 1
    assert blocks(4096) == [(i, i + 512) for i in range(0, 4096, 512)]


@pytest.mark.parametrize("which", ["metadrive", "relu"])
def test_any_thread_count_gives_the_same_bits_in_every_mode(which, metadrive_model, relu_model, big_obs):
    m, obs = (metadrive_model, big_obs) if which == "metadrive" else (relu_model, big_obs[:, :64].copy())
    sessions = [pp.load(m, threads=n) for n in (1, 2, 3)]
    assert sessions[0].backend.plan._rows is not None  # these graphs run in blocks
    overrides = ["fc_1/relu[3,5]=2" if which == "relu" else "fc_2/tanh[17]=1"]
    results = [(s.run(obs), s.record(obs), s.run(obs, overrides=overrides), s.record(obs, overrides=overrides))
               for s in sessions]
    for other in results[1:]:
        for a, b in zip(results[0], other):
            same_bits(a, b)


def test_each_block_computes_what_a_call_on_its_rows_computes(metadrive_model, big_obs):
    session = pp.load(metadrive_model)
    whole, recorded = session.run(big_obs), session.record(big_obs)
    steered = session.record(big_obs, overrides="fc_1/tanh[0:9]*=0.5")
    # a block's rows alone are under the split and run whole, on the BLAS's own threads unless held to one: some
    # kernels (OpenBLAS's Haswell one) round a product on two threads differently from one
    with threadpoolctl.threadpool_limits(1):
        for lo, hi in blocks(len(big_obs)):
            same_bits({k: v[lo:hi] for k, v in whole.items()}, session.run(big_obs[lo:hi]))
            same_bits({k: v[lo:hi] for k, v in recorded.items()}, session.record(big_obs[lo:hi]))
            same_bits({k: v[lo:hi] for k, v in steered.items()},
                      session.record(big_obs[lo:hi], overrides="fc_1/tanh[0:9]*=0.5"))


def test_blocks_agree_with_the_whole_batch_and_the_source(metadrive_model, metadrive_weights, big_obs):
    p = "default_policy/"
    h = np.tanh(big_obs @ metadrive_weights[p + "fc_1/kernel"] + metadrive_weights[p + "fc_1/bias"])
    h = np.tanh(h @ metadrive_weights[p + "fc_2/kernel"] + metadrive_weights[p + "fc_2/bias"])
    logits = h @ metadrive_weights[p + "fc_out/kernel"] + metadrive_weights[p + "fc_out/bias"]
    np.testing.assert_allclose(pp.load(metadrive_model).run(big_obs)["logits"], logits, rtol=1e-5, atol=1e-5)


def test_below_the_split_a_batch_runs_whole(metadrive_model, big_obs):
    session = pp.load(metadrive_model)
    whole = session.backend.plan._compile("run", split=False)
    obs = big_obs[:SPLIT_ROWS - 1]
    same_bits(session.run(obs), whole({"obs": obs}))


def test_results_own_their_memory_and_survive_later_calls(big_obs):
    m = model([helper.make_node("Identity", ["obs"], ["same"]), helper.make_node("Tanh", ["obs"], ["t"])],
              [f32("obs", ["batch", 3])], [f32("same", ["batch", 3]), f32("t", ["batch", 3])])
    session = pp.load(m)
    obs = big_obs[:, :3].copy()
    first = session.run(obs)
    assert session.backend.plan._rows is not None
    kept = {k: v.copy() for k, v in first.items()}
    assert not np.shares_memory(first["same"], obs)
    obs[:] = 0
    session.run(obs)
    session.record(obs)
    same_bits(first, kept)


@pytest.mark.parametrize("nodes, inits, why", [
    ([helper.make_node("Softmax", ["obs"], ["y"], axis=0)], [], "softmax over the batch"),
    ([helper.make_node("ReduceMean", ["obs"], ["m"], axes=[0], keepdims=1), helper.make_node("Sub", ["obs", "m"], ["y"])],
     [], "a mean over the batch"),
    ([helper.make_node("Shape", ["obs"], ["s"]), helper.make_node("Reshape", ["obs", "s"], ["y"])], [], "a shape"),
    ([helper.make_node("RandomNormalLike", ["obs"], ["r"], seed=3.0), helper.make_node("Add", ["obs", "r"], ["y"])],
     [], "random draws"),
    ([helper.make_node("Add", ["obs", "c"], ["y"])], [numpy_helper.from_array(np.ones((2048, 4), np.float32), "c")],
     "a constant along the batch axis"),
    ([helper.make_node("Transpose", ["obs"], ["t"], perm=[1, 0]), helper.make_node("Transpose", ["t"], ["y"], perm=[1, 0])],
     [], "a transpose that moves the batch axis"),
])
def test_graphs_whose_rows_are_not_independent_run_whole(nodes, inits, why):
    m = model(nodes, [f32("obs", ["batch", 4])], [f32("y", None)], inits)
    session = pp.load(m)
    assert session.backend.plan._rows is None, why
    obs = np.random.default_rng(1).standard_normal((2048, 4)).astype(np.float32)
    whole = session.backend.plan._compile("run", split=False)
    if "random" not in why:
        same_bits(session.run(obs), whole({"obs": obs}))


def test_an_error_in_a_block_names_the_node(big_obs):
    m = model([helper.make_node("Tanh", ["obs"], ["a"], name="tanh_1"),
               helper.make_node("Reshape", ["a", "shape"], ["y"], name="bad_reshape")],
              [f32("obs", ["batch", 6])], [f32("y", None)], [numpy_helper.from_array(np.array([0, 4], np.int64), "shape")])
    session = pp.load(m)
    assert session.backend.plan._rows is not None
    for run in (session.run, session.record):
        with pytest.raises(pp.BadModelError, match='Reshape node "bad_reshape"'):
            run(np.ones((SPLIT_ROWS * 2, 6), np.float32))


def test_without_threadpoolctl_the_blocks_run_on_the_calling_thread(metadrive_model, big_obs, monkeypatch):
    expected = pp.load(metadrive_model, threads=1).run(big_obs)
    monkeypatch.setattr(rows_module, "_blas_one_thread", lambda: None)
    monkeypatch.setattr(rows_module, "_pool", lambda workers: pytest.fail("no worker threads without threadpoolctl"))
    got = pp.load(metadrive_model, threads=4).run(big_obs)
    np.testing.assert_allclose(got["logits"], expected["logits"], rtol=1e-6, atol=1e-6)


def test_concurrent_calls_give_the_sequential_results_and_restore_the_blas_threads(metadrive_model, big_obs):
    before = [lib["num_threads"] for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "blas"]
    session = pp.load(metadrive_model, threads=2)
    expected = session.record(big_obs)
    got: list = [None] * 4

    def call(i):
        got[i] = session.record(big_obs)

    callers = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for c in callers:
        c.start()
    for c in callers:
        c.join()
    for g in got:  # on a BLAS whose thread count changes bits (OpenBLAS's Haswell kernel), overlapping calls may differ
        for name, value in expected.items():  # from the sequential ones in the last bits
            np.testing.assert_allclose(g[name], value, rtol=1e-5, atol=1e-5, err_msg=name)
    assert [lib["num_threads"] for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "blas"] == before


def test_observe_runs_the_batch_whole_so_the_observer_sees_whole_tensors(metadrive_model, big_obs):
    session = pp.load(metadrive_model)
    seen = []
    session.observe(big_obs, lambda i, j, v: seen.append(v.shape) or v)
    assert seen[0] == (len(big_obs), 256) and len(seen) == len(metadrive_model.graph.node)


@pytest.mark.parametrize("threads, error", [(-1, pp.InputMismatchError), (1025, pp.InputMismatchError),
                                           (1.5, pp.ArgumentTypeError), (True, pp.ArgumentTypeError),
                                           ("2", pp.ArgumentTypeError)])
def test_threads_must_be_a_count(metadrive_model, threads, error):
    with pytest.raises(error, match=r"threads \(0: one per core\) must be (a whole number|a finite number >= 0 and <= 1024)"):
        pp.load(metadrive_model, threads=threads)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="fork is POSIX")
def test_a_forked_child_runs_large_batches_with_threads_of_its_own(metadrive_model, big_obs, tmp_path):
    import multiprocessing

    session = pp.load(metadrive_model, threads=2)
    expected = session.run(big_obs)  # the parent's worker threads exist now

    def child():
        np.savez(tmp_path / "child.npz", **session.run(big_obs))

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    process.join(timeout=120)
    if process.is_alive():  # a child using the parent's pool waits forever
        process.kill()
        process.join()
    assert process.exitcode == 0
    with np.load(tmp_path / "child.npz") as got:
        same_bits(dict(got), expected)


def test_a_plan_compiled_in_chunks_runs_its_blocks_bit_for_bit(metadrive_model, big_obs, monkeypatch):
    from policyport.runtime.numpy import plan as plan_module

    whole = pp.load(metadrive_model)
    expected = (whole.run(big_obs), whole.record(big_obs), whole.record(big_obs, overrides="fc_2/tanh[3]=0.5"))
    monkeypatch.setattr(plan_module, "CHUNK_LINES", 3)
    chunked = pp.load(metadrive_model, threads=2)
    got = (chunked.run(big_obs), chunked.record(big_obs), chunked.record(big_obs, overrides="fc_2/tanh[3]=0.5"))
    assert any(label.endswith("/into.0") for label in chunked.backend.plan._line_steps)  # blocks ran chunked code
    for a, b in zip(expected, got):
        same_bits(a, b)


def test_a_conv_net_with_two_branches_concatenated_runs_in_blocks_bit_for_bit(tmp_path):
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "fixtures" / "synthetic" / "conv_grid.onnx"
    session = pp.load(path, threads=2)
    plan = session.backend.plan
    assert plan._rows is not None  # Conv, pooling, Flatten, Concat along axis 1: row by row
    assert [s.kind for s in plan.steps if s.op_type == "Gemm"] == ["gemm", "gemm"]  # a Flatten's rank is known
    grid = np.random.default_rng(2).standard_normal((SPLIT_ROWS + 3, 3, 20, 20)).astype(np.float32)
    got = session.record(grid)
    with threadpoolctl.threadpool_limits(1):  # a block's rows alone run whole: on one BLAS thread, as a block does
        for lo, hi in blocks(len(grid)):
            same_bits({k: v[lo:hi] for k, v in got.items()}, session.record(grid[lo:hi]))
    same_bits(got, pp.load(path, threads=1).record(grid))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_relu_is_one_inline_maximum_with_the_registered_functions_bits(dtype):
    from policyport.runtime.numpy.ops.activation import relu

    elem = {np.float32: 1, np.float64: 11, np.float16: 10}[dtype]
    m = model([helper.make_node("Relu", ["obs"], ["y"])], [helper.make_tensor_value_info("obs", elem, ["batch", 4])],
              [helper.make_tensor_value_info("y", elem, ["batch", 4])])
    session = pp.load(m)
    assert [s.kind for s in session.backend.plan.steps] == ["relu"]
    obs = np.array([[-1.5, -0.0, np.nan, 2.0]] * (SPLIT_ROWS + 1), dtype)
    for rows in (1, SPLIT_ROWS + 1):
        got = session.run(obs[:rows])["y"]
        assert got.dtype == dtype and got.tobytes() == relu(obs[:rows]).tobytes()


def test_scratch_hands_out_one_kept_buffer_per_step_and_fresh_ones_past_its_limit():
    scratch = rows_module.Scratch()
    a, b = np.ones((300, 8), np.float32), np.ones((8, 16), np.float32)
    first = scratch.product(3, a, b)
    assert first.shape == (300, 16) and first.dtype == np.float32 and first.flags.c_contiguous
    again = scratch.product(3, a[:299], b)
    assert again.shape == (299, 16) and np.shares_memory(first, again)  # a block one row shorter: same memory
    assert not np.shares_memory(first, scratch.product(4, a, b))  # another step: its own buffer
    assert scratch.product(3, a.astype(np.float64), b) is None  # two dtypes: np.dot allocates
    assert scratch.product(3, a, b.astype(np.float64)) is None
    wider = scratch.product(3, a, np.ones((8, 17), np.float32))
    assert wider.shape == (300, 17) and not np.shares_memory(first, wider)
    longer = scratch.like(5, np.ones((BLOCK_ROWS + 10, 2, 3), np.float16))
    assert longer.shape == (BLOCK_ROWS + 10, 2, 3) and longer.dtype == np.float16
    zeros = scratch.zeros(np.ones((40, 6), np.float64))
    assert zeros.shape == (40, 6) and zeros.dtype == np.float64 and not zeros.any()
    assert np.shares_memory(zeros, scratch.zeros(np.ones((7, 6), np.float64)))
    wide = np.ones((4, rows_module.SCRATCH_BYTES // 4 // BLOCK_ROWS + 1), np.float32)
    assert not np.shares_memory(scratch.like(6, wide), scratch.like(6, wide))  # past the limit: not kept
    assert not scratch.zeros(wide).any()


def test_relu_blocks_keep_the_pre_activation_and_match_the_whole_batch_code(relu_model, big_obs):
    obs = big_obs[:, :64] * 4 - 2  # both signs before every ReLU
    session = pp.load(relu_model)
    plan = session.backend.plan
    whole_run, whole_record = plan._compile("run", split=False), plan._compile("record", split=False)
    recorded, ran = session.record(obs), session.run(obs)
    with threadpoolctl.threadpool_limits(1):  # one BLAS thread, as in a block
        for lo, hi in blocks(len(obs)):  # the straight-line code, without scratch, on each block's rows
            same_bits({k: v[lo:hi] for k, v in recorded.items()}, whole_record({"obs": obs[lo:hi]}))
            same_bits({k: v[lo:hi] for k, v in ran.items()}, whole_run({"obs": obs[lo:hi]}))
    first_gemm = next(n.outputs[0] for n in session.backend.graph.nodes if n.op_type == "Gemm")
    assert (recorded[first_gemm] < 0).any()  # the Gemm's product, not overwritten by the ReLU that reads it


def test_scratch_memory_never_reaches_the_caller(relu_model, big_obs):
    session = pp.load(relu_model)
    obs = big_obs[:, :64].copy()
    first, recorded = session.run(obs), session.record(obs)
    kept = ({k: v.copy() for k, v in first.items()}, {k: v.copy() for k, v in recorded.items()})
    session.run(obs[::-1].copy())
    session.record(obs * 2)
    session.run(obs, overrides="fc_1/relu[*]*=3")
    same_bits(first, kept[0])
    same_bits(recorded, kept[1])


def test_a_relu_whose_input_has_two_readers_or_is_a_feed_leaves_it_whole(big_obs):
    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32), "w")
    m = model([helper.make_node("Gemm", ["obs", "w"], ["g"]),
               helper.make_node("Relu", ["g"], ["r"]), helper.make_node("Sub", ["g", "r"], ["y"]),
               helper.make_node("Relu", ["obs"], ["q"]), helper.make_node("Add", ["q", "obs"], ["z"])],
              [f32("obs", ["batch", 3])], [f32("y", ["batch", 5]), f32("z", ["batch", 3])], [w])
    session = pp.load(m)
    obs = big_obs[:, :3] * 2 - 1
    before = obs.copy()
    got = session.run(obs)
    assert session.backend.plan._rows is not None
    g = obs @ numpy_helper.to_array(w)
    np.testing.assert_array_equal(got["y"], g - np.maximum(g, 0))  # min(g, 0): g was not overwritten
    np.testing.assert_array_equal(got["z"], np.maximum(obs, 0) + obs)
    np.testing.assert_array_equal(obs, before)


def test_relus_of_constants_in_a_row_block_graph_keep_their_shapes(big_obs):
    c = numpy_helper.from_array(np.array(-2.0, np.float32), "c")  # a scalar
    v = numpy_helper.from_array(np.array([-1.0, 3.0, -4.0], np.float32), "v")
    m = model([helper.make_node("Relu", ["c"], ["rc"]), helper.make_node("Relu", ["v"], ["rv"]),
               helper.make_node("Add", ["obs", "rc"], ["s"]), helper.make_node("Add", ["s", "rv"], ["y"])],
              [f32("obs", ["batch", 3])], [f32("y", ["batch", 3])], [c, v])
    session = pp.load(m)
    assert session.backend.plan._rows is not None
    obs = big_obs[:, :3].copy()
    np.testing.assert_array_equal(session.run(obs)["y"], obs + np.array([0.0, 3.0, 0.0], np.float32))
    recorded = session.record(obs)
    assert recorded["rc"].shape == () and recorded["rc"] == 0 and recorded["rv"].tolist() == [0.0, 3.0, 0.0]


def const(name, shape, dtype=np.float32, value=None):
    array = np.full(shape, 0.5, dtype) if value is None else np.asarray(value, dtype)
    return numpy_helper.from_array(array, name)


W43, C3 = const("W", (4, 3)), const("C", (3,))
N = helper.make_node


@pytest.mark.parametrize("obs_shape, nodes, inits, rank", [
    # Gemm: the fast path (constant B, C), the call form (alpha) with C broadcast along rows, transA
    ([None, 4], [N("Gemm", ["obs", "W", "C"], ["y"])], [W43, C3], 2),
    ([None, 4], [N("Gemm", ["obs", "W", "C"], ["y"], alpha=2.0)], [W43, C3], 2),
    ([None, 4], [N("Gemm", ["obs", "W", "C"], ["y"], alpha=2.0)], [W43, const("C", (1, 3))], 2),
    ([None, 4], [N("Gemm", ["obs", "W"], ["y"], alpha=2.0)], [W43], 2),
    ([None, 4], [N("Gemm", ["obs", "W", "C"], ["y"], alpha=2.0)], [W43, const("C", (5, 3))], None),
    ([None, 4], [N("Gemm", ["obs", "W"], ["y"], transA=1)], [W43], None),
    ([None, 4], [N("Gemm", ["W", "obs"], ["y"], transB=1)], [const("W", (3, 4))], None),
    # a constant Slice: along a feature axis, or along the batch axis
    ([None, 4], [N("Slice", ["obs", "s", "e", "a"], ["y"])],
     [const(n, (1,), np.int64, [v]) for n, v in (("s", 1), ("e", 3), ("a", 1))], 2),
    ([None, 4], [N("Slice", ["obs", "s", "e", "a"], ["y"])],
     [const(n, (1,), np.int64, [v]) for n, v in (("s", 1), ("e", 3), ("a", 0))], None),
    # unary ops keep the rank; a Dropout without training_mode
    ([None, 2, 4], [N("Tanh", ["obs"], ["y"])], [], 3),
    ([None, 4], [N("Cast", ["obs"], ["y"], to=11)], [], 2),
    ([None, 4], [N("Dropout", ["obs"], ["y"])], [], 2),
    ([None, 4], [N("Dropout", ["obs", "r", "m"], ["y"])], [const("r", (), value=0.5), const("m", (), np.bool_, False)],
     None),
    # broadcasting: constants without the batch axis, or of size 1 along it; both sides batched
    ([None, 4], [N("Add", ["obs", "b"], ["y"])], [const("b", (4,))], 2),
    ([None, 4], [N("Mul", ["b", "obs"], ["y"])], [const("b", (1, 4))], 2),
    ([None, 4], [N("Add", ["obs", "b"], ["y"])], [const("b", (3, 4))], None),
    ([None, 4], [N("Add", ["obs", "b"], ["y"])], [const("b", (1, 1, 4))], None),
    ([None, 4], [N("Tanh", ["obs"], ["t"]), N("Sub", ["t", "obs"], ["y"])], [], 2),
    ([None, 4], [N("Where", ["m", "obs", "b"], ["y"])], [const("m", (4,), np.bool_, [1, 0, 1, 0]), const("b", (4,))], 2),
    # Concat of batched tensors along a feature axis
    ([None, 4], [N("Tanh", ["obs"], ["t"]), N("Concat", ["obs", "t"], ["y"], axis=1)], [], 2),
    ([None, 4], [N("Tanh", ["obs"], ["t"]), N("Concat", ["obs", "t"], ["y"], axis=-1)], [], 2),
    ([None, 4], [N("Tanh", ["obs"], ["t"]), N("Concat", ["obs", "t"], ["y"], axis=0)], [], None),
    ([None, 4], [N("Tanh", ["obs"], ["t"]), N("Concat", ["obs", "t"], ["y"], axis=-2)], [], None),
    ([None, 4], [N("Concat", ["obs", "b"], ["y"], axis=1)], [const("b", (1, 4))], None),
    ([None, 4], [N("Concat", ["obs", "obs"], ["y"], axis=2)], [], None),
    # ops along an axis: only off the batch axis
    ([None, 4], [N("Softmax", ["obs"], ["y"])], [], 2),
    ([None, 4], [N("Softmax", ["obs"], ["y"], axis=-2)], [], None),
    ([None, 2, 4], [N("LogSoftmax", ["obs"], ["y"], axis=1)], [], 3),
    ([None, 2, 4], [N("Flatten", ["obs"], ["y"])], [], 2),
    ([None, 4], [N("Flatten", ["obs"], ["y"])], [], 2),
    ([None, 2, 4], [N("Flatten", ["obs"], ["y"], axis=0)], [], None),
    ([None, 2, 4], [N("ArgMax", ["obs"], ["y"], axis=2, keepdims=0)], [], 2),
    ([None, 2, 4], [N("ArgMin", ["obs"], ["y"], axis=1)], [], 3),
    ([None, 2, 4], [N("ArgMin", ["obs"], ["y"], axis=-1, keepdims=0)], [], 2),
    ([None, 2, 4], [N("ArgMax", ["obs"], ["y"])], [], None),
    ([None, 2, 4], [N("ArgMin", ["obs"], ["y"])], [], None),  # axis 0 by default, at every opset
    ([None, 4], [N("LayerNormalization", ["obs", "g"], ["y"])], [const("g", (4,))], 2),
    ([None, 4], [N("LayerNormalization", ["obs", "g"], ["y"], axis=0)], [const("g", (4,))], None),
    # MatMul by a matrix; per-sample ops over (N, C, ...)
    ([None, 2, 4], [N("MatMul", ["obs", "W"], ["y"])], [W43], 3),
    ([None, 4], [N("MatMul", ["obs", "W"], ["y"])], [W43], 2),
    ([None, 4], [N("MatMul", ["obs", "W"], ["y"])], [const("W", (2, 4, 3))], None),
    ([None], [N("MatMul", ["obs", "W"], ["y"])], [const("W", (4, 3))], None),
    ([None, 1, 6, 6], [N("MaxPool", ["obs"], ["y"], kernel_shape=[2, 2])], [], 4),
    ([None, 1, 6, 6], [N("MaxPool", ["obs"], ["y", "i"], kernel_shape=[2, 2])], [], None),
    ([None, 1, 6, 6], [N("GlobalAveragePool", ["obs"], ["y"])], [], 4),
    # Reshape keeping axis 0, Transpose keeping it first
    ([None, 4], [N("Reshape", ["obs", "s"], ["y"])], [const("s", (3,), np.int64, [0, 2, 2])], 3),
    ([None, 4], [N("Reshape", ["obs", "s"], ["y"], allowzero=1)], [const("s", (3,), np.int64, [0, 2, 2])], None),
    ([None, 4], [N("Reshape", ["obs", "s"], ["y"])], [const("s", (2,), np.int64, [-1, 4])], None),
    ([None, 2, 4], [N("Transpose", ["obs"], ["y"], perm=[0, 2, 1])], [], 3),
    ([None, 2, 4], [N("Transpose", ["obs"], ["y"], perm=[2, 0, 1])], [], None),
    ([None, 2, 4], [N("Transpose", ["obs"], ["y"])], [], None),  # reverses every axis
    ([None, 4], [N("ReduceSum", ["obs"], ["y"], keepdims=1)], [], None),
    ([None, 4], [N("Size", ["obs"], ["y"])], [], None),
])
def test_the_row_tracker_follows_the_batch_axis_through_each_kind_of_node(obs_shape, nodes, inits, rank):
    obs_shape = ["batch" if d is None else d for d in obs_shape]
    m = model(nodes, [f32("obs", obs_shape)], [f32("y", None)], inits)  # compiled only: the declared type is not used
    session = pp.load(m, threads=2)
    split = session.backend.plan.row_split
    if rank is None:
        assert split is None
        return
    assert split is not None and split.inputs == ("obs",) and split.ranks["y"] == rank
    assert split.ranks["obs"] == len(obs_shape) and not split.whole & {"obs", "y"}
    obs = np.random.default_rng(5).standard_normal((SPLIT_ROWS + 5, *obs_shape[1:])).astype(np.float32)
    whole = session.backend.plan._compile("record", split=False)({"obs": obs})
    same_bits(session.record(obs), whole)  # in blocks, on two threads: the whole batch's bits


def test_tensors_of_constants_alone_are_whole_and_a_graph_without_a_batch_axis_never_splits():
    m = model([N("Tanh", ["b"], ["tb"]), N("Add", ["obs", "tb"], ["y"])], [f32("obs", ["batch", 4])], [f32("y", None)],
              [const("b", (4,))])
    split = pp.load(m).backend.plan.row_split
    assert split.whole == {"b", "tb"} and split.ranks == {"obs": 2, "y": 2}
    fixed = model([N("Tanh", ["obs"], ["y"])], [f32("obs", [2, 4])], [f32("y", None)])
    assert pp.load(fixed).backend.plan.row_split is None
    unknown_rank = model([N("Tanh", ["obs"], ["y"])], [helper.make_tensor_value_info("obs", TensorProto.FLOAT, None)],
                         [f32("y", None)])
    assert pp.load(unknown_rank).backend.plan.row_split is None


ROW_WISE = {  # every op the row tracker follows, as one node reading the batched obs (batch, 1, 4, 4)
    **{op: ([], {}) for op in ("Relu", "LeakyRelu", "Elu", "Selu", "Celu", "ThresholdedRelu", "Sigmoid", "HardSigmoid",
                               "HardSwish", "Tanh", "Softplus", "Softsign", "Mish", "Gelu", "Neg", "Abs", "Exp", "Log",
                               "Sqrt", "Reciprocal", "Sign", "Floor", "Ceil", "Round", "Erf", "Identity", "Clip",
                               "Dropout", "GlobalAveragePool", "GlobalMaxPool")},
    "Cast": ([], {"to": TensorProto.DOUBLE}),
    **{op: (["k"], {}) for op in ("Add", "Sub", "Mul", "Div", "Pow", "PRelu", "Max", "Min", "Sum", "Mean", "Equal",
                                  "Greater", "Less", "GreaterOrEqual", "LessOrEqual")},
    "Where": (["c", "k"], {}),
    "Conv": (["w"], {}),
    "AveragePool": ([], {"kernel_shape": [2, 2]}),
    "MaxPool": ([], {"kernel_shape": [2, 2]}),
    "BatchNormalization": (["s", "b", "m", "v"], {}),
}


@pytest.mark.parametrize("op", list(ROW_WISE))
def test_every_row_wise_op_runs_a_large_batch_in_blocks_with_the_whole_batchs_bits(op):
    others, attrs = ROW_WISE[op]
    inputs = ["c", "obs", "k"] if op == "Where" else ["obs", *others]
    inits = [const("k", (4,), value=[0.5, 2.0, -1.0, 3.0]), const("c", (4,), np.bool_, [1, 0, 1, 0]),
             const("w", (1, 1, 2, 2), value=[[[[1.0, -1.0], [0.5, 2.0]]]]), *(const(n, (1,)) for n in "sbmv")]
    m = model([N(op, inputs, ["y"], **attrs)], [f32("obs", ["batch", 1, 4, 4])], [f32("y", None)], inits, opset=20)
    session = pp.load(m, threads=2)
    split = session.backend.plan.row_split
    assert split is not None and split.ranks["y"] == 4
    obs = np.random.default_rng(6).uniform(0.1, 2, (SPLIT_ROWS + 1, 1, 4, 4)).astype(np.float32)
    same_bits(session.run(obs), session.backend.plan._compile("run", split=False)({"obs": obs}))


def spy_on_blocks(monkeypatch):
    """The row counts RowBlocks was called with, and the worker counts it asked the pool for."""
    calls, workers = [], []
    real_blocks, real_pool = rows_module.blocks, rows_module._pool
    monkeypatch.setattr(rows_module, "blocks", lambda rows: calls.append(rows) or real_blocks(rows))
    monkeypatch.setattr(rows_module, "_pool", lambda n: workers.append(n) or real_pool(n))
    return calls, workers


def test_a_batch_runs_in_blocks_from_1024_rows_on(metadrive_model, big_obs, monkeypatch):
    calls, _ = spy_on_blocks(monkeypatch)
    session = pp.load(metadrive_model, threads=1)
    for rows in (1023, 1024, 1025):
        session.run(big_obs[:rows])
        session.record(big_obs[:rows])
        session.run(big_obs[:rows], overrides="fc_1/tanh[0]=0")
    assert calls == [1024] * 3 + [1025] * 3


@pytest.mark.parametrize("threads, rows, cores, workers", [
    (1, 4096, 8, []), (2, 4096, 8, [1]), (3, 1100, 8, [2, 2]), (8, 1100, 8, [2, 2]), (0, 4096, 3, [2, 2]),
    (0, 4096, 1, []),
])
def test_blocks_run_on_as_many_threads_as_asked_for_cores_and_blocks_allow(metadrive_model, big_obs, monkeypatch,
                                                                           threads, rows, cores, workers):
    _, asked = spy_on_blocks(monkeypatch)
    monkeypatch.setattr(rows_module, "usable_cores", lambda: cores)
    expected = pp.load(metadrive_model, threads=1).run(big_obs[:rows])
    same_bits(pp.load(metadrive_model, threads=threads).run(big_obs[:rows]), expected)
    assert asked == workers  # one pool of threads - 1 workers, asked once per worker the call starts


@pytest.mark.parametrize("rows, sizes", [
    (1024, [512, 512]), (1025, [342, 342, 341]), (1536, [512] * 3), (1537, [385, 384, 384, 384]), (512, [512]),
    (1, [1]),
])
def test_blocks_are_at_most_512_rows_of_near_equal_size(rows, sizes):
    bounds = blocks(rows)
    assert [hi - lo for lo, hi in bounds] == sizes and bounds[0][0] == 0 and bounds[-1][1] == rows
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))


def test_scratch_keeps_buffers_of_up_to_4_mib_and_512_rows():
    scratch = rows_module.Scratch()
    kept = np.ones((512, 2048), np.float32)  # 512 rows of 8 KiB: exactly 4 MiB
    assert np.shares_memory(scratch.like(1, kept), scratch.like(1, kept))
    assert np.shares_memory(scratch.like(2, kept[:3]), scratch.like(2, kept))  # room for 512 rows from the start
    over = np.ones((4, 2049), np.float32)
    assert not np.shares_memory(scratch.like(3, over), scratch.like(3, over))
    assert scratch.like(3, over).shape == (4, 2049)
    big = np.ones((600, 4), np.float32)  # a block of more rows than 512 gets a buffer of its own size
    assert np.shares_memory(scratch.like(4, big), scratch.like(4, big)) and scratch.like(4, big).shape == (600, 4)
    assert scratch.like(4, big[:2]).base is scratch.like(4, big).base


def test_overriding_a_tensor_without_a_feature_axis_runs_the_batch_whole():
    """A neuron of a (batch,) tensor is a row: in blocks, every block would steer its own row 3."""
    m = model([N("ArgMax", ["obs"], ["a"], axis=1, keepdims=0), N("Cast", ["a"], ["y"], to=TensorProto.FLOAT)],
              [f32("obs", ["batch", 4])], [f32("y", None)])
    session = pp.load(m, threads=2)
    assert session.backend.plan.row_split.ranks["a"] == 1
    obs = np.tile(np.eye(4, dtype=np.float32), (SPLIT_ROWS // 4 + 30, 1))
    plain = session.run(obs)["y"]
    steered = session.run(obs, overrides="a[3]=7")["y"]
    changed = np.flatnonzero(steered != plain)
    assert changed.tolist() == [3] and steered[3] == 7


def test_each_thread_keeps_one_scratch_between_calls_holding_every_product_and_relu_zeros(relu_model, big_obs,
                                                                                           monkeypatch):
    made = []

    class Counted(rows_module.Scratch):
        def __init__(self):
            super().__init__()
            made.append(self)

    monkeypatch.setattr(rows_module, "Scratch", Counted)
    session = pp.load(relu_model, threads=1)
    obs = big_obs[:, :64]
    first = session.run(obs)
    for _ in range(2):
        same_bits(session.run(obs), first)
    assert len(made) == 1  # made by the first call's thread, kept for the next calls
    scratch = made[0]
    gemms = [s.index for s in session.backend.plan.steps if s.kind == "gemm"]
    # each hidden layer's product, the first one's (read from the feed) too; the output layer's is the result
    assert sorted(scratch._buffers) == gemms[:2] and len(gemms) == 3
    assert len(scratch._zeros) == 1  # the zeros every ReLU compares against (one width: 256)
