"""Activation functions (https://onnx.ai/onnx/operators/, each op's own page for its formula)."""

from __future__ import annotations

import numpy as np

from ..registry import op


@op("Relu", since=6)
def relu(x):
    return np.maximum(x, x.dtype.type(0))


@op("Tanh", since=6)
def tanh(x):
    return np.tanh(x)


@op("Sigmoid", since=6)
def sigmoid(x):
    """1 / (1 + exp(-x)), computed without overflow for large |x|."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)


@op("Softplus", since=1)
def softplus(x):
    """log(1 + exp(x)), computed as logaddexp(0, x) to stay finite for large x."""
    return np.logaddexp(x.dtype.type(0), x)


@op("Elu", since=6)
def elu(x, *, alpha=1.0):
    return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0))).astype(x.dtype, copy=False)


@op("Selu", since=6)
def selu(x, *, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
    return (gamma * np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))).astype(x.dtype, copy=False)


@op("LeakyRelu", since=6)
def leaky_relu(x, *, alpha=0.01):
    return np.where(x >= 0, x, x * x.dtype.type(alpha))


@op("Gelu", since=20)
def gelu(x, *, approximate="none"):
    """Gelu-20: x * Phi(x), or its tanh approximation when ``approximate="tanh"``."""
    from .elementwise import erf

    if approximate == "tanh":
        c = x.dtype.type(np.sqrt(2 / np.pi))
        return (0.5 * x * (1 + np.tanh(c * (x + x.dtype.type(0.044715) * x**3)))).astype(x.dtype, copy=False)
    return (0.5 * x * (1 + erf(x / x.dtype.type(np.sqrt(2))))).astype(x.dtype, copy=False)
