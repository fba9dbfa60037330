"""Matrix products: Gemm, MatMul, Einsum.

https://onnx.ai/onnx/operators/onnx__Gemm.html, onnx__MatMul.html, onnx__Einsum.html
"""

from __future__ import annotations

import numpy as np

from ....graph import ML_DTYPE_NAMES
from ..registry import op


@op("Gemm", since=7)
def gemm(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):  # noqa: N803  (ONNX names)
    """Y = alpha * A' @ B' + beta * C; A' = A.T if transA, B' = B.T if transB; C broadcasts to (M, N).

    Gemm-7 replaced the ``broadcast`` attribute by unidirectional broadcasting of C; C is optional
    from 11, which one function serves. Integer Gemm (from 9) keeps its integer type.
    """
    y = np.matmul(a.T if transA else a, b.T if transB else b)
    if alpha != 1.0:
        y = (alpha * y).astype(a.dtype, copy=False)
    if c is not None:
        y = y + (c if beta == 1.0 else (beta * c).astype(c.dtype, copy=False))
    return y


@op("MatMul", since=1)
def matmul(a, b):
    """numpy.matmul semantics, including 1-D promotion and batch broadcasting."""
    return np.matmul(a, b)


@op("Einsum", since=12)
def einsum(*inputs, equation):
    """numpy.einsum on the equation with its spaces removed (ONNX allows ``"ij, jk -> ik"``).

    numpy cannot contract ml_dtypes types (bfloat16 ...): they accumulate in float32 and are
    rounded once, as the ONNX reference does.
    """
    dtype = inputs[0].dtype
    if dtype.name in ML_DTYPE_NAMES:
        wide = [a.astype(np.float32) for a in inputs]
        return np.asarray(np.einsum(equation.replace(" ", ""), *wide)).astype(dtype)
    return np.einsum(equation.replace(" ", ""), *inputs)
