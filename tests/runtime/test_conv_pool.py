"""Conv and pooling on the numpy backend against onnxruntime, over the attributes real encoders use.

onnxruntime refuses dilated Conv with SAME padding, and sizes SAME-padded dilated pooling windows
by the undilated kernel; those cases are checked against the ONNX reference evaluator (Conv) and the
operator page's output size (pooling).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import policyport as pp  # noqa: E402
from onnx_node import assert_same, both, f32, feed_dict, node_model, run  # noqa: E402

pytestmark = pytest.mark.usefixtures("strict_numpy")

PADDINGS = [{}, {"pads": [1, 0, 2, 1]}, {"auto_pad": "SAME_UPPER"}, {"auto_pad": "SAME_LOWER"}, {"auto_pad": "VALID"}]
POOL_PADDINGS = [{"pads": [1, 0, 1, 1]} if p.get("pads") else p for p in PADDINGS]  # pads below the kernel


def conv_cases():
    for group, kernel, strides, dilations, padding in itertools.product(
            [1, 2, 4], [(3, 3), (2, 3), (1, 1)], [None, [2, 1], [2, 3]], [None, [2, 1]], PADDINGS):
        attrs = {"group": group, **padding}
        if strides:
            attrs["strides"] = strides
        if dilations:
            attrs["dilations"] = dilations
        yield pytest.param(group, kernel, attrs, id=f"g{group}-k{kernel}-{attrs}")


@pytest.mark.parametrize("group, kernel, attrs", list(conv_cases()))
def test_conv_2d_matches_onnxruntime(group, kernel, attrs):
    x = f32(2, 4, 9, 8)
    out_channels = 8 if group == 4 else 6
    feeds = {"x": x, "w": f32(out_channels, 4 // group, *kernel), "b": f32(out_channels)}
    model = node_model("Conv", feeds, 11, **attrs)
    if "dilations" in attrs and attrs.get("auto_pad", "").startswith("SAME"):
        from onnx.reference import ReferenceEvaluator  # onnxruntime refuses dilation with SAME padding

        expected = ReferenceEvaluator(model).run(None, feeds)
        assert_same(run(model, feeds), expected, atol=1e-5)
    else:
        assert_same(*both(model, feeds), atol=1e-5)


@pytest.mark.parametrize("spatial, kernel", [((11,), (3,)), ((5, 6, 7), (2, 3, 2))], ids=["1d", "3d"])
@pytest.mark.parametrize("attrs", [{}, {"strides": 2}, {"pads": 1}, {"auto_pad": "SAME_UPPER", "strides": 2},
                                   {"dilations": 2}, {"group": 2}])
@pytest.mark.parametrize("opset", [1, 11, 22])
def test_conv_1d_and_3d_and_every_version(spatial, kernel, attrs, opset):
    n = len(spatial)
    attrs = {k: v if isinstance(v, str) or k == "group" else [v] * (2 * n if k == "pads" else n) for k, v in attrs.items()}
    feeds = {"x": f32(2, 4, *spatial), "w": f32(6, 4 // attrs.get("group", 1), *kernel)}
    assert_same(*both(node_model("Conv", feeds, opset, kernel_shape=list(kernel), **attrs), feeds), atol=1e-5)


def test_conv_then_tanh_in_place_keeps_the_recorded_conv_output():
    """The plan overwrites a fresh Conv result in place with a following Tanh on ``run``; ``record``
    must still return the Conv output itself."""
    from onnx import helper, numpy_helper

    w = f32(4, 3, 3, 3)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Tanh", ["c"], ["y"])], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 3, 6, 6])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 4, 6, 6])], [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = f32(2, 3, 6, 6)
    session = pp.load(model, backend="numpy")
    recorded = session.record({"x": x})
    np.testing.assert_array_equal(session.run({"x": x})["y"], recorded["y"])
    np.testing.assert_array_equal(np.tanh(recorded["c"]), recorded["y"])
    assert_same([recorded["c"]], [pp.load(model, backend="onnxruntime").record({"x": x})["c"]], atol=1e-5)


def test_conv_errors_name_the_node():
    feeds = {"x": f32(1, 3, 5, 5), "w": f32(4, 2, 3, 3)}
    with pytest.raises(pp.BadModelError, match=r'Conv node "n0" on the numpy backend failed: ValueError: X has 3 channels'):
        run(node_model("Conv", feeds, 11), feeds)
    small = {"x": f32(1, 2, 2, 2), "w": f32(4, 2, 3, 3)}
    with pytest.raises(pp.BadModelError, match=r"a window of \[3, 3\] does not fit the input \[2, 2\]"):
        run(node_model("Conv", small, 11), small)


def pool_cases():
    versions = [("MaxPool", 8), ("MaxPool", 10), ("MaxPool", 12), ("AveragePool", 7), ("AveragePool", 11),
                ("AveragePool", 19)]
    for (op_type, opset), kernel, strides, padding, ceil, count_pad, dilations in itertools.product(
            versions, [[2, 2], [3, 2]], [None, [2, 2], [2, 1]], POOL_PADDINGS, [0, 1], [0, 1], [None, [2, 1]]):
        dilated = op_type == "MaxPool" and opset >= 10 or opset >= 19
        if (dilations and not dilated) or (ceil and opset < 10) or (count_pad and op_type == "MaxPool"):
            continue
        if dilations and padding.get("auto_pad", "").startswith("SAME"):
            continue  # onnxruntime's sizes differ from the operator page's: see the test below
        attrs = {"kernel_shape": kernel, **padding}
        for name, value in (("strides", strides), ("ceil_mode", ceil), ("count_include_pad", count_pad),
                            ("dilations", dilations)):
            if value:
                attrs[name] = value
        yield pytest.param(op_type, opset, attrs, id=f"{op_type}{opset}-{attrs}")


@pytest.mark.parametrize("op_type, opset, attrs", list(pool_cases()))
def test_pooling_matches_onnxruntime(op_type, opset, attrs):
    x = f32(2, 3, 9, 8)
    outputs = 2 if op_type == "MaxPool" else 1
    model = node_model(op_type, {"x": x}, opset, outputs, out_dtypes=[np.float32, np.int64][:outputs], **attrs)
    assert_same(*both(model, {"x": x}), atol=1e-6)


@pytest.mark.parametrize("op_type, kernel, attrs", [
    ("Conv", (5, 4), {}), ("Conv", (7, 4), {"pads": [1, 0, 1, 0], "strides": [3, 3]}),
    ("MaxPool", (5, 4), {}), ("AveragePool", (5, 4), {}), ("MaxPool", (3, 2), {"strides": [3, 3]})])
def test_a_window_that_just_fits_gives_one_output_position(op_type, kernel, attrs):
    x = f32(2, 3, 5, 4)  # a window the size of the (padded) input, or strides past every other start
    feeds = {"x": x, "w": f32(2, 3, *kernel)} if op_type == "Conv" else {"x": x}
    model = node_model(op_type, feeds, 13, **attrs, **({} if op_type == "Conv" else {"kernel_shape": list(kernel)}))
    got, expected = both(model, feeds)
    assert got[0].shape == (2, 2 if op_type == "Conv" else 3, 1, 1)
    assert_same(got, expected, atol=1e-5)


@pytest.mark.parametrize("storage_order", [0, 1])
@pytest.mark.parametrize("shape, kernel", [((2, 2, 7), [3]), ((1, 2, 5, 6), [2, 3]), ((1, 2, 4, 5, 6), [2, 2, 3])])
def test_max_pool_indices_in_row_and_column_major_order(storage_order, shape, kernel):
    x = f32(*shape)
    attrs = {"kernel_shape": kernel, "pads": [1] * 2 * len(kernel), "storage_order": storage_order}
    model = node_model("MaxPool", {"x": x}, 12, 2, out_dtypes=[np.float32, np.int64], **attrs)
    assert_same(*both(model, {"x": x}), atol=0)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_max_pool_on_8_bit_integers_pads_with_the_type_minimum(dtype):
    x = np.random.default_rng(1).integers(np.iinfo(dtype).min, np.iinfo(dtype).max, (1, 2, 5, 5), endpoint=True)
    x = x.astype(dtype)
    model = node_model("MaxPool", {"x": x}, 12, kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])
    assert_same(*both(model, {"x": x}), atol=0)


@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
def test_dilated_same_pooling_follows_the_operator_page(op_type, auto_pad):
    """output = ceil(input / stride), padded for the dilated window (onnxruntime pads for the undilated
    kernel and returns fewer positions). Checked against a direct loop over the windows."""
    x = f32(1, 2, 9, 8)
    kernel, strides, dilations = [3, 2], [2, 1], [2, 1]
    model = node_model(op_type, {"x": x}, 19, kernel_shape=kernel, strides=strides, dilations=dilations,
                       auto_pad=auto_pad)
    y = run(model, {"x": x})[0]
    assert y.shape == (1, 2, 5, 8)
    window = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    total = [(o - 1) * s + w - n for o, s, w, n in zip(y.shape[2:], strides, window, x.shape[2:])]
    begin = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in total]
    for i, j in itertools.product(range(y.shape[2]), range(y.shape[3])):
        rows = [i * strides[0] + a * dilations[0] - begin[0] for a in range(kernel[0])]
        cols = [j * strides[1] + b * dilations[1] - begin[1] for b in range(kernel[1])]
        inside = x[0][:, [r for r in rows if 0 <= r < 9]][:, :, [c for c in cols if 0 <= c < 8]]
        expected = inside.max(axis=(1, 2)) if op_type == "MaxPool" else inside.mean(axis=(1, 2))
        np.testing.assert_allclose(y[0, :, i, j], expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("op_type", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(2, 3, 7), (2, 3, 5, 4), (1, 2, 3, 4, 5)])
@pytest.mark.parametrize("opset", [1, 22])
def test_global_pooling(op_type, shape, opset):
    x = f32(*shape)
    assert_same(*both(node_model(op_type, {"x": x}, opset), {"x": x}), atol=1e-6)


@pytest.mark.parametrize("opset", [9, 15])
def test_batch_normalization_over_channels_of_image_and_volume_inputs(opset):
    """BatchNormalization after a Conv: (N, C, H, W) and (N, C, D, H, W), parameters per channel."""
    for shape in [(4, 5, 6, 7), (2, 5, 3, 4, 2)]:
        feeds = {"x": f32(*shape), "scale": f32(5), "bias": f32(5), "mean": f32(5), "var": np.abs(f32(5)) + 0.1}
        assert_same(*both(node_model("BatchNormalization", feeds, opset, epsilon=1e-3), feeds), atol=1e-6)


def test_results_never_alias_the_feed():
    """Unpadded stride-1 windows are a view of the feed; every result is new memory all the same."""
    x = f32(1, 2, 4, 4)
    models = [node_model("MaxPool", {"x": x}, 12, kernel_shape=[1, 1]),
              node_model("AveragePool", {"x": x}, 19, kernel_shape=[1, 1]),
              node_model("Conv", {"x": x, "w": np.ones((2, 1, 1, 1), np.float32)}, 11, group=2)]
    for model in models:
        feeds = feed_dict({"x": x.copy(), "w": np.ones((2, 1, 1, 1), np.float32)})
        feeds = {k: v for k, v in feeds.items() if k in {i.name for i in model.graph.input}}
        out = pp.load(model, backend="numpy").run(feeds)["y0"]
        np.testing.assert_array_equal(out, x)
        feeds["x"][:] = 0
        np.testing.assert_array_equal(out, x)


@pytest.mark.parametrize("op_type, attrs", [("Conv", {"pads": [1, 1, 1, 1]}), ("MaxPool", {"kernel_shape": [2, 2]}),
                                            ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
                                            ("GlobalAveragePool", {}), ("GlobalMaxPool", {})])
def test_an_empty_batch(op_type, attrs):
    feeds = {"x": np.zeros((0, 3, 8, 8), np.float32)}
    if op_type == "Conv":
        feeds["w"] = f32(4, 3, 3, 3)
    assert_same(*both(node_model(op_type, feeds, 17, **attrs), feeds))
