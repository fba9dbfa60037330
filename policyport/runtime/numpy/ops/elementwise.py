"""Element-wise arithmetic and math with multidirectional (numpy) broadcasting.

https://onnx.ai/onnx/operators/ — Add, Sub, Mul, Div (opset 7 introduced numpy broadcasting), Neg,
Abs, Exp, Log, Sqrt, Pow, Reciprocal, Erf.
"""

from __future__ import annotations

import math

import numpy as np

from ..registry import op


@op("Add", since=7)
def add(a, b):
    return np.add(a, b)


@op("Sub", since=7)
def sub(a, b):
    return np.subtract(a, b)


@op("Mul", since=7)
def mul(a, b):
    return np.multiply(a, b)


@op("Div", since=7)
def div(a, b):
    """Integer division truncates toward zero, as in C (ONNX Div on integer tensors)."""
    if np.issubdtype(a.dtype, np.integer):
        return (np.trunc(a / b)).astype(a.dtype)
    return np.divide(a, b)


@op("Neg", since=6)
def neg(x):
    return np.negative(x)


@op("Exp", since=6)
def exp(x):
    return np.exp(x)


_erf_scalar = np.frompyfunc(math.erf, 1, 1)


@op("Erf", since=9)
def erf(x):
    """The Gauss error function, element-wise (math.erf, correctly rounded in float64)."""
    return _erf_scalar(x).astype(x.dtype)
