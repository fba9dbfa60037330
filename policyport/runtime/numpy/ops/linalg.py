"""Matrix products: Gemm and MatMul (https://onnx.ai/onnx/operators/onnx__Gemm.html, onnx__MatMul.html)."""

from __future__ import annotations

import numpy as np

from ..registry import op


@op("Gemm", since=7)
def gemm(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    """Y = alpha * A' @ B' + beta * C; A' = A.T if transA, B' = B.T if transB; C broadcasts to (M, N).

    C is optional from opset 11; before it a graph always supplies it, so one function serves 7 on.
    """
    y = np.matmul(a.T if transA else a, b.T if transB else b)
    if alpha != 1.0:
        y = y * np.asarray(alpha, dtype=y.dtype)
    if c is not None:
        y = y + (c if beta == 1.0 else c * np.asarray(beta, dtype=c.dtype))
    return y


@op("MatMul", since=1)
def matmul(a, b):
    """numpy.matmul semantics, including 1-D promotion and batch broadcasting."""
    return np.matmul(a, b)
