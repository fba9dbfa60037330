"""Comparisons and boolean logic, with multidirectional (numpy) broadcasting.

https://onnx.ai/onnx/operators/ — Equal, Greater, Less, And, Or took numpy broadcasting at opset 7
(before it a ``broadcast`` attribute); later versions only add element types.
"""

from __future__ import annotations

import numpy as np

from ..registry import op


@op("Equal", since=7)
def equal(a, b):
    return np.equal(a, b)


@op("Greater", since=7)
def greater(a, b):
    return np.greater(a, b)


@op("Less", since=7)
def less(a, b):
    return np.less(a, b)


@op("GreaterOrEqual", since=12)
def greater_or_equal(a, b):
    return np.greater_equal(a, b)


@op("LessOrEqual", since=12)
def less_or_equal(a, b):
    return np.less_equal(a, b)


@op("Not", since=1)
def not_(x):
    return np.logical_not(x)


@op("And", since=7)
def and_(a, b):
    return np.logical_and(a, b)


@op("Or", since=7)
def or_(a, b):
    return np.logical_or(a, b)
