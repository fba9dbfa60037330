"""Matrix products: Gemm, MatMul, Einsum.

https://onnx.ai/onnx/operators/onnx__Gemm.html, onnx__MatMul.html, onnx__Einsum.html
"""

from __future__ import annotations

import numpy as np

from ....graph import ML_DTYPE_NAMES
from ..registry import op


def check_gemm_operands(a_rank, b_rank, c_shape, n: int | None) -> None:
    """A and B are matrices; C broadcasts to (M, N) in one direction (its dims 1, or M and N)."""
    for name, rank in (("A", a_rank), ("B", b_rank)):
        if rank is not None and rank != 2:
            raise ValueError(f"{name} has rank {rank}; Gemm multiplies matrices (rank 2)")
    if c_shape is not None:
        if len(c_shape) > 2:
            raise ValueError(f"C of shape {tuple(c_shape)} does not broadcast to (M, N)")
        if n is not None and c_shape and c_shape[-1] not in (1, n, None):
            raise ValueError(f"C of shape {tuple(c_shape)} does not broadcast to (M, {n})")


def _check_gemm(inputs, attrs, outputs):
    b = inputs[1]
    n = b.dim(0 if attrs.get("transB", 0) else 1)
    c_shape = inputs[2].shape if len(inputs) > 2 else None
    check_gemm_operands(inputs[0].rank, b.rank, c_shape, n)


@op("Gemm", since=7, check=_check_gemm)
def gemm(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):  # noqa: N803  (ONNX names)
    """Y = alpha * A' @ B' + beta * C; A' = A.T if transA, B' = B.T if transB; C broadcasts to (M, N).

    Gemm-7 replaced the ``broadcast`` attribute by unidirectional broadcasting of C; C is optional
    from 11, which one function serves. Integer Gemm (from 9) keeps its integer type.
    """
    check_gemm_operands(a.ndim, b.ndim, None if c is None else c.shape, None)
    y = np.matmul(a.T if transA else a, b.T if transB else b)
    if alpha != 1.0:
        y = (alpha * y).astype(a.dtype, copy=False)
    if c is not None:
        if np.broadcast_shapes(c.shape, y.shape) != y.shape:
            raise ValueError(f"C of shape {c.shape} does not broadcast to {y.shape}")
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
