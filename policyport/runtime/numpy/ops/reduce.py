"""Reductions: Reduce{Sum,Mean,Max,Min,Prod,L2,LogSumExp}, ArgMax, ArgMin.

https://onnx.ai/onnx/operators/ — each op's page. ``axes`` is an attribute before the version at
which it became an optional second input (ReduceSum-13, the other Reduce ops 18); that version also
added ``noop_with_empty_axes``: with no or empty ``axes``, reduce over every axis, or (if set) over
none, still applying the op's element-wise part (ReduceL2 over no axes is |x|). A reduction over an
empty set yields the op's identity: 0 (Sum, L2), 1 (Prod), -inf (Max, LogSumExp; the type's lowest
value for integers), +inf (Min).
"""

from __future__ import annotations

import numpy as np

from ..registry import op


def _axes_input(axes, noop_with_empty_axes):
    """Axes given as an input tensor (or omitted) -> a numpy ``axis`` argument."""
    if axes is None or axes.size == 0:
        return () if noop_with_empty_axes else None
    return tuple(dict.fromkeys(int(a) for a in axes.ravel()))  # a repeated axis counts once, as in onnxruntime


def _axes_attr(axes):
    """Axes given as an attribute -> a numpy ``axis`` argument (absent or empty: every axis)."""
    return tuple(dict.fromkeys(axes)) if axes else None


def _lowest(dtype):
    if dtype == np.bool_:
        return False
    return -np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).min


def _highest(dtype):
    if dtype == np.bool_:
        return True
    return np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).max


def _sum(x, axis, keepdims):
    return np.sum(x, axis=axis, keepdims=bool(keepdims), dtype=x.dtype)


def _mean(x, axis, keepdims):
    return np.mean(x, axis=axis, keepdims=bool(keepdims)).astype(x.dtype, copy=False)


def _max(x, axis, keepdims):
    return np.max(x, axis=axis, keepdims=bool(keepdims), initial=_lowest(x.dtype))


def _min(x, axis, keepdims):
    return np.min(x, axis=axis, keepdims=bool(keepdims), initial=_highest(x.dtype))


def _prod(x, axis, keepdims):
    return np.prod(x, axis=axis, keepdims=bool(keepdims), dtype=x.dtype)


def _l2(x, axis, keepdims):
    """sqrt(sum(x^2)); integer inputs give the truncated integer norm."""
    return np.sqrt(np.sum(np.square(x), axis=axis, keepdims=bool(keepdims))).astype(x.dtype, copy=False)


def _log_sum_exp(x, axis, keepdims):
    """max + log(sum(exp(x - max))), with an infinite max replaced by 0 so that it cannot make NaN;
    integer inputs (allowed before opset 28) give the truncated result."""
    m = np.max(x, axis=axis, keepdims=True, initial=_lowest(x.dtype))
    m = np.where(np.isfinite(m), m, 0).astype(x.dtype, copy=False)
    with np.errstate(under="ignore", divide="ignore"):
        s = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return (s if keepdims else np.squeeze(s, axis=axis)).astype(x.dtype, copy=False)


@op("ReduceSum", since=1)
def reduce_sum_1(data, *, axes=None, keepdims=1):
    return _sum(data, _axes_attr(axes), keepdims)


@op("ReduceSum", since=13)
def reduce_sum_13(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    return _sum(data, _axes_input(axes, noop_with_empty_axes), keepdims)


@op("ReduceMean", since=1)
def reduce_mean_1(data, *, axes=None, keepdims=1):
    return _mean(data, _axes_attr(axes), keepdims)


@op("ReduceMean", since=18)
def reduce_mean_18(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    return _mean(data, _axes_input(axes, noop_with_empty_axes), keepdims)


@op("ReduceMax", since=1)
def reduce_max_1(data, *, axes=None, keepdims=1):
    return _max(data, _axes_attr(axes), keepdims)


@op("ReduceMax", since=18)
def reduce_max_18(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    return _max(data, _axes_input(axes, noop_with_empty_axes), keepdims)


@op("ReduceMin", since=1)
def reduce_min_1(data, *, axes=None, keepdims=1):
    return _min(data, _axes_attr(axes), keepdims)


@op("ReduceMin", since=18)
def reduce_min_18(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    return _min(data, _axes_input(axes, noop_with_empty_axes), keepdims)


@op("ReduceProd", since=1)
def reduce_prod_1(data, *, axes=None, keepdims=1):
    return _prod(data, _axes_attr(axes), keepdims)


@op("ReduceProd", since=18)
def reduce_prod_18(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    return _prod(data, _axes_input(axes, noop_with_empty_axes), keepdims)


@op("ReduceL2", since=1)
def reduce_l2_1(data, *, axes=None, keepdims=1):
    return _l2(data, _axes_attr(axes), keepdims)


@op("ReduceL2", since=18)
def reduce_l2_18(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    return _l2(data, _axes_input(axes, noop_with_empty_axes), keepdims)


@op("ReduceLogSumExp", since=1)
def reduce_log_sum_exp_1(data, *, axes=None, keepdims=1):
    return _log_sum_exp(data, _axes_attr(axes), keepdims)


@op("ReduceLogSumExp", since=18)
def reduce_log_sum_exp_18(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    return _log_sum_exp(data, _axes_input(axes, noop_with_empty_axes), keepdims)


def _arg(fn, data, axis, keepdims, select_last_index):
    if select_last_index:
        out = data.shape[axis] - 1 - fn(np.flip(data, axis), axis=axis)
    else:
        out = fn(data, axis=axis)
    if keepdims:
        out = np.expand_dims(out, axis)
    return out.astype(np.int64, copy=False)


@op("ArgMax", since=1)
def argmax(data, *, axis=0, keepdims=1, select_last_index=0):
    """ArgMax-1/11/12/13: index of the first maximum (the last with ``select_last_index``, opset 12)."""
    return _arg(np.argmax, data, axis, keepdims, select_last_index)


@op("ArgMin", since=1)
def argmin(data, *, axis=0, keepdims=1, select_last_index=0):
    """ArgMin-1/11/12/13: index of the first minimum (the last with ``select_last_index``, opset 12)."""
    return _arg(np.argmin, data, axis, keepdims, select_last_index)
