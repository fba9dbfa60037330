"""Tensor manipulation: Identity, Constant, Concat, Slice, Expand, Reshape, Shape, ArgMax.

https://onnx.ai/onnx/operators/ — each op's page for its version history.
"""

from __future__ import annotations

import numpy as np

from ..registry import op


@op("Identity", since=1)
def identity(x):
    return x


@op("Constant", since=1)
def constant(*, value=None, value_float=None, value_floats=None, value_int=None, value_ints=None,
             value_string=None, value_strings=None, sparse_value=None):
    """The one attribute given becomes the output (value_* attributes from opset 12)."""
    if value is not None:
        return np.array(value)
    if value_float is not None:
        return np.array(value_float, dtype=np.float32)
    if value_floats is not None:
        return np.array(value_floats, dtype=np.float32)
    if value_int is not None:
        return np.array(value_int, dtype=np.int64)
    if value_ints is not None:
        return np.array(value_ints, dtype=np.int64)
    if value_string is not None:
        return np.array(value_string, dtype=object)
    if value_strings is not None:
        return np.array(value_strings, dtype=object)
    raise ValueError("Constant node has no value attribute (sparse_value is not supported)")


@op("Concat", since=4)
def concat(*inputs, axis):
    return np.concatenate(inputs, axis=axis)


@op("Slice", since=10)
def slice_(data, starts, ends, axes=None, steps=None):
    """Slice-10/11/13: starts, ends, axes and steps are inputs; indices clamp as in Python slicing."""
    if axes is None:
        axes = range(len(starts))
    if steps is None:
        steps = [1] * len(starts)
    index = [slice(None)] * data.ndim
    for s, e, a, st in zip(starts.tolist(), ends.tolist(), np.asarray(axes).tolist(), np.asarray(steps).tolist()):
        index[a] = slice(s, e, st)
    return data[tuple(index)]


@op("Expand", since=8)
def expand(x, shape):
    """Broadcast ``x`` with ``shape`` (both directions, unlike numpy.broadcast_to)."""
    return x * np.ones(tuple(shape.tolist()), dtype=x.dtype)


@op("Reshape", since=5)
def reshape(data, shape, *, allowzero=0):
    """A 0 in ``shape`` copies the input dimension (unless allowzero=1, opset 14); -1 is inferred."""
    new = shape.tolist()
    if not allowzero:
        new = [data.shape[i] if d == 0 else d for i, d in enumerate(new)]
    return np.reshape(data, new)


@op("Shape", since=1)
def shape(data):
    return np.array(data.shape, dtype=np.int64)


@op("ArgMax", since=1)
def argmax(data, *, axis=0, keepdims=1, select_last_index=0):
    if select_last_index:
        flipped = np.flip(data, axis)
        out = data.shape[axis] - 1 - np.argmax(flipped, axis=axis)
    else:
        out = np.argmax(data, axis=axis)
    if keepdims:
        out = np.expand_dims(out, axis)
    return out.astype(np.int64)
