"""Tensor manipulation, shape ops, constants and casts.

https://onnx.ai/onnx/operators/ — each op's page for its version history. Shape-like inputs
(``shape``, ``axes``, ``starts`` ...) are int64 tensors; negative axes count from the end, as they
may from opset 11 on (before it they were non-negative, which numpy's indexing covers too).
"""

from __future__ import annotations

import math

import numpy as np

from ....graph import onnx_dtype
from ..registry import op


@op("Identity", since=1)
def identity(x):
    return x


@op("Constant", since=1)
def constant(*, value=None, value_float=None, value_floats=None, value_int=None, value_ints=None,
             value_string=None, value_strings=None, sparse_value=None):
    """The one attribute given becomes the output (the value_* attributes exist from opset 12)."""
    if value is not None:
        return np.array(value)
    if value_float is not None or value_floats is not None:
        return np.array(value_float if value_floats is None else value_floats, dtype=np.float32)
    if value_int is not None or value_ints is not None:
        return np.array(value_int if value_ints is None else value_ints, dtype=np.int64)
    if value_string is not None or value_strings is not None:
        return np.array(value_string if value_strings is None else value_strings, dtype=object)
    raise ValueError("Constant node has no value attribute (sparse_value is not supported)")


@op("ConstantOfShape", since=9)
def constant_of_shape(shape, *, value=None):
    """A tensor of shape ``shape`` filled with the one element of ``value`` (default float32 0)."""
    if value is None:
        return np.zeros(tuple(shape.tolist()), dtype=np.float32)
    return np.full(tuple(shape.tolist()), value.reshape(-1)[0], dtype=value.dtype)


@op("Shape", since=1)
def shape_1(data):
    return np.array(data.shape, dtype=np.int64)


@op("Shape", since=15)
def shape_15(data, *, start=0, end=None):
    """Shape-15: dims ``start:end`` of the shape, the bounds clamped as in Python slicing."""
    return np.array(data.shape[start:end], dtype=np.int64)


@op("Size", since=1)
def size(data):
    return np.array(data.size, dtype=np.int64)


def _cast(x, dtype):
    if dtype == object:  # to STRING: the shortest round-tripping decimal, as numpy prints it
        return x.astype(np.str_).astype(object)
    return x.astype(dtype, copy=False)


@op("Cast", since=6)
def cast(x, *, to, saturate=1, round_mode="up"):
    """Cast-6 on (``to`` is a TensorProto data type code; before 6 it was a string).

    Float to integer truncates toward zero; strings parse as Python floats ("INF", "NaN" ...).
    ``saturate`` (opset 19) and ``round_mode`` (24) only concern float8 types, which numpy cannot
    hold: a model using them fails in :func:`policyport.graph.onnx_dtype`.
    """
    return _cast(x, onnx_dtype(to))


@op("CastLike", since=15)
def cast_like(x, target_type, *, saturate=1, round_mode="up"):
    """Cast ``x`` to the element type of ``target_type`` (``saturate``, ``round_mode``: see Cast)."""
    return _cast(x, target_type.dtype)


@op("Reshape", since=5)
def reshape(data, shape, *, allowzero=0):
    """A 0 in ``shape`` copies the input dimension (unless allowzero=1, opset 14); -1 is inferred."""
    new = shape.tolist()
    if not allowzero:
        new = [data.shape[i] if d == 0 else d for i, d in enumerate(new)]
    return np.reshape(data, new)


@op("Flatten", since=1)
def flatten(x, *, axis=1):
    """To 2-D: (prod(shape[:axis]), prod(shape[axis:])); ``axis`` may be negative from opset 11."""
    axis = axis + x.ndim if axis < 0 else axis
    return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


@op("Squeeze", since=1)
def squeeze_1(data, *, axes=None):
    """Squeeze-1/11: ``axes`` attribute; without it every dimension of size 1 goes."""
    return np.squeeze(data, axis=None if axes is None else tuple(axes))


@op("Squeeze", since=13)
def squeeze_13(data, axes=None):
    """Squeeze-13: ``axes`` is an optional input."""
    return np.squeeze(data, axis=None if axes is None else tuple(axes.tolist()))


@op("Unsqueeze", since=1)
def unsqueeze_1(data, *, axes):
    """Unsqueeze-1/11: insert size-1 dimensions at ``axes`` of the output."""
    return np.expand_dims(data, tuple(axes))


@op("Unsqueeze", since=13)
def unsqueeze_13(data, axes):
    """Unsqueeze-13: ``axes`` is an input."""
    return np.expand_dims(data, tuple(axes.tolist()))


@op("Transpose", since=1)
def transpose(data, *, perm=None):
    """Permute the axes by ``perm`` (default: reverse them)."""
    return np.transpose(data, perm)


@op("Concat", since=4)
def concat(*inputs, axis):
    return np.concatenate(inputs, axis=axis)


def _split(x, sizes, axis, node_outputs):
    parts = tuple(np.split(x, np.cumsum(sizes)[:-1], axis=axis))
    return parts if node_outputs > 1 else parts[0]


def _even_sizes(length, n):
    """``n`` chunks of ceil(length / n), the last one smaller when ``n`` does not divide ``length``."""
    chunk = -(-length // n)
    return [chunk] * (n - 1) + [length - chunk * (n - 1)]


@op("Split", since=2)
def split_2(x, *, axis=0, split=None, node_outputs):
    """Split-2/11: sizes from the ``split`` attribute, else equal parts, one per node output."""
    return _split(x, split or _even_sizes(x.shape[axis], node_outputs), axis, node_outputs)


@op("Split", since=13)
def split_13(x, split=None, *, axis=0, node_outputs):
    """Split-13: sizes from the optional ``split`` input, else equal parts, one per node output."""
    sizes = _even_sizes(x.shape[axis], node_outputs) if split is None else split.tolist()
    return _split(x, sizes, axis, node_outputs)


@op("Split", since=18)
def split_18(x, split=None, *, axis=0, num_outputs=None, node_outputs):
    """Split-18: without ``split``, ``num_outputs`` parts of ceil(dim / num_outputs), the last smaller."""
    if split is None:
        sizes = _even_sizes(x.shape[axis], num_outputs or node_outputs)
    else:
        sizes = split.tolist()
    return _split(x, sizes, axis, node_outputs)


def _slice(data, starts, ends, axes, steps):
    index = [slice(None)] * data.ndim
    for a, s, e, st in zip(axes, starts, ends, steps):
        index[a] = slice(s, e, st)
    return data[tuple(index)]


@op("Slice", since=1)
def slice_1(data, *, starts, ends, axes=None):
    """Slice-1: starts, ends and axes are attributes; indices clamp as in Python slicing."""
    axes = range(len(starts)) if axes is None else axes
    return _slice(data, starts, ends, axes, [1] * len(starts))


@op("Slice", since=10)
def slice_10(data, starts, ends, axes=None, steps=None):
    """Slice-10/11/13: starts, ends, axes and steps are inputs; indices clamp as in Python slicing."""
    n = len(starts)
    axes = range(n) if axes is None else axes.tolist()
    steps = [1] * n if steps is None else steps.tolist()
    return _slice(data, starts.tolist(), ends.tolist(), axes, steps)


@op("Gather", since=1)
def gather(data, indices, *, axis=0):
    """numpy.take: negative indices count from the end (allowed from opset 11)."""
    return np.take(data, indices, axis=axis)


@op("Expand", since=8)
def expand(x, shape):
    """Broadcast ``x`` with ``shape`` in both directions (a dim of 1 in ``shape`` keeps x's dim)."""
    return np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(shape.tolist()))).copy()


@op("Tile", since=6)
def tile(x, repeats):
    return np.tile(x, tuple(repeats.tolist()))


@op("Where", since=9)
def where(condition, x, y):
    return np.where(condition, x, y)


@op("Range", since=11)
def range_(start, limit, delta, *, stash_type=1):
    """start + i * delta for i < max(ceil((limit - start) / delta), 0).

    Floats are computed in float64 and rounded once. float16 (Range-27) is computed in the
    ``stash_type`` element type, float32 by default.
    """
    dtype = start.dtype
    if dtype == np.float16:
        work = onnx_dtype(stash_type)
    elif np.issubdtype(dtype, np.floating):
        work = np.float64
    else:
        work = dtype
    return np.arange(start.item(), limit.item(), delta.item(), dtype=work).astype(dtype, copy=False)
