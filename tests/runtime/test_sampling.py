"""Random ops: shapes, dtypes, distributions and seeding, on the numpy backend and onnxruntime.

Random values cannot match another implementation's, so the ONNX node tests of these ops are
excluded from the conformance run; here both backends must draw from the distribution the operator
page defines. Bounds are five standard errors of the statistic at the sample size used, and every
draw is seeded, so the tests are deterministic.
"""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

import policyport as pp  # noqa: E402
from onnx_node import node_model, run  # noqa: E402
from policyport.runtime.numpy.plan import node_generator  # noqa: E402

pytestmark = pytest.mark.usefixtures("strict_numpy")

N = 20000
BACKENDS = ["numpy", "onnxruntime"]


def generator_model(op_type, shape, opset=17, out_dtype=np.float32, **attrs):
    """A graph of one input-less random node (RandomNormal, RandomUniform) with output ``y0``."""
    node = helper.make_node(op_type, [], ["y0"], name="n0", shape=list(shape), **attrs)
    out = helper.make_tensor_value_info("y0", helper.np_dtype_to_tensor_dtype(np.dtype(out_dtype)), list(shape))
    graph = helper.make_graph([node], "g", [], [out])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def within(value, expected, standard_error):
    assert abs(value - expected) <= 5 * standard_error, (value, expected, standard_error)


@pytest.mark.parametrize("backend, dtype, code", [
    (backend, dtype, code) for backend in BACKENDS
    for dtype, code in [(np.float32, TensorProto.FLOAT), (np.float64, TensorProto.DOUBLE),
                        (np.float16, TensorProto.FLOAT16)]
    if not (backend == "onnxruntime" and dtype == np.float16)  # onnxruntime has no float16 RandomNormal
])
def test_random_normal_has_the_mean_scale_shape_and_dtype_asked_for(backend, dtype, code):
    model = generator_model("RandomNormal", (N // 100, 100), out_dtype=dtype, dtype=code, mean=10.0, scale=0.5)
    y = run(model, {}, backend=backend, seed=1)[0]
    assert y.dtype == dtype and y.shape == (N // 100, 100)
    y = y.astype(np.float64)
    within(y.mean(), 10.0, 0.5 / np.sqrt(N) + (0.005 if dtype == np.float16 else 0))  # float16 spacing at 10
    within(y.std(), 0.5, 0.5 / np.sqrt(2 * N))
    within(np.mean(np.abs(y - 10.0) < 0.5), 0.6827, np.sqrt(0.6827 * 0.3173 / N))  # the shape: one sigma


@pytest.mark.parametrize("op_type", ["RandomNormal", "RandomUniform"])
def test_float64_samples_are_drawn_in_float64_not_widened_from_float32(op_type):
    y = run(generator_model(op_type, (1000,), out_dtype=np.float64, dtype=TensorProto.DOUBLE), {}, seed=6)[0]
    widened = y.astype(np.float32).astype(np.float64) == y  # what a float32 draw cast to float64 would all be
    assert y.dtype == np.float64 and widened.mean() < 0.01


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("like_dtype, attrs, out_dtype", [
    (np.float32, {}, np.float32),
    (np.float64, {}, np.float64),
    (np.int64, {"dtype": TensorProto.FLOAT}, np.float32),
    (np.float32, {"dtype": TensorProto.DOUBLE}, np.float64),
])
def test_random_normal_like_takes_the_input_shape_and_its_dtype_unless_told(backend, like_dtype, attrs, out_dtype):
    x = np.zeros((40, N // 40), like_dtype)
    model = node_model("RandomNormalLike", {"x": x}, 17, out_dtypes=[out_dtype], mean=-20.0, scale=3.0, **attrs)
    y = run(model, {"x": x}, backend=backend, seed=2)[0]
    assert y.dtype == out_dtype and y.shape == x.shape
    within(y.mean(), -20.0, 3.0 / np.sqrt(N))
    within(y.std(), 3.0, 3.0 / np.sqrt(2 * N))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("like", [False, True])
def test_random_uniform_covers_low_to_high_evenly(backend, like):
    low, high = -2.0, 6.0
    if like:
        x = np.zeros((N,), np.float32)
        y = run(node_model("RandomUniformLike", {"x": x}, 17, low=low, high=high), {"x": x}, backend=backend, seed=3)[0]
    else:
        y = run(generator_model("RandomUniform", (N,), low=low, high=high), {}, backend=backend, seed=3)[0]
    assert y.dtype == np.float32 and y.shape == (N,)
    assert low <= y.min() and y.max() < high
    spread = (high - low) / np.sqrt(12)
    within(y.mean(), (low + high) / 2, spread / np.sqrt(N))
    counts = np.histogram(y, bins=8, range=(low, high))[0]
    for count in counts:
        within(count / N, 1 / 8, np.sqrt(1 / 8 * 7 / 8 / N))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype, code", [(np.int32, None), (np.int64, TensorProto.INT64)])
def test_multinomial_draws_classes_by_their_softmax_probability(backend, dtype, code):
    """Two rows of unnormalized log-probabilities, as torch.multinomial exports them (Log of a softmax):
    one with a class at -inf (an ML-Agents action mask after softmax underflows to 0, whose log is
    -inf) and one far below the rest; neither may ever be drawn."""
    logits = np.array([[0.5, -np.inf, 1.5, 0.0], [-1e8, 2.0, 2.0, -1.0]], np.float32)
    attrs = {"sample_size": N} | ({"dtype": code} if code else {})
    y = run(node_model("Multinomial", {"x": logits}, 15, out_dtypes=[dtype], **attrs), {"x": logits},
            backend=backend, seed=4)[0]
    assert y.dtype == dtype and y.shape == (2, N)
    with np.errstate(under="ignore"):
        probabilities = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    for row, p in zip(y, probabilities):
        frequencies = np.bincount(row, minlength=4) / N
        for f, q in zip(frequencies, p):
            if q == 0:
                assert f == 0
            else:
                within(f, q, np.sqrt(q * (1 - q) / N))


class FixedDraws:
    """A stand-in for numpy's Generator whose uniform draws are given."""

    def __init__(self, values):
        self.values = np.asarray(values, np.float64)

    def random(self, shape):
        return np.broadcast_to(self.values, shape)


def test_multinomial_never_draws_a_class_of_weight_zero_even_at_the_ends_of_the_draw():
    """Weights (0, 1, 0, 1, 0): a uniform draw of exactly 0, one just below 1, and one landing exactly on
    the boundary between the two positive classes all draw a class of positive weight."""
    from policyport.runtime.numpy.ops.sampling import multinomial

    with np.errstate(divide="ignore"):
        logits = np.log(np.array([[0.0, 1.0, 0.0, 1.0, 0.0]], np.float32))
    drawn = [multinomial(logits, sample_size=1, rng=FixedDraws([u])).item() for u in (0.0, np.nextafter(1.0, 0.0), 0.5)]
    assert drawn == [1, 3, 3]


def test_multinomial_draws_one_sample_per_row_of_a_batch():
    logits = np.log(np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0]], np.float32) + 1e-30)
    y = run(node_model("Multinomial", {"x": logits}, 7, out_dtypes=[np.int32]), {"x": logits}, seed=0)[0]
    np.testing.assert_array_equal(y, [[0], [2], [1]])


ORT_BERNOULLI = pytest.mark.xfail(strict=True, reason="onnxruntime 1.32's Bernoulli draws 1 with probability "
                                   "1 - p (p = 0 gives all ones), against the operator page and torch.bernoulli")


@pytest.mark.parametrize("backend", ["numpy", pytest.param("onnxruntime", marks=ORT_BERNOULLI)])
@pytest.mark.parametrize("attrs, out_dtype", [({}, np.float32), ({"dtype": TensorProto.DOUBLE}, np.float64),
                                              ({"dtype": TensorProto.BOOL}, np.bool_)])
def test_bernoulli_draws_ones_with_the_given_probability(backend, attrs, out_dtype):
    p = np.repeat(np.array([[0.0, 0.2, 0.5, 0.9, 1.0]], np.float32), N // 5, axis=0)
    y = run(node_model("Bernoulli", {"x": p}, 15, out_dtypes=[out_dtype], **attrs), {"x": p}, backend=backend,
            seed=5)[0]
    assert y.dtype == out_dtype and y.shape == p.shape
    assert set(np.unique(y.astype(np.float64))) <= {0.0, 1.0}
    for column, q in zip(y.T.astype(np.float64), p[0]):
        within(column.mean(), q, np.sqrt(q * (1 - q) / len(column)) + 1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_seed_reproduces_a_session_and_another_seed_differs(backend):
    x = np.zeros((64,), np.float32)
    model = node_model("RandomNormalLike", {"x": x}, 17)

    def two_runs(seed):
        session = pp.load(model, backend=backend, seed=seed)
        return session.run({"x": x})["y0"], session.run({"x": x})["y0"]

    first, second = two_runs(7)
    assert not np.array_equal(first, second)  # the generator moves on from run to run
    again = two_runs(7)
    np.testing.assert_array_equal(first, again[0])
    np.testing.assert_array_equal(second, again[1])
    assert not np.array_equal(first, two_runs(8)[0])


def test_without_a_seed_sessions_draw_fresh_numbers():
    x = np.zeros((64,), np.float32)
    model = node_model("RandomUniformLike", {"x": x}, 17)
    assert not np.array_equal(run(model, {"x": x})[0], run(model, {"x": x})[0])


def test_a_node_seed_attribute_seeds_that_node_alone():
    """A node's ``seed`` draws what numpy.random.default_rng(seed) draws, whatever the session's seed;
    a node without one draws from the session's generator."""
    x = np.zeros((3, 5), np.float32)
    graph = helper.make_graph(
        [helper.make_node("RandomNormalLike", ["x"], ["seeded"], seed=5.0),
         helper.make_node("RandomNormalLike", ["x"], ["free"]),
         helper.make_node("RandomNormalLike", ["x"], ["free_too"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3, 5]) for n in ("seeded", "free", "free_too")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    a = pp.load(model, backend="numpy", seed=1).run({"x": x})
    b = pp.load(model, backend="numpy", seed=2).run({"x": x})
    expected = np.random.default_rng(5).standard_normal((3, 5), dtype=np.float32)
    np.testing.assert_array_equal(a["seeded"], expected)
    np.testing.assert_array_equal(b["seeded"], expected)
    assert not np.array_equal(a["free"], b["free"]) and not np.array_equal(a["free"], a["free_too"])


def test_node_generator_seeds():
    assert node_generator(5.0).integers(1 << 30) == np.random.default_rng(5).integers(1 << 30)
    assert node_generator(0.5).integers(1 << 30) != node_generator(-0.5).integers(1 << 30)


@pytest.mark.parametrize("op_type, feeds, attrs, message", [
    ("RandomNormalLike", {"x": np.zeros(3, np.int64)}, {}, "random values are floating point; dtype int64 is not"),
    ("Multinomial", {"x": np.zeros((1, 3), np.float32)}, {"dtype": TensorProto.FLOAT},
     "Multinomial's dtype must be int32 or int64, not float32"),
    ("Multinomial", {"x": np.zeros(3, np.float32)}, {}, r"Multinomial takes \(batch, classes\) log-probabilities, got shape \(3,\)"),
])
def test_bad_random_nodes_are_bad_model_errors_naming_the_node(op_type, feeds, attrs, message):
    with pytest.raises(pp.BadModelError, match=rf'{op_type} node "n0" on the numpy backend failed: ValueError: {message}'):
        run(node_model(op_type, feeds, 17, **attrs), feeds)


def test_a_uniform_draw_that_rounds_up_to_high_is_kept_below_it():
    from policyport.runtime.numpy.ops import sampling

    class Top:  # every draw the largest float32 below 1
        def random(self, shape, dtype):
            return np.full(shape, 1 - 2.0 ** -24, dtype)

    y = sampling._uniform((4,), np.dtype(np.float32), 1.0, 2.0, Top())
    # 1 + (1 - 2**-24) rounds to 2.0 in float32: the range is [low, high), so the float32 just below 2
    assert y.dtype == np.float32 and y.tolist() == [2 - 2.0 ** -23] * 4
