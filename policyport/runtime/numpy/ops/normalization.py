"""Normalization and regularization layers: LayerNormalization, BatchNormalization, Dropout.

https://onnx.ai/onnx/operators/onnx__LayerNormalization.html, onnx__BatchNormalization.html,
onnx__Dropout.html. Ops with optional extra outputs receive ``node_outputs`` and return a tuple
only when the node has more than one output.
"""

from __future__ import annotations

import numpy as np

from ....graph.model import onnx_dtype
from ..registry import op


@op("LayerNormalization", since=17)
def layer_normalization(x, scale, bias=None, *, axis=-1, epsilon=1e-5, stash_type=1, node_outputs):
    """Y = (x - mean) / sqrt(var + epsilon) * scale + bias over the axes ``axis..rank-1``.

    Statistics are computed in ``stash_type`` (float32 by default) or x's type if wider, and the
    optional outputs Mean and InvStdDev (shape of x with the normalized axes kept as 1) have type
    ``stash_type``.
    """
    stash = onnx_dtype(stash_type)
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis {axis} is out of range for a rank-{x.ndim} input")
    axes = tuple(range(axis + x.ndim if axis < 0 else axis, x.ndim))
    xw = x.astype(np.promote_types(x.dtype, stash), copy=False)
    mean = np.mean(xw, axis=axes, keepdims=True)
    d = xw - mean
    inv_std = 1 / np.sqrt(np.mean(d * d, axis=axes, keepdims=True) + epsilon)
    y = d * inv_std * scale
    if bias is not None:
        y = y + bias
    y = y.astype(x.dtype, copy=False)
    if node_outputs == 1:
        return y
    return y, mean.astype(stash, copy=False), inv_std.astype(stash, copy=False)


def _channel(p, ndim):
    """A per-channel parameter (C,), or (C, D1, ...), shaped to broadcast from axis 1 of an ndim-D input."""
    return p.reshape(p.shape + (1,) * (ndim - 1 - p.ndim))


def _batch_norm(x, scale, bias, mean, var, epsilon):
    """x * factor + shift with the per-channel factor = scale / sqrt(var + epsilon) and shift = bias -
    mean * factor folded first (as onnxruntime folds them): two passes over x, which may be an image."""
    channels = x.shape[1] if x.ndim > 1 else None
    for name, p in (("scale", scale), ("B", bias), ("mean", mean), ("var", var)):
        if channels is None or p.ndim == 0 or p.shape[0] != channels:
            raise ValueError(f"{name} of shape {p.shape} does not hold one value per channel of an input "
                             f"of shape {x.shape} (axis 1)")
    factor = scale / np.sqrt(var + epsilon)
    y = x * _channel(factor, x.ndim)
    y += _channel(bias - mean * factor, x.ndim)
    return y.astype(x.dtype, copy=False)


@op("BatchNormalization", since=7)
def batch_normalization_7(x, scale, bias, mean, var, *, epsilon=1e-5, momentum=0.9, spatial=1):
    """BatchNormalization-7/9, inference: scale * (x - mean) / sqrt(var + epsilon) + bias.

    The parameters broadcast from axis 1, which also covers BatchNormalization-7's ``spatial=0``
    (parameters of shape (C, D1, ...)); ``momentum`` only matters in training.
    """
    return _batch_norm(x, scale, bias, mean, var, epsilon)


@op("BatchNormalization", since=14)
def batch_normalization_14(x, scale, bias, input_mean, input_var, *, epsilon=1e-5, momentum=0.9,
                           training_mode=0, node_outputs):
    """BatchNormalization-14/15. Inference as in version 7; with ``training_mode=1`` the batch's own
    mean and (biased) variance over every axis but 1 normalize x, and the optional outputs are
    running_mean = input_mean * momentum + batch_mean * (1 - momentum) (running_var likewise).
    """
    if not training_mode:
        return _batch_norm(x, scale, bias, input_mean, input_var, epsilon)
    axes = (0, *range(2, x.ndim))
    batch_mean, batch_var = np.mean(x, axis=axes), np.var(x, axis=axes)
    y = _batch_norm(x, scale, bias, batch_mean, batch_var, epsilon)
    if node_outputs == 1:
        return y
    running_mean = input_mean * momentum + batch_mean * (1 - momentum)
    running_var = input_var * momentum + batch_var * (1 - momentum)
    return (y, running_mean.astype(input_mean.dtype, copy=False),
            running_var.astype(input_var.dtype, copy=False))


@op("Dropout", since=7)
def dropout_7(data, *, ratio=0.5, node_outputs):
    """Dropout-7, inference: the identity; the optional mask is ones of data's type."""
    return (data, np.ones_like(data)) if node_outputs > 1 else data


@op("Dropout", since=10)
def dropout_10(data, *, ratio=0.5, node_outputs):
    """Dropout-10, inference: the identity; the optional mask is boolean (all True) from 10 on."""
    return (data, np.ones(data.shape, dtype=bool)) if node_outputs > 1 else data


@op("Dropout", since=12)
def dropout_12(data, ratio=None, training_mode=None, *, seed=None, node_outputs):
    """Dropout-12/13/22: ``ratio`` (default 0.5) and ``training_mode`` (default False) are inputs.

    Inference (or ratio 0) is the identity with an all-True mask. In training mode an element is kept
    where a uniform draw in [0, 1) is >= ratio, and scaled by 1 / (1 - ratio); the draws come from
    ``numpy.random.RandomState(seed)`` (fresh entropy without ``seed``), the generator of the ONNX
    reference implementation, so seeded results match it.
    """
    r = 0.5 if ratio is None else float(ratio)
    if not 0 <= r < 1:
        raise ValueError(f"ratio is {r}; it must be in [0, 1)")
    if training_mode is None or not training_mode or r == 0:
        out, mask = data, np.ones(data.shape, dtype=bool)
    else:
        mask = np.random.RandomState(seed).uniform(0.0, 1.0, data.shape) >= r
        out = (mask * data * (1 / (1 - r))).astype(data.dtype, copy=False)
    return (out, mask) if node_outputs > 1 else out
