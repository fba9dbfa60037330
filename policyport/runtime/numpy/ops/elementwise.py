"""Element-wise arithmetic and math with multidirectional (numpy) broadcasting.

https://onnx.ai/onnx/operators/ — each op's page. Add, Sub, Mul, Div, Pow gained numpy broadcasting
at opset 7 (before it they had a ``broadcast`` attribute); the unary ops dropped their legacy
``consumed_inputs`` attribute at 6; the variadic Min, Max, Sum, Mean broadcast from 8 (before it
their inputs had one shape, which broadcasting covers). Later versions only add element types.
"""

from __future__ import annotations

import functools

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
    """Integer division truncates toward zero, as in C; computed in integers (exact for int64)."""
    if np.issubdtype(a.dtype, np.integer):
        q, r = np.divmod(a, b)
        return q + ((r != 0) & ((a < 0) ^ (b < 0))).astype(q.dtype)
    return np.divide(a, b)


@op("Pow", since=7)
def pow_(a, b):
    """Pow-7/12/13/15: the output has the base's type, whatever the exponent's (types differ from 12)."""
    return np.power(a, b).astype(a.dtype, copy=False)


@op("Neg", since=6)
def neg(x):
    return np.negative(x)


@op("Abs", since=6)
def abs_(x):
    return np.absolute(x)


@op("Exp", since=6)
def exp(x):
    return np.exp(x)


@op("Log", since=6)
def log(x):
    """log(0) is -inf without a divide-by-zero warning; log(x < 0) is NaN and still warns."""
    with np.errstate(divide="ignore"):
        return np.log(x)


@op("Sqrt", since=6)
def sqrt(x):
    return np.sqrt(x)


@op("Reciprocal", since=6)
def reciprocal(x):
    return np.reciprocal(x)


@op("Sign", since=9)
def sign(x):
    return np.sign(x)


@op("Floor", since=6)
def floor(x):
    return np.floor(x)


@op("Ceil", since=6)
def ceil(x):
    return np.ceil(x)


@op("Round", since=11)
def round_(x):
    """Halves round to the nearest even integer (numpy.rint)."""
    return np.rint(x)


@op("Min", since=6)
def min_(*inputs):
    return functools.reduce(np.minimum, inputs)


@op("Max", since=6)
def max_(*inputs):
    return functools.reduce(np.maximum, inputs)


@op("Sum", since=6)
def sum_(*inputs):
    return functools.reduce(np.add, inputs)


@op("Mean", since=6)
def mean(*inputs):
    return functools.reduce(np.add, inputs) / len(inputs)
