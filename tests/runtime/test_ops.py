"""Targeted tests of the numpy backend's op registry, through the public API.

Each test builds a small model with ``onnx.helper`` and runs it with ``pp.load(model,
backend="numpy")``. Where the ONNX node tests do not reach (op versions older than the newest, float64
precision), onnxruntime is the oracle. Every test runs under ``np.errstate(all="raise")``, so an op
that overflows, underflows or divides by zero on valid input fails.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
ml_dtypes = pytest.importorskip("ml_dtypes")  # onnx depends on it

from onnx import TensorProto, helper  # noqa: E402

import policyport as pp  # noqa: E402
from policyport.graph.model import Graph, from_onnx, onnx_dtype  # noqa: E402
from policyport.runtime.numpy.ops.special import erf, erfc  # noqa: E402
from policyport.runtime.numpy.registry import op, supported_ops  # noqa: E402
from onnx_node import RNG, assert_same, both, close, f32, i64, narrow, node_model, run  # noqa: E402


@pytest.fixture(autouse=True)
def _raise_on_fp_errors():
    with np.errstate(all="raise"):
        yield


# --- version selection ---------------------------------------------------------------------------

def test_softmax_axis_semantics_change_at_13():
    """The same node (axis=1) on a 3-D input: opset 11 normalizes over dims 1 and 2 together."""
    x = f32(2, 3, 4, scale=3)
    y11 = run(node_model("Softmax", {"x": x}, 11, axis=1), {"x": x})[0]
    y13 = run(node_model("Softmax", {"x": x}, 13, axis=1), {"x": x})[0]
    close(y11.sum(axis=(1, 2)), 1, rtol=1e-6)
    close(y13.sum(axis=1), 1, rtol=1e-6)
    assert not np.allclose(y11, y13)
    e = np.exp(x - x.max(axis=(1, 2), keepdims=True))
    close(y11, e / e.sum(axis=(1, 2), keepdims=True), rtol=1e-6)


@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("opset,axis", [(7, None), (7, 0), (7, 2), (11, None), (11, 1), (11, -1),
                                        (13, None), (13, 0), (13, 1), (13, -2)])
def test_softmax_family_matches_onnxruntime(op_type, opset, axis):
    """Before 13 over the input coerced to 2-D at ``axis`` (default 1), from 13 along ``axis``."""
    x = f32(2, 3, 4, scale=3)
    attrs = {} if axis is None else {"axis": axis}
    assert_same(*both(node_model(op_type, {"x": x}, opset, **attrs), {"x": x}))


def test_clip_attribute_form_before_11_input_form_from_11():
    x = f32(3, 5, scale=3)
    y6 = run(node_model("Clip", {"x": x}, 6, min=-1.0, max=0.5), {"x": x})[0]
    bounds = {"lo": np.array(-1.0, np.float32), "hi": np.array(0.5, np.float32)}
    y11 = run(node_model("Clip", {"x": x, **bounds}, 11), {"x": x, **bounds})[0]
    np.testing.assert_array_equal(y6, np.clip(x, -1.0, 0.5))
    np.testing.assert_array_equal(y11, y6)


@pytest.mark.parametrize("opset", [6, 11, 12, 13])
def test_clip_defaults_and_omitted_bounds(opset):
    x = f32(4, 4, scale=5)
    if opset < 11:
        model, feeds = node_model("Clip", {"x": x}, opset, max=1.0), {"x": x}
    else:
        hi = np.array(1.0, np.float32)
        model, feeds = node_model("Clip", {"x": x, "": None, "hi": hi}, opset), {"x": x, "hi": hi}
    assert_same(*both(model, feeds))


def case(label, op_type, feeds, opset, **kwargs):
    return pytest.param(node_model(op_type, feeds, opset, **kwargs), feeds, id=label)


def old_version_cases():
    """Op versions older than the newest (which the ONNX node tests skip), and a few more."""
    x3, x4 = f32(2, 3, 4), f32(2, 3, 4, 5)
    yield case("ReduceSum-11 axes attr", "ReduceSum", {"x": x3}, 11, axes=[0, 2], keepdims=0)
    yield case("ReduceSum-11 all axes", "ReduceSum", {"x": x3}, 11)
    for name in ["ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ReduceLogSumExp"]:
        yield case(f"{name}-13 axes attr", name, {"x": x3}, 13, axes=[-1])
        axes = i64(1)
        yield case(f"{name}-18 axes input", name, {"x": x3, "axes": axes}, 18, keepdims=0)
        yield case(f"{name}-18 no axes", name, {"x": x3}, 18)
    none = np.zeros(0, np.int64)
    yield case("ReduceSum-13 noop", "ReduceSum", {"x": x3, "axes": none}, 13, noop_with_empty_axes=1)
    yield case("ReduceL2-18 noop", "ReduceL2", {"x": x3, "axes": none}, 18, noop_with_empty_axes=1)
    yield case("Split-11 attr", "Split", {"x": x3}, 11, outputs=2, axis=2, split=[1, 3])
    yield case("Split-11 equal", "Split", {"x": x3}, 11, outputs=2, axis=-1)
    yield case("Split-7 single output", "Split", {"x": x3}, 7, axis=1)
    sizes = i64(2, 1)
    yield case("Split-13 input", "Split", {"x": x3, "s": sizes}, 13, outputs=2, axis=1)
    yield case("Split-18 uneven", "Split", {"x": x4}, 18, outputs=3, axis=3, num_outputs=3)
    yield case("Slice-9 attrs", "Slice", {"x": x3}, 9, starts=[1, -3], ends=[1000, -1], axes=[0, 2])
    yield case("Slice-9 no axes", "Slice", {"x": x3}, 9, starts=[0, 1], ends=[1, 3])
    sl = {"x": x3, "s": i64(-1, 2**62), "e": i64(-(2**62), 0), "a": i64(1, 2), "st": i64(-1, -2)}
    yield case("Slice-13 negative steps", "Slice", sl, 13)
    yield case("Squeeze-11 attr", "Squeeze", {"x": x3[:1]}, 11, axes=[0])
    yield case("Squeeze-13 all", "Squeeze", {"x": x3[:1, :, :1]}, 13)
    yield case("Unsqueeze-11 attr", "Unsqueeze", {"x": x3}, 11, axes=[0, -1])
    yield case("Shape-13", "Shape", {"x": x4}, 13, out_dtypes=[np.int64])
    yield case("Shape-15 start/end", "Shape", {"x": x4}, 15, out_dtypes=[np.int64], start=1, end=-1)
    yield case("Flatten-11 axis -1", "Flatten", {"x": x4}, 11, axis=-1)
    yield case("Flatten-9 axis 0", "Flatten", {"x": x4}, 9, axis=0)
    yield case("Dropout-7", "Dropout", {"x": x3}, 7, ratio=0.3)
    yield case("Dropout-10", "Dropout", {"x": x3}, 10)
    yield case("Dropout-13 mask", "Dropout", {"x": x3}, 13, outputs=2, out_dtypes=[np.float32, np.bool_])
    c = 3
    bn = {"x": x4, "s": f32(c), "b": f32(c), "m": f32(c), "v": np.abs(f32(c)) + 0.1}
    yield case("BatchNormalization-7", "BatchNormalization", bn, 7, epsilon=1e-3)
    yield case("BatchNormalization-9", "BatchNormalization", bn, 9)
    yield case("BatchNormalization-15", "BatchNormalization", bn, 15)
    yield case("ArgMax-11", "ArgMax", {"x": x3}, 11, out_dtypes=[np.int64], axis=-1, keepdims=0)
    ties = np.array([[1, 3, 3], [2, 2, 0]], np.float32)
    yield case("ArgMin-12 last", "ArgMin", {"x": ties}, 12, out_dtypes=[np.int64], axis=1, select_last_index=1)
    yield case("ArgMax-12 last", "ArgMax", {"x": ties}, 12, out_dtypes=[np.int64], axis=1, select_last_index=1)
    a, b, cc = f32(4, 3), f32(5, 4), f32(5)
    yield case("Gemm-7", "Gemm", {"a": a, "b": b, "c": cc}, 7, alpha=0.5, beta=2.0, transA=1, transB=1)
    yield case("Gemm-11 no C", "Gemm", {"a": a, "b": b}, 11, transA=1, transB=1)
    base, expo = np.abs(f32(3, 4)) + 0.5, i64(2, -1, 3, 0)
    yield case("Pow-12 int exponent", "Pow", {"a": base, "e": expo}, 12)
    ib, fe = np.array([2, 3, -4], np.int32), np.array([2.0, 0.5, 2.0], np.float32)
    yield case("Pow-12 int base", "Pow", {"a": ib, "e": fe}, 12)
    yield case("Cast-6 to int32", "Cast", {"x": x3 * 3}, 6, out_dtypes=[np.int32], to=TensorProto.INT32)
    yield case("Cast-13 to float16", "Cast", {"x": x3}, 13, out_dtypes=[np.float16], to=TensorProto.FLOAT16)
    r = {"s": np.array(1.5, np.float32), "l": np.array(-2.0, np.float32), "d": np.array(-0.25, np.float32)}
    yield case("Range-11 float", "Range", r, 11)
    ri = {"s": np.array(10, np.int64), "l": np.array(-3, np.int64), "d": np.array(-4, np.int64)}
    yield case("Range-11 int", "Range", ri, 11)
    e2 = {"a": f32(2, 3, 4), "b": f32(2, 4, 5)}
    yield case("Einsum-12", "Einsum", e2, 12, equation="bij, bjk -> bik")
    for approx in ["none", "tanh"]:
        xg = f32(50, scale=4)
        yield case(f"Gelu-20 {approx}", "Gelu", {"x": xg}, 20, approximate=approx)
    for name, opset in [("Mish", 18), ("HardSwish", 14), ("Celu", 12), ("ThresholdedRelu", 10), ("Selu", 7),
                        ("Elu", 7), ("HardSigmoid", 7), ("LeakyRelu", 7), ("Softsign", 7), ("Softplus", 7)]:
        xa = f32(64, scale=4)
        yield case(f"{name}-{opset}", name, {"x": xa}, opset)
    ln = {"x": x4, "s": f32(4, 5), "b": f32(4, 5)}
    ln_out = [np.float32] * 3
    yield case("LayerNormalization-17", "LayerNormalization", ln, 17, outputs=3, out_dtypes=ln_out, axis=2)
    yield case("Tile-6", "Tile", {"x": x3, "r": i64(1, 2, 3)}, 6)
    yield case("Expand-8", "Expand", {"x": x3[:, :1], "s": i64(3, 1, 1, 4)}, 8)
    for name in ["Min", "Max", "Sum", "Mean"]:
        mm = {"a": f32(3, 1), "b": f32(1, 4), "c": f32(4)}
        yield case(f"{name}-8 broadcast", name, mm, 8)
    g = {"x": x3, "i": i64(-1, 0, 1, -3).reshape(2, 2)}
    yield case("Gather-11 negative", "Gather", g, 11, axis=1)


@pytest.mark.parametrize("model,feeds", list(old_version_cases()))
def test_op_versions_match_onnxruntime(model, feeds):
    assert_same(*both(model, feeds))


@pytest.mark.parametrize("opset,mask_dtype", [(7, np.float32), (10, np.bool_), (12, np.bool_), (22, np.bool_)])
def test_dropout_inference_is_identity_with_a_mask_of_ones(opset, mask_dtype):
    """onnxruntime zero-fills the Dropout-7/10 inference mask; the spec's mask marks kept elements."""
    x = f32(3, 4)
    model = node_model("Dropout", {"x": x}, opset, outputs=2, out_dtypes=[np.float32, mask_dtype])
    y, mask = run(model, {"x": x})
    np.testing.assert_array_equal(y, x)
    assert mask.dtype == mask_dtype and mask.shape == x.shape and np.all(mask == 1)


def test_dropout_training_mode_is_seeded_and_scaled():
    x, ratio, train = np.ones((50, 40), np.float32), np.array(0.25, np.float32), np.array(True)
    feeds = {"x": x, "r": ratio, "t": train}
    model = node_model("Dropout", feeds, 13, outputs=2, out_dtypes=[np.float32, np.bool_], seed=3)
    y, mask = run(model, feeds)
    np.testing.assert_array_equal(y, np.where(mask, np.float32(1 / 0.75), 0))
    assert 0.2 < 1 - mask.mean() < 0.3
    np.testing.assert_array_equal(run(model, feeds)[1], mask)


@given(
    shape=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    axis=st.integers(-4, 3),
    opset=st.sampled_from([11, 13]),
    op_type=st.sampled_from(["Softmax", "LogSoftmax", "Hardmax"]),
)
@settings(max_examples=40, deadline=None)
def test_softmax_family_random_shapes(shape, axis, opset, op_type):
    axis = axis % len(shape) - (len(shape) if axis < 0 else 0)
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    with np.errstate(all="raise"):
        assert_same(*both(node_model(op_type, {"x": x}, opset, axis=axis), {"x": x}))


# --- dtypes --------------------------------------------------------------------------------------

UNARY_FLOAT_OPS = [
    ("Abs", {}), ("Neg", {}), ("Exp", {}), ("Sqrt", {}), ("Log", {}), ("Reciprocal", {}), ("Sign", {}),
    ("Floor", {}), ("Ceil", {}), ("Round", {}), ("Relu", {}), ("LeakyRelu", {"alpha": 0.1}),
    ("Elu", {"alpha": 0.7}), ("Selu", {}), ("Celu", {"alpha": 2.0}), ("ThresholdedRelu", {"alpha": 0.3}),
    ("Sigmoid", {}), ("HardSigmoid", {}), ("HardSwish", {}), ("Tanh", {}), ("Softplus", {}),
    ("Softsign", {}), ("Mish", {}), ("Gelu", {}), ("Gelu", {"approximate": "tanh"}), ("Erf", {}),
    ("Softmax", {}), ("LogSoftmax", {}), ("Hardmax", {}), ("Identity", {}), ("Dropout", {}),
    ("ReduceSum", {}), ("ReduceMean", {}), ("ReduceMax", {}), ("ReduceMin", {}), ("ReduceProd", {}),
    ("ReduceL2", {}), ("ReduceLogSumExp", {}), ("Transpose", {}), ("Flatten", {}),
]


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
@pytest.mark.parametrize("op_type,attrs", UNARY_FLOAT_OPS, ids=lambda v: v if isinstance(v, str) else "")
def test_unary_float_ops_keep_dtype(op_type, attrs, dtype):
    """float64 and float16 stay themselves; float64 results have float64 precision: onnxruntime's
    double kernels agree to 1e-12 where they exist and are exact (its tanh-Gelu computes in float
    precision: test_gelu_float64_precision checks ours against the formula)."""
    x = f32(3, 8)
    if op_type in ("Log", "Sqrt"):
        x = np.abs(x) + 0.25
    elif op_type == "ReduceProd":  # a product of 24 normals underflows float16
        x = 1 + x / 8
    x = narrow(x, dtype)
    model = node_model(op_type, {"x": x}, 22, **attrs)
    ours = run(model, {"x": x})[0]
    assert ours.dtype == dtype
    ref32 = run(node_model(op_type, {"x": x.astype(np.float32)}, 22, **attrs), {"x": x.astype(np.float32)})[0]
    close(ours.astype(np.float32), ref32, rtol=2e-3, atol=2e-3)
    if dtype == np.float64 and op_type != "Gelu":
        try:
            theirs = run(model, {"x": x}, backend="onnxruntime")[0]
        except pp.BadModelError:
            return  # onnxruntime has no double kernel for this op
        close(ours, theirs, rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_parametrized_ops_keep_dtype(dtype):
    """Every multi-input float op keeps float64 / float16."""
    def away(a):  # magnitudes from 0.5: no product or difference of them underflows float16 (whatever the draw)
        return narrow(np.copysign(np.abs(a) + 0.5, a), dtype)

    x, w = away(f32(4, 3)), away(f32(3, 5))
    c3 = away(f32(3))
    cases = [
        ("Gemm", {"a": x, "b": w, "c": away(f32(5))}, {"alpha": 0.3, "beta": 0.7}),
        ("MatMul", {"a": x, "b": w}, {}),
        ("Einsum", {"a": x, "b": w}, {"equation": "ij,jk->ik"}),
        ("PRelu", {"x": x, "s": c3}, {}),
        ("Add", {"a": x, "b": c3}, {}), ("Sub", {"a": x, "b": c3}, {}), ("Mul", {"a": x, "b": c3}, {}),
        ("Div", {"a": x, "b": c3 + 3}, {}), ("Pow", {"a": np.abs(x), "b": c3}, {}),
        ("Min", {"a": x, "b": c3}, {}), ("Max", {"a": x, "b": c3}, {}),
        ("Sum", {"a": x, "b": c3}, {}), ("Mean", {"a": x, "b": c3}, {}),
        ("Clip", {"x": x, "lo": np.array(-0.5, dtype), "hi": np.array(0.5, dtype)}, {}),
        ("LayerNormalization", {"x": x, "s": c3, "b": c3}, {}),
        ("BatchNormalization", {"x": x, "s": c3, "b": c3, "m": c3, "v": np.abs(c3) + 1}, {}),
        ("Where", {"c": x > 0, "a": x, "b": -x}, {}),
    ]
    for op_type, feeds, attrs in cases:
        y = run(node_model(op_type, feeds, 22, out_dtypes=[dtype], **attrs), feeds)[0]
        assert y.dtype == dtype, op_type


def test_gelu_float64_precision():
    x = np.linspace(-10, 10, 2001)
    y = run(node_model("Gelu", {"x": x}, 20), {"x": x})[0]
    # erfc(y) amplifies the rounding of y = -x/sqrt(2) by 2y^2 (100 at x = -10)
    close(y, [0.5 * v * math.erfc(-v / math.sqrt(2)) for v in x], rtol=5e-14, atol=0)
    y = run(node_model("Gelu", {"x": x}, 20, approximate="tanh"), {"x": x})[0]
    # x/2 (1 + tanh(u)) = x / (1 + exp(-2u)), without the cancellation for negative x
    exact = [v / (1 + math.exp(-2 * math.sqrt(2 / math.pi) * (v + 0.044715 * v**3))) for v in x]
    close(y, exact, rtol=1e-13, atol=0)


def test_float32_attributes_do_not_upcast():
    """Python-float attributes keep float32 under NEP 50 (a np.float64 scalar would upcast)."""
    x = f32(2, 5)
    for op_type, attrs in [("LeakyRelu", {"alpha": 0.2}), ("Elu", {"alpha": 0.5}), ("Selu", {}),
                           ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}), ("Gelu", {"approximate": "tanh"}),
                           ("Celu", {"alpha": 1.5}), ("ThresholdedRelu", {"alpha": 0.1})]:
        assert run(node_model(op_type, {"x": x}, 22, **attrs), {"x": x})[0].dtype == np.float32, op_type
    ab = {"a": x, "b": f32(5, 3), "c": f32(3)}
    y = run(node_model("Gemm", ab, 13, alpha=0.1, beta=0.2), ab)[0]
    assert y.dtype == np.float32


def test_integer_div_truncates_toward_zero():
    a = np.array([7, -7, 7, -7, 0, 2**62 + 1, -(2**62) - 1], np.int64)
    b = np.array([2, 2, -2, -2, 3, 3, 3], np.int64)
    y = run(node_model("Div", {"a": a, "b": b}, 14), {"a": a, "b": b})[0]
    np.testing.assert_array_equal(y, [3, -3, -3, 3, 0, (2**62 + 1) // 3, -((2**62 + 1) // 3)])
    assert y.dtype == np.int64
    a8, b8 = np.array([-128, 127, -5], np.int8), np.array([3, -2, 4], np.int8)
    assert_same(*both(node_model("Div", {"a": a8, "b": b8}, 14), {"a": a8, "b": b8}), atol=0)


def test_round_half_to_even_and_pow_keeps_base_type():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 2.4999998, np.inf, -0.0], np.float32)
    y = run(node_model("Round", {"x": x}, 11), {"x": x})[0]
    np.testing.assert_array_equal(y, [0, 2, 2, -0.0, -2, -2, 2, np.inf, -0.0])
    base, e = np.array([2.0, 3.0], np.float32), np.array([3, 2], np.int64)
    y = run(node_model("Pow", {"a": base, "e": e}, 15), {"a": base, "e": e})[0]
    assert y.dtype == np.float32 and y.tolist() == [8.0, 9.0]
    base, e = np.array([2, 9], np.int64), np.array([0.5, 0.5], np.float32)
    y = run(node_model("Pow", {"a": base, "e": e}, 15), {"a": base, "e": e})[0]
    assert y.dtype == np.int64 and y.tolist() == [1, 3]


# --- numerics ------------------------------------------------------------------------------------

EXTREME = np.array([-1000.0, -100.0, -30.0, -1e-30, 0.0, 1e-30, 30.0, 100.0, 1000.0], np.float32)


@pytest.mark.parametrize("op_type,expected", [
    ("Sigmoid", lambda x: 1 / (1 + np.exp(-x))),
    ("Softplus", lambda x: np.logaddexp(0, x)),
    ("Mish", lambda x: x * np.tanh(np.logaddexp(0, x))),
    ("Gelu", lambda x: np.array([0.5 * v * math.erfc(-v / math.sqrt(2)) for v in x])),
    ("Tanh", np.tanh), ("Elu", lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0)))),
    ("Erf", lambda x: np.array([math.erf(v) for v in x])),
])
def test_extreme_inputs_are_finite_and_exact(op_type, expected):
    y = run(node_model(op_type, {"x": EXTREME}, 20), {"x": EXTREME})[0]
    with np.errstate(all="ignore"):
        want = expected(EXTREME.astype(np.float64)).astype(np.float32)
    # subnormal results (Mish(-100) = -3.7e-42) carry only a few significant bits
    close(y, want, rtol=1e-6, atol=np.finfo(np.float32).tiny)


def test_sigmoid_tails():
    x = np.array([-1000, -88, -50, 50, 1000], np.float64)
    y = run(node_model("Sigmoid", {"x": x}, 13), {"x": x})[0]
    close(y, [0, math.exp(-88), math.exp(-50), 1, 1], rtol=1e-14)


def test_softmax_and_log_softmax_large_spread():
    x = np.array([[-1e4, 0.0, 1e4], [1e30, 1e30, -1e30], [5.0, 5.0, 5.0]], np.float32)
    y = run(node_model("Softmax", {"x": x}, 13), {"x": x})[0]
    close(y, [[0, 0, 1], [0.5, 0.5, 0], [1 / 3, 1 / 3, 1 / 3]], rtol=1e-6)
    ly = run(node_model("LogSoftmax", {"x": x}, 13), {"x": x})[0]
    close(ly, [[-2e4, -1e4, 0], [-math.log(2), -math.log(2), -2e30], [-math.log(3)] * 3],
                               rtol=1e-6)


def test_reduce_log_sum_exp_large_and_empty():
    x = np.array([[1000.0, 1000.0], [-1000.0, -1000.0]], np.float32)
    axes = i64(1)
    y = run(node_model("ReduceLogSumExp", {"x": x, "axes": axes}, 18, keepdims=0), {"x": x, "axes": axes})[0]
    close(y, [1000 + math.log(2), -1000 + math.log(2)], rtol=1e-6)
    empty = np.zeros((2, 0), np.float32)
    y = run(node_model("ReduceLogSumExp", {"x": empty, "axes": axes}, 18), {"x": empty, "axes": axes})[0]
    np.testing.assert_array_equal(y, np.full((2, 1), -np.inf, np.float32))
    identities = [("ReduceMax", -np.inf), ("ReduceMin", np.inf), ("ReduceSum", 0), ("ReduceProd", 1)]
    for name, identity in identities:
        y = run(node_model(name, {"x": empty, "axes": axes}, 18), {"x": empty, "axes": axes})[0]
        np.testing.assert_array_equal(y, np.full((2, 1), identity, np.float32), err_msg=name)
    # integers: the type's own extremes
    for dtype in (np.int32, np.int64, np.uint8):
        empty = np.zeros((2, 0), dtype)
        for name, identity in [("ReduceMax", np.iinfo(dtype).min), ("ReduceMin", np.iinfo(dtype).max)]:
            y = run(node_model(name, {"x": empty, "axes": axes}, 18), {"x": empty, "axes": axes})[0]
            assert y.dtype == dtype, name
            np.testing.assert_array_equal(y, np.full((2, 1), identity, dtype), err_msg=f"{name} {dtype.__name__}")


def test_erf_against_math_erf_dense_grid():
    x = np.concatenate([np.linspace(-7, 7, 280_001), np.geomspace(1e-300, 30, 20_000),
                        -np.geomspace(1e-300, 30, 20_000), np.linspace(-30, 30, 6001)])
    want = np.array([math.erf(v) for v in x])
    got = erf(x)
    assert got.dtype == np.float64
    rel = np.abs(got - want) / np.maximum(np.abs(want), np.finfo(np.float64).tiny)
    assert rel.max() < 1e-14, (rel.max(), x[rel.argmax()])
    wantc = np.array([math.erfc(v) for v in x])
    ok = wantc > 1e-300
    relc = np.abs(erfc(x) - wantc)[ok] / wantc[ok]
    assert relc.max() < 1e-14, (relc.max(), x[ok][relc.argmax()])


def test_erf_float32_within_one_ulp():
    with np.errstate(under="ignore"):  # subnormal inputs and their reference values
        x = np.concatenate([np.linspace(-5, 5, 200_001), np.geomspace(1e-44, 10, 20_000)]).astype(np.float32)
        want = np.array([math.erf(float(v)) for v in x]).astype(np.float32)
    got = erf(x)
    assert got.dtype == np.float32
    ulps = np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32).astype(np.int64))
    assert ulps.max() <= 1


def test_erf_edge_values():
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, -5e-324, 1e-300, 6.0, 1e300, -1e300])
    y = erf(x)
    np.testing.assert_array_equal(y[[0, 2, 3, 8, 9, 10]], [0, 1, -1, 1, 1, -1])
    assert math.copysign(1, y[1]) == -1 and np.isnan(y[4])
    assert y[5] == 5e-324 and y[6] == -5e-324  # 2/sqrt(pi) * the smallest subnormal rounds to it
    close(y[7], 1e-300 * 2 / math.sqrt(math.pi), rtol=1e-15)
    yc = erfc(np.array([np.inf, -np.inf, 28.0, -28.0, 27.0, np.nan]))
    np.testing.assert_array_equal(yc[:4], [0, 2, 0, 2])
    assert yc[4] == math.erfc(27.0) > 0 and np.isnan(yc[5])  # 5.2e-319: still a subnormal
    np.testing.assert_array_equal(erf(np.zeros((2, 0, 3), np.float16)).shape, (2, 0, 3))


# --- ml_dtypes element types: Cast and CastLike -------------------------------------------------
#
# Expected values are written out from the Cast operator page's tables (round to nearest even,
# saturate), not computed with ml_dtypes, so a conversion that rounds or saturates wrongly shows.

NAN, INF = float("nan"), float("inf")


def ml(name):
    return np.dtype(getattr(ml_dtypes, name))


def cast_model(x, to, opset, op_type="Cast", **attrs):
    """``y = Cast(x, to=to)``, or ``CastLike(x, t)`` with a graph input ``t`` of element type ``to``."""
    inputs = [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)]
    if op_type == "CastLike":
        inputs.append(helper.make_tensor_value_info("t", to, [1]))
        node = helper.make_node("CastLike", ["x", "t"], ["y"], name="n0", **attrs)
    else:
        node = helper.make_node("Cast", ["x"], ["y"], name="n0", to=to, **attrs)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", to, x.shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=11)


def cast(x, to, opset=25, op_type="Cast", **attrs):
    feeds = {"x": x}
    if op_type == "CastLike":
        feeds["t"] = np.zeros(1, onnx_dtype(to))
    (y,) = run(cast_model(x, to, opset, op_type, **attrs), feeds)
    assert y.dtype == onnx_dtype(to) and y.shape == x.shape
    return y


def assert_values(got, want):
    """Equal as float64, NaN equal to any NaN, and the sign of every zero the same."""
    got, want = got.astype(np.float64), np.asarray(want, np.float64)
    np.testing.assert_array_equal(got, want)
    number = ~np.isnan(want)
    assert np.array_equal(np.signbit(got[number]), np.signbit(want[number])), (got, want)


#: Inputs and what they become with saturate=1 and with saturate=0. 1.0625 and 1.1875 are ties
#: (round to even: 1 and 1.25); 464 ties between e4m3fn's 448 and 480 (480 would be NaN);
#: 61440 ties between e5m2's 57344 and 65536 (out of range).
F8_INPUT = [1e6, -1e6, INF, -INF, NAN, 464, 470, 1.0625, 1.1875, -0.0, 61440, 60000]
F8_CASES = {
    TensorProto.FLOAT8E4M3FN: (
        [448, -448, 448, -448, NAN, 448, 448, 1, 1.25, -0.0, 448, 448],
        [NAN, NAN, NAN, NAN, NAN, 448, NAN, 1, 1.25, -0.0, NAN, NAN],
    ),
    TensorProto.FLOAT8E4M3FNUZ: (  # no -0: it is the NaN encoding
        [240, -240, 240, -240, NAN, 240, 240, 1, 1.25, 0.0, 240, 240],
        [NAN, NAN, NAN, NAN, NAN, NAN, NAN, 1, 1.25, 0.0, NAN, NAN],
    ),
    TensorProto.FLOAT8E5M2: (
        [57344, -57344, 57344, -57344, NAN, 448, 448, 1, 1.25, -0.0, 57344, 57344],
        [INF, -INF, INF, -INF, NAN, 448, 448, 1, 1.25, -0.0, INF, 57344],
    ),
    TensorProto.FLOAT8E5M2FNUZ: (
        [57344, -57344, 57344, -57344, NAN, 448, 448, 1, 1.25, 0.0, 57344, 57344],
        [NAN, NAN, NAN, NAN, NAN, 448, 448, 1, 1.25, 0.0, NAN, 57344],
    ),
}


@pytest.mark.parametrize("op_type", ["Cast", "CastLike"])
@pytest.mark.parametrize("to", list(F8_CASES))
def test_cast_to_float8_saturates_and_rounds_to_nearest_even(to, op_type):
    saturated, unsaturated = F8_CASES[to]
    for dtype in (np.float32, np.float64):
        x = np.array(F8_INPUT, dtype)
        assert_values(cast(x, to, 19, op_type), saturated)  # saturate=1 is the default
        assert_values(cast(x, to, 19, op_type, saturate=1), saturated)
        assert_values(cast(x, to, 21, op_type, saturate=0), unsaturated)


def test_cast_from_float64_and_int64_rounds_once():
    """ml_dtypes goes through float32 and rounds twice; the cast must round x itself to nearest."""
    nudge = 2.0**-40  # lost in float32, decisive for the final rounding
    x = np.array([1 + 2**-4 + nudge, -(1 + 2**-4 + nudge), 1 + 2**-4, 1.1875 - nudge, 1e300, -1e300])
    assert_values(cast(x, TensorProto.FLOAT8E4M3FN), [1.125, -1.125, 1, 1.125, 448, -448])
    assert_values(cast(x, TensorProto.FLOAT8E4M3FN, saturate=0), [1.125, -1.125, 1, 1.125, NAN, NAN])
    xb = np.array([1 + 2**-8 + nudge, 1 + 2**-8, 1 + 3 * 2**-8 - nudge, 1e300, 5e-324])
    assert_values(cast(xb, TensorProto.BFLOAT16), [1 + 2**-7, 1, 1 + 2**-7, INF, 0])
    big = 2**24 + 2**16 + 1  # just above the tie between 2**24 and 2**24 + 2**17
    for dtype in (np.int64, np.int32):
        assert_values(cast(np.array([big, -big, 7], dtype), TensorProto.BFLOAT16), [2**24 + 2**17, -(2**24 + 2**17), 7])
    assert_values(cast(np.array([1000, -1000, 3], np.int64), TensorProto.FLOAT8E4M3FN), [448, -448, 3])


def test_cast_between_ml_dtypes_types_and_back():
    x = np.array([0.1, -3.3, 300.0, NAN], np.float32)
    b = cast(x, TensorProto.BFLOAT16)
    assert_values(b, [0.10009765625, -3.296875, 300, NAN])
    assert_values(cast(b, TensorProto.FLOAT8E4M3FN), [0.1015625, -3.25, 288, NAN])
    assert_values(cast(b, TensorProto.FLOAT), [0.10009765625, -3.296875, 300, NAN])
    assert cast(b[:3], TensorProto.STRING).tolist() == ["0.100097656", "-3.296875", "300.0"]
    np.testing.assert_array_equal(cast(b[:3], TensorProto.BOOL), [True, True, True])


#: x, then its float8e8m0 code (the value is 2**(code - 127); 255 is NaN) for each mode.
E8M0_INPUT = [0.124, 0.25, 0.375, 1.25, 1.5, 3.0, 0.0, 2.0**-130, INF, NAN, 1.5 * 2.0**127, 2.0**127]
E8M0_CASES = [
    (1, "up", [124, 125, 126, 128, 128, 129, 0, 0, 254, 255, 254, 254]),
    (1, "down", [123, 125, 125, 127, 127, 128, 0, 0, 254, 255, 254, 254]),
    (1, "nearest", [124, 125, 126, 127, 128, 129, 0, 0, 254, 255, 254, 254]),
    (0, "up", [124, 125, 126, 128, 128, 129, 255, 255, 255, 255, 255, 254]),
    (0, "nearest", [124, 125, 126, 127, 128, 129, 255, 255, 255, 255, 255, 254]),
]


@pytest.mark.parametrize("saturate,round_mode,codes", E8M0_CASES)
def test_cast_to_float8e8m0_round_modes(saturate, round_mode, codes):
    """Cast-24 ``round_mode`` and the saturation table of the operator page (the ONNX reference's
    to_float8e8m0 gives NaN for Inf under saturate and misreads float32 subnormals)."""
    for dtype in (np.float32, np.float64):
        y = cast(np.array(E8M0_INPUT, dtype), TensorProto.FLOAT8E8M0, 24, saturate=saturate, round_mode=round_mode)
        assert y.view(np.uint8).tolist() == codes, dtype
    y = cast(np.array([0.375, 3.0], np.float16), TensorProto.FLOAT8E8M0, round_mode=round_mode)
    assert y.view(np.uint8).tolist() == [codes[2], codes[5]]


def test_cast_to_float8e8m0_matches_onnxruntime():
    with np.errstate(under="ignore"):  # float32 subnormals wanted
        tiny = np.array([1e-45, 2.0**-127, 3 * 2.0**-127], np.float32)
        spread = np.exp2(RNG.uniform(-140, 127.9, 500)).astype(np.float32)
    x = np.concatenate([np.array(E8M0_INPUT + [-2.0, -0.0], np.float32), tiny, spread])
    for saturate, round_mode in [(s, r) for s in (0, 1) for r in ("up", "down", "nearest")]:
        to_e8m0 = dict(to=TensorProto.FLOAT8E8M0, saturate=saturate, round_mode=round_mode)
        nodes = [helper.make_node("Cast", ["x"], ["e"], **to_e8m0),
                 helper.make_node("Cast", ["e"], ["y"], to=TensorProto.FLOAT)]
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, x.shape)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)], ir_version=11)
        ours, theirs = both(model, {"x": x})
        np.testing.assert_array_equal(ours[0], theirs[0], err_msg=f"saturate={saturate} round_mode={round_mode}")


#: Casts to the 2- and 4-bit integer types and policyport's values for them: (source array, ONNX type,
#: expected). Integers out of range keep their low bits (the Cast page's rule for fixed point); floats,
#: whose out-of-range casts the page leaves undefined, truncate toward zero and then do the same, exactly
#: however large; NaN and +-Inf give 0. ml_dtypes 0.5 and 0.7 disagree on the floats out of range (0.7
#: gives 0), so these are computed without it and the same under both (see the next two tests).
SMALL_INTEGER_CASTS = [
    (np.array([-9, -8.7, -2.5, 2.5, 7.6, 15, -0.5, -8, 7, 16.5, -17.2], np.float32), TensorProto.INT4,
     [7, -8, -2, 2, 7, -1, 0, -8, 7, 0, -1]),
    (np.array([-1, 16, 17.9, 3.99, -16.5, 255, 0.99], np.float32), TensorProto.UINT4, [15, 0, 1, 3, 0, 15, 0]),
    (np.array([np.nan, np.inf, -np.inf, -0.0, 3e9, -3e9, 2.0**40 + 5, 1e30], np.float32), TensorProto.INT4,
     [0, 0, 0, 0, 0, 0, 0, 0]),
    (np.array([2.0**62 + 2.0**10 + 13, -(2.0**52) - 3, 1e300, np.nan, 9.75], np.float64), TensorProto.INT4,
     [0, -3, 0, 0, -7]),
    (np.array([-9, 15, 6.5, 65504, -np.inf], np.float16), TensorProto.INT4, [7, -1, 6, 0, 0]),
    (np.array([-3, -2.5, 2, 3, 5.9, -5], np.float32), TensorProto.INT2, [1, -2, -2, -1, 1, -1]),
    (np.array([-3, -2.5, 2, 3, 5.9, -5], np.float32), TensorProto.UINT2, [1, 2, 2, 3, 1, 3]),
    (np.array([8, -9, 200, -128, 5], np.int32), TensorProto.INT4, [-8, 7, -8, 0, 5]),
    (np.array([8, -9, 200, -128, 5], np.int32), TensorProto.INT2, [0, -1, 0, 0, 1]),
    (np.array([8, -9, 200, -128, 5], np.int32), TensorProto.UINT2, [0, 3, 0, 0, 1]),
    (np.array([2**64 - 1, 2**63 + 9, 17], np.uint64), TensorProto.INT4, [-1, -7, 1]),
    (np.array([True, False], np.bool_), TensorProto.UINT4, [1, 0]),
    (np.array(["3", "-2.7", "9", "-0.5", "NaN", "-INF", "1e3"], dtype=object), TensorProto.INT4, [3, -2, -7, 0, 0, 0, -8]),
]


@pytest.mark.parametrize("x, to, expected", SMALL_INTEGER_CASTS,
                         ids=[f"{x.dtype.name}-{TensorProto.DataType.Name(t)}-{i}" for i, (x, t, _) in enumerate(SMALL_INTEGER_CASTS)])
def test_cast_to_4_and_2_bit_integers_truncates_then_wraps(x, to, expected):
    """Like any fixed-point cast out of range, int4/uint4/int2/uint2 keep the low bits; never a
    floating-point error (this module runs every test under ``np.errstate(all="raise")``)."""
    got = cast(x, to)
    assert got.astype(np.int64).tolist() == expected
    if x.dtype != object:  # CastLike takes the same path
        assert cast(x, to, op_type="CastLike").astype(np.int64).tolist() == expected


def test_cast_to_4_and_2_bit_integers_agrees_with_ml_dtypes_in_range():
    """In range, the values are the ones ml_dtypes itself gives (the arrays hold its types)."""
    x = np.arange(-8, 8, dtype=np.float32) + np.float32(0.25)
    assert cast(x, TensorProto.INT4).tolist() == np.trunc(x).astype(np.int8).astype(ml("int4")).tolist()


_OTHER_ML_DTYPES = sorted(Path(sys.prefix).glob("ml_dtypes-*"))


@pytest.mark.skipif(not _OTHER_ML_DTYPES, reason="scripts/setup.sh test installs the ml_dtypes releases into .venv")
@pytest.mark.parametrize("folder", _OTHER_ML_DTYPES, ids=lambda p: p.name)
def test_small_integer_casts_are_the_same_under_each_ml_dtypes_release(folder):
    """The casts above, run in a fresh interpreter that imports ml_dtypes from ``folder`` (0.5.x
    and 0.7.x, installed by scripts/setup.sh): the same values, no warning, no error."""
    import subprocess

    script = (
        "import pickle, sys, warnings\n"
        "import numpy as np, ml_dtypes\n"
        "warnings.simplefilter('error')\n"
        "from onnx import TensorProto, helper\n"
        "import policyport as pp\n"
        "cases = pickle.loads(sys.stdin.buffer.read())\n"
        "out = [ml_dtypes.__version__, ml_dtypes.__file__]\n"
        "for x, to, _ in cases:\n"
        "    elem = TensorProto.STRING if x.dtype == object else helper.np_dtype_to_tensor_dtype(x.dtype)\n"
        "    g = helper.make_graph([helper.make_node('Cast', ['x'], ['y'], to=to)], 'g',\n"
        "                          [helper.make_tensor_value_info('x', elem, x.shape)],\n"
        "                          [helper.make_tensor_value_info('y', to, x.shape)])\n"
        "    m = helper.make_model(g, opset_imports=[helper.make_opsetid('', 21)], ir_version=10)\n"
        "    with np.errstate(all='raise'):\n"
        "        out.append(pp.load(m, backend='numpy').run({'x': x})['y'].astype(np.int64).tolist())\n"
        "sys.stdout.buffer.write(pickle.dumps(out))\n"
    )
    import os
    import pickle

    env = {**os.environ, "PYTHONPATH": str(folder)}
    done = subprocess.run([sys.executable, "-c", script], input=pickle.dumps(SMALL_INTEGER_CASTS),
                          capture_output=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    version, location, *values = pickle.loads(done.stdout)
    assert location.startswith(str(folder)) and version.startswith(folder.name.split("-")[1])
    assert values == [expected for _, _, expected in SMALL_INTEGER_CASTS]


def test_packed_int4_initializer_unpacks_for_an_odd_count():
    values = [-8, 7, -1, 0, 3]  # 5 nibbles: the last byte is half padding
    w = helper.make_tensor("w", TensorProto.INT4, [5], values)
    node = helper.make_node("Cast", ["w"], ["y"], to=TensorProto.INT8)
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.INT8, [5])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    assert from_onnx(model).initializers["w"].dtype == ml("int4")
    (y,) = run(model, {})
    assert y.dtype == np.int8 and y.tolist() == values


def test_ml_dtypes_graph_json_round_trip(tmp_path):
    """bfloat16 inputs, int4 tensor attributes and float8 initializers survive to_json/from_json,
    the initializers also an .npz, which stores them as raw bytes (|V1, |V2)."""
    w = onnx.numpy_helper.from_array(np.array([1.5, -448, NAN], ml("float8_e4m3fn")), "w")
    const = onnx.numpy_helper.from_array(np.array([3, -8, 7], ml("int4")), "c")
    nodes = [helper.make_node("Constant", [], ["c"], value=const),
             helper.make_node("CastLike", ["c", "x"], ["cx"]), helper.make_node("CastLike", ["w", "x"], ["wx"]),
             helper.make_node("Add", ["x", "cx"], ["s"]), helper.make_node("Add", ["s", "wx"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [3])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    g = from_onnx(model)
    np.savez(tmp_path / "w.npz", **g.initializers)
    with np.load(tmp_path / "w.npz") as f:
        stored = {k: f[k] for k in f.files}
    assert stored["w"].dtype.kind == "V"  # numpy alone does not know float8
    back = Graph.from_json(g.to_json(), stored)
    assert back.inputs[0].dtype == ml("bfloat16") and back.initializers["w"].dtype == ml("float8_e4m3fn")
    assert back.nodes[0].attrs["value"].dtype == ml("int4")
    assert back.nodes[0].attrs["value"].tolist() == [3, -8, 7]
    x = np.array([1, 2, 3], ml("bfloat16"))
    (y,) = run(model, {"x": x})
    assert y.dtype == ml("bfloat16")
    assert_values(y, [5.5, -454, NAN])
    assert_values(pp.load(back, backend="numpy").run({"x": x})["y"], [5.5, -454, NAN])


def test_without_ml_dtypes_its_types_are_refused(monkeypatch):
    model = cast_model(np.zeros(3, np.float32), TensorProto.BFLOAT16, 21)
    graph_json = from_onnx(model).to_json()
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # `import ml_dtypes` now raises ImportError
    with pytest.raises(pp.BadModelError, match=r"element type 16 \(bfloat16: install the ml_dtypes package"):
        pp.load(model, backend="numpy")
    with pytest.raises(pp.BadModelError, match="'bfloat16' needs the ml_dtypes package"):
        Graph.from_json(graph_json, {})
    with pytest.raises(pp.BadModelError, match="element type 99 has no numpy equivalent"):
        onnx_dtype(99)
    assert onnx_dtype(TensorProto.FLOAT) == np.float32
    x = f32(3)
    assert_same(run(node_model("Relu", {"x": x}, 14), {"x": x}), [np.maximum(x, 0)])


# --- the registry --------------------------------------------------------------------------------

def test_registering_a_duplicate_version_raises():
    with pytest.raises(ValueError, match="Gemm since opset 7 is registered twice"):
        op("Gemm", since=7)(lambda a, b: a)
    assert supported_ops()["Gemm"] == [7]


def test_unsupported_opset_names_node_opset_and_versions():
    x = f32(2, 3)
    with pytest.raises(pp.UnsupportedOpError) as e:
        pp.load(node_model("Gelu", {"x": x}, 18), backend="numpy")
    assert str(e.value) == (
        'Gelu node "n0" (opset 18; implemented from opset 20) is not supported by the numpy backend — re-export '
        'the model at opset 20 or newer, or load it with backend="onnxruntime" (policyport inspect lists the ops it has)')
    with pytest.raises(pp.UnsupportedOpError) as e:
        pp.load(node_model("Cos", {"x": x}, 13), backend="numpy")
    assert str(e.value) == (
        'Cos node "n0" (opset 13; no Cos at any opset) is not supported by the numpy backend — load it with '
        'backend="onnxruntime" (policyport inspect lists the ops it has)')

@pytest.mark.parametrize("equation, shapes", [
    ("ij,jk->ik", [(2, 3), (3, 4)]), ("ij,jk", [(2, 3), (3, 4)]), ("i,j->ij", [(3,), (5,)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 6)]), ("ii->i", [(3, 3)]), ("ij->", [(2, 3)]),
    ("bij,bjk", [(2, 3, 4), (2, 4, 5)]), ("i...,i...", [(2, 3), (2, 3)]), ("...", [(2, 3)]), ("ji", [(2, 3)]),
    ("i,i", [(1,), (4,)]), ("a,b,c->cba", [(2,), (3,), (4,)]),
])
def test_einsum_shape_is_numpys_output_shape(equation, shapes):
    from policyport.runtime.numpy.ops.linalg import einsum_shape

    arrays = [np.ones(s) for s in shapes]
    assert einsum_shape(equation, [a.shape for a in arrays]) == np.einsum(equation, *arrays).shape


@pytest.mark.parametrize("equation, shapes", [("ij,jk", [(2, 3)]), ("ij", [(2, 3, 4)]), ("ik->j", [(2, 3)])])
def test_einsum_shape_leaves_equations_that_do_not_fit_to_numpy(equation, shapes):
    from policyport.runtime.numpy.ops.linalg import einsum_shape

    assert einsum_shape(equation, shapes) is None
