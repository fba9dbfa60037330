"""One-node ONNX models and how the op tests run them: shared by the op test modules.

Test modules in this folder import it as ``onnx_node`` (pytest puts the folder on ``sys.path``).
"""

from __future__ import annotations

import numpy as np
from onnx import helper

import policyport as pp

RNG = np.random.default_rng(0)


def node_model(op_type, feeds, opset, outputs=1, out_dtypes=None, **attrs):
    """A one-node model named "n0".

    Args:
        op_type: the node's op type.
        feeds: its inputs in order, as graph inputs: a dict name -> array, or a list of (name,
            array) pairs; the name "" (dict) or the array None (list) is an omitted optional input.
        opset: the default domain's opset.
        outputs: how many outputs ``y0, y1 ...``, or their names ("" for an omitted output).
        out_dtypes: the outputs' dtypes (default: the first input's dtype).
        attrs: the node's attributes.
    """
    pairs = list(feeds.items()) if isinstance(feeds, dict) else list(feeds)
    names = [f"y{i}" for i in range(outputs)] if isinstance(outputs, int) else list(outputs)
    first = next(a for _, a in pairs if a is not None) if pairs else None
    out_dtypes = list(out_dtypes or [first.dtype] * len(names))
    inputs = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for n, a in pairs if n and a is not None
    ]
    outs = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.dtype(d)), None)
        for n, d in zip([n for n in names if n], out_dtypes)
    ]
    node = helper.make_node(op_type, [n if a is not None else "" for n, a in pairs], names, name="n0", **attrs)
    graph = helper.make_graph([node], "g", inputs, outs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def feed_dict(feeds) -> dict:
    """The graph inputs of ``feeds`` (as for :func:`node_model`) by name."""
    pairs = feeds.items() if isinstance(feeds, dict) else feeds
    return {n: a for n, a in pairs if n and a is not None}


def run(model, feeds, backend="numpy", **options):
    """The model's outputs, in graph-output order, on ``backend`` (``options`` go to pp.load)."""
    out = pp.load(model, backend=backend, **options).run(feed_dict(feeds))
    return list(out.values())


def both(model, feeds):
    """(numpy backend outputs, onnxruntime outputs)."""
    return run(model, feeds), run(model, feeds, backend="onnxruntime")


def close(actual, desired, **tolerances):
    """assert_allclose, whose own rtol * |desired| may underflow on tiny values."""
    with np.errstate(under="ignore"):
        np.testing.assert_allclose(actual, desired, **tolerances)


def assert_same(ours, theirs, rtol=1e-5, atol=1e-6):
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
        close(a, b, rtol=rtol, atol=atol)


def f32(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def narrow(x: np.ndarray, dtype) -> np.ndarray:
    """``x`` cast to ``dtype`` without numpy's underflow flag: a draw below float16's smallest normal
    (6.1e-5, about one in 20,000 normal draws) becomes subnormal, which a test's ``errstate(all="raise")``
    would turn into an error of the input's making, not the op's."""
    with np.errstate(under="ignore"):
        return x.astype(dtype)


def i64(*values):
    return np.array(values, dtype=np.int64)
