"""Pooling: MaxPool (with its Indices output), AveragePool, GlobalAveragePool, GlobalMaxPool.

https://onnx.ai/onnx/operators/onnx__MaxPool.html, onnx__AveragePool.html,
onnx__GlobalAveragePool.html, onnx__GlobalMaxPool.html. Windows, padding and output sizes are those
of :func:`.conv.window_geometry`; the windows are a strided view of the (padded) input, reduced by
one whole-array ufunc call per kernel offset.

Versions where the semantics change: MaxPool-8 adds the Indices output and ``storage_order``,
MaxPool-10 ``ceil_mode`` and ``dilations`` (11 and 12 clarified the text and added int8/uint8);
AveragePool-7 adds ``count_include_pad``, AveragePool-10 ``ceil_mode``, AveragePool-19
``dilations`` (11 clarified the text). Version 22 of each only added types.
"""

from __future__ import annotations

import math

import numpy as np

from ....io.limits import check_tensor_shape
from ..registry import op
from .conv import padded_shape, window_geometry, windows


def _lowest(dtype):
    return -np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).min


def _window_slices(view, kernel):
    """(offset index, view of every window's element at that kernel offset), row-major over the kernel:
    (N, C, *out) strided views, so a reduction over the window is a few whole-array ufunc calls
    (numpy reduces over short trailing axes of a strided view very slowly)."""
    for k, offset in enumerate(np.ndindex(*kernel)):
        yield k, view[(Ellipsis, *offset)]


def _max_pool(x, *, auto_pad, ceil_mode, dilations, kernel_shape, pads, storage_order, strides, node_outputs):
    n = len(kernel_shape)
    spatial = x.shape[2:]
    begin, end, out, _ = window_geometry(spatial, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    check_tensor_shape((*x.shape[:2], *out), np.int64 if node_outputs > 1 else x.dtype)
    view = windows(x, kernel_shape, begin, end, out, strides, dilations, fill=_lowest(x.dtype))
    slices = _window_slices(view, kernel_shape)
    y = next(slices)[1].copy()
    if node_outputs == 1:
        for _, values in slices:
            np.maximum(y, values, out=y)
        return y
    best = np.zeros(y.shape, np.int64)  # kernel offset of the first maximum
    for k, values in slices:
        larger = values > y
        np.copyto(y, values, where=larger)
        np.copyto(best, k, where=larger)
    # input coordinate of the winner along each spatial axis: o * stride + k * dilation - begin
    offsets = np.unravel_index(best, kernel_shape)
    strides = list(strides or [1] * n)
    dilations = list(dilations or [1] * n)
    coords = []
    for axis in range(n):
        position = np.arange(out[axis]).reshape([-1 if a == axis else 1 for a in range(n)])
        coords.append(position * strides[axis] + offsets[axis] * dilations[axis] - begin[axis])
    plane = math.prod(spatial)
    if storage_order:  # column-major within each (n, c) plane: the first spatial axis varies fastest
        within = sum(c * math.prod(spatial[:axis]) for axis, c in enumerate(coords))
    else:
        within = sum(c * math.prod(spatial[axis + 1:]) for axis, c in enumerate(coords))
    planes = np.arange(x.shape[0] * x.shape[1]).reshape(x.shape[0], x.shape[1], *[1] * n)
    return y, (planes * plane + within).astype(np.int64)


@op("MaxPool", since=1)
def max_pool_1(x, *, auto_pad="NOTSET", kernel_shape, pads=None, strides=None):
    """MaxPool-1: the largest element of each window; padding never wins (it is -inf, or the integer
    type's minimum). x: (N, C, D1, ..., Dn) -> (N, C, O1, ..., On)."""
    return _max_pool(x, auto_pad=auto_pad, ceil_mode=0, dilations=None, kernel_shape=kernel_shape, pads=pads,
                     storage_order=0, strides=strides, node_outputs=1)


@op("MaxPool", since=8)
def max_pool_8(x, *, auto_pad="NOTSET", kernel_shape, pads=None, storage_order=0, strides=None, node_outputs):
    """MaxPool-8: MaxPool-1 plus the optional Indices output (int64, same shape as Y): the index of each
    maximum in x flattened, padding not counted, row-major within each (n, c) plane, or
    column-major with ``storage_order=1``; the first maximum of a window in row-major order wins."""
    return _max_pool(x, auto_pad=auto_pad, ceil_mode=0, dilations=None, kernel_shape=kernel_shape, pads=pads,
                     storage_order=storage_order, strides=strides, node_outputs=node_outputs)


@op("MaxPool", since=10)
def max_pool_10(x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape, pads=None, storage_order=0,
                strides=None, node_outputs):
    """MaxPool-10/11/12/22: MaxPool-8 plus ``ceil_mode`` and ``dilations`` (see window_geometry)."""
    return _max_pool(x, auto_pad=auto_pad, ceil_mode=ceil_mode, dilations=dilations, kernel_shape=kernel_shape,
                     pads=pads, storage_order=storage_order, strides=strides, node_outputs=node_outputs)


def _average_pool(x, *, auto_pad, ceil_mode, count_include_pad, dilations, kernel_shape, pads, strides):
    n = len(kernel_shape)
    spatial = x.shape[2:]
    begin, end, out, counted_end = window_geometry(spatial, kernel_shape, strides, dilations, pads, auto_pad,
                                                   ceil_mode)
    padded_shape(x, begin, end)  # before the padded copies below
    check_tensor_shape((*x.shape[:2], *out), np.promote_types(x.dtype, np.float32))
    # how many elements each window averages: the input's, plus the given padding's if counted
    counted = np.ones((1, 1, *spatial), dtype=x.dtype)
    if count_include_pad:
        counted = np.pad(counted, [(0, 0), (0, 0), *zip(begin, counted_end)], constant_values=1)
        inner_begin = [0] * n
        inner_end = [e - c for e, c in zip(end, counted_end)]
    else:
        inner_begin, inner_end = begin, end
    total, count = (_window_sum(windows(a, kernel_shape, b, e, out, strides, dilations), kernel_shape)
                    for a, b, e in ((x, begin, end), (counted, inner_begin, inner_end)))
    total /= count
    return total.astype(x.dtype, copy=False)


def _window_sum(view, kernel):
    """Sum over each window, accumulated in float32 at least (float16 would round at every step)."""
    slices = _window_slices(view, kernel)
    total = next(slices)[1].astype(np.promote_types(view.dtype, np.float32))
    for _, values in slices:
        total += values
    return total


@op("AveragePool", since=1)
def average_pool_1(x, *, auto_pad="NOTSET", kernel_shape, pads=None, strides=None):
    """AveragePool-1: the mean of each window over the input elements it covers (padding excluded).
    x: (N, C, D1, ..., Dn) -> (N, C, O1, ..., On)."""
    return _average_pool(x, auto_pad=auto_pad, ceil_mode=0, count_include_pad=0, dilations=None,
                         kernel_shape=kernel_shape, pads=pads, strides=strides)


@op("AveragePool", since=7)
def average_pool_7(x, *, auto_pad="NOTSET", count_include_pad=0, kernel_shape, pads=None, strides=None):
    """AveragePool-7: with ``count_include_pad=1`` the padding counts as zeros in the mean."""
    return _average_pool(x, auto_pad=auto_pad, ceil_mode=0, count_include_pad=count_include_pad, dilations=None,
                         kernel_shape=kernel_shape, pads=pads, strides=strides)


@op("AveragePool", since=10)
def average_pool_10(x, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, kernel_shape, pads=None,
                    strides=None):
    """AveragePool-10/11: AveragePool-7 plus ``ceil_mode``; the part of a last window beyond the given
    padding never counts."""
    return _average_pool(x, auto_pad=auto_pad, ceil_mode=ceil_mode, count_include_pad=count_include_pad,
                         dilations=None, kernel_shape=kernel_shape, pads=pads, strides=strides)


@op("AveragePool", since=19)
def average_pool_19(x, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None, kernel_shape,
                    pads=None, strides=None):
    """AveragePool-19/22: AveragePool-10 plus ``dilations``."""
    return _average_pool(x, auto_pad=auto_pad, ceil_mode=ceil_mode, count_include_pad=count_include_pad,
                         dilations=dilations, kernel_shape=kernel_shape, pads=pads, strides=strides)


@op("GlobalAveragePool", since=1)
def global_average_pool(x):
    """The mean over every spatial axis: (N, C, D1, ..., Dn) -> (N, C, 1, ..., 1)."""
    return np.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True)


@op("GlobalMaxPool", since=1)
def global_max_pool(x):
    """The maximum over every spatial axis: (N, C, D1, ..., Dn) -> (N, C, 1, ..., 1)."""
    return np.max(x, axis=tuple(range(2, x.ndim)), keepdims=True)
