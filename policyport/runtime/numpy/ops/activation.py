"""Activation functions, Softmax and its relatives, and Clip.

https://onnx.ai/onnx/operators/ — each op's page has its formula. Attributes are Python floats, so
under numpy's NEP 50 promotion ``alpha * x`` keeps ``x``'s dtype. Functions whose exact result
underflows or overflows in an intermediate (Sigmoid(-1000) = 0, Softplus(1000) = 1000) compute it
under ``np.errstate`` so a caller's ``np.seterr(all="raise")`` is not tripped by valid input.
"""

from __future__ import annotations

import math

import numpy as np

from ....graph.model import ML_DTYPE_NAMES
from ..registry import op
from .special import erfc

_FLT_MAX = 3.4028234663852886e38


@op("Relu", since=6)
def relu(x):
    return np.maximum(x, x.dtype.type(0))


@op("LeakyRelu", since=6)
def leaky_relu(x, *, alpha=0.01):
    return np.where(x >= 0, x, x * alpha)


@op("PRelu", since=6)
def prelu(x, slope):
    """x if x >= 0 else slope * x; ``slope`` broadcasts to ``x`` (unidirectionally from opset 7)."""
    return np.where(x >= 0, x, x * slope).astype(x.dtype, copy=False)


@op("Elu", since=6)
def elu(x, *, alpha=1.0):
    """x if x > 0 else alpha * (exp(x) - 1); bfloat16 is computed in float32 (see Celu)."""
    if x.dtype.name in ML_DTYPE_NAMES:
        return elu(x.astype(np.float32), alpha=alpha).astype(x.dtype)
    return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))


@op("Selu", since=6)
def selu(x, *, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
    return gamma * np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))


@op("Celu", since=12)
def celu(x, *, alpha=1.0):
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1)).

    bfloat16 (an ml_dtypes type, which a Python float promotes to float32) is computed in float32
    and rounded once.
    """
    if x.dtype.name in ML_DTYPE_NAMES:
        return celu(x.astype(np.float32), alpha=alpha).astype(x.dtype)
    return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0) / alpha))


@op("ThresholdedRelu", since=10)
def thresholded_relu(x, *, alpha=1.0):
    """x if x > alpha else 0."""
    return np.where(x > alpha, x, x.dtype.type(0))


def _sigmoid(x):
    with np.errstate(under="ignore", over="ignore"):
        e = np.exp(-np.abs(x))
        return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


@op("Sigmoid", since=6)
def sigmoid(x):
    """1 / (1 + exp(-x)), as exp(-|x|) ratios so that no exp overflows."""
    return _sigmoid(x)


@op("HardSigmoid", since=6)
def hard_sigmoid(x, *, alpha=0.2, beta=0.5):
    """max(0, min(1, alpha * x + beta))."""
    return np.clip(alpha * x + beta, 0, 1)


@op("HardSwish", since=14)
def hard_swish(x):
    """x * max(0, min(1, x / 6 + 1/2))."""
    return x * np.clip(x / 6 + 0.5, 0, 1)


@op("Tanh", since=6)
def tanh(x):
    return np.tanh(x)


def _softplus(x):
    with np.errstate(under="ignore"):
        return np.logaddexp(x.dtype.type(0), x)


@op("Softplus", since=1)
def softplus(x):
    """log(1 + exp(x)), as logaddexp(0, x): finite and exact for large |x|."""
    return _softplus(x)


@op("Softsign", since=1)
def softsign(x):
    """x / (1 + |x|)."""
    return x / (1 + np.abs(x))


@op("Mish", since=18)
def mish(x):
    """x * tanh(softplus(x))."""
    return x * np.tanh(_softplus(x))


def _check_gelu(inputs, attrs, outputs):
    if attrs.get("approximate", "none") not in ("none", "tanh"):
        raise ValueError(f"approximate is {attrs['approximate']!r}; the operator knows 'none' and 'tanh'")


@op("Gelu", since=20, check=_check_gelu)
def gelu(x, *, approximate="none"):
    """x * Phi(x) = x/2 * erfc(-x / sqrt(2)); with ``approximate="tanh"``,
    x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))) = x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)).

    Both forms avoid the cancellation of ``1 + erf`` / ``1 + tanh`` for negative x.
    """
    if approximate == "tanh":
        with np.errstate(over="ignore", under="ignore"):  # x^3 beyond the range only saturates
            inner = (2 * math.sqrt(2 / math.pi)) * (x + 0.044715 * x * x * x)
        return x * _sigmoid(inner)
    x64 = x.astype(np.float64)  # erfc's argument rounded to x's precision would cost digits in the tail
    with np.errstate(under="ignore"):
        return (0.5 * x64 * erfc(x64 * -math.sqrt(0.5))).astype(x.dtype, copy=False)


def _coerce_2d(x, axis):
    """View of ``x`` as (prod(shape[:axis]), prod(shape[axis:])), as Softmax & co. do before opset 13;
    ``axis`` in [-rank, rank - 1]."""
    if x.ndim and not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis {axis} is out of range for a rank-{x.ndim} input")
    axis = axis % x.ndim if x.ndim else 0
    return x.reshape(int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:])))


def _softmax(x, axis):
    with np.errstate(under="ignore"):
        e = np.exp(x - np.max(x, axis=axis, keepdims=True))
        return e / np.sum(e, axis=axis, keepdims=True)


def _log_softmax(x, axis):
    with np.errstate(under="ignore"):
        shifted = x - np.max(x, axis=axis, keepdims=True)
        return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def _hardmax(x, axis):
    y = np.zeros_like(x)
    if x.size:
        np.put_along_axis(y, np.expand_dims(np.argmax(x, axis=axis), axis), 1, axis=axis)
    return y


@op("Softmax", since=1)
def softmax_1(x, *, axis=1):
    """Softmax-1/11: over the input coerced to 2-D at ``axis`` (every dim from ``axis`` on as one)."""
    return _softmax(_coerce_2d(x, axis), 1).reshape(x.shape)


@op("Softmax", since=13)
def softmax_13(x, *, axis=-1):
    """Softmax-13: exp(x - max) / sum along ``axis`` alone."""
    return _softmax(x, axis)


@op("LogSoftmax", since=1)
def log_softmax_1(x, *, axis=1):
    """LogSoftmax-1/11: over the input coerced to 2-D at ``axis``."""
    return _log_softmax(_coerce_2d(x, axis), 1).reshape(x.shape)


@op("LogSoftmax", since=13)
def log_softmax_13(x, *, axis=-1):
    """LogSoftmax-13: (x - max) - log(sum(exp(x - max))) along ``axis`` alone."""
    return _log_softmax(x, axis)


@op("Hardmax", since=1)
def hardmax_1(x, *, axis=1):
    """Hardmax-1/11: one-hot of the first maximum of the input coerced to 2-D at ``axis``."""
    return _hardmax(_coerce_2d(x, axis), 1).reshape(x.shape)


@op("Hardmax", since=13)
def hardmax_13(x, *, axis=-1):
    """Hardmax-13: one-hot of the first maximum along ``axis``."""
    return _hardmax(x, axis)


@op("Clip", since=6)
def clip_6(x, *, min=-_FLT_MAX, max=_FLT_MAX):  # noqa: A002  (the ONNX attribute names)
    """Clip-6: bounds are attributes, defaulting to the float32 range (inf in float16)."""
    with np.errstate(over="ignore"):
        lo, hi = x.dtype.type(min), x.dtype.type(max)
    return np.minimum(np.maximum(x, lo), hi)


def _check_clip_11(inputs, attrs, outputs):
    for name, bound in zip(("min", "max"), inputs[1:]):
        if bound.shape is not None and (len(bound.shape) > 1 or (bound.shape and bound.shape[0] not in (1, None))):
            raise ValueError(f"{name} has shape {bound.shape}; it must be a scalar")


@op("Clip", since=11, check=_check_clip_11)
def clip_11(x, min=None, max=None, /):  # noqa: A002
    """Clip-11/12/13: bounds are optional scalar inputs (positional-only: never Clip-6's attributes);
    min > max gives max everywhere."""
    for name, bound in (("min", min), ("max", max)):
        if bound is not None and (bound.ndim > 1 or bound.size != 1):
            raise ValueError(f"{name} has shape {bound.shape}; it must be a scalar")
    if min is not None:
        x = np.maximum(x, min)
    if max is not None:
        x = np.minimum(x, max)
    return x
