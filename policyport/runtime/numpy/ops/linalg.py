"""Matrix products: Gemm, MatMul, Einsum.

https://onnx.ai/onnx/operators/onnx__Gemm.html, onnx__MatMul.html, onnx__Einsum.html
"""

from __future__ import annotations

import numpy as np

from ....io.limits import check_tensor_shape
from ....graph.model import ML_DTYPE_NAMES
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
    equation = equation.replace(" ", "")
    shape = einsum_shape(equation, [a.shape for a in inputs])
    if shape is not None:  # an outer product ("i,j->ij") is larger than its inputs
        check_tensor_shape(shape, np.float32 if dtype.name in ML_DTYPE_NAMES else np.result_type(*inputs))
    if dtype.name in ML_DTYPE_NAMES:
        wide = [a.astype(np.float32) for a in inputs]
        return np.asarray(np.einsum(equation, *wide)).astype(dtype)
    return np.einsum(equation, *inputs)


def einsum_shape(equation: str, shapes: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    """The output shape of ``numpy.einsum(equation, *arrays of shapes)``, or None when the equation
    does not fit the shapes (numpy then says what is wrong).

    A label's size is its largest (a size of 1 broadcasts); the ellipsis stands for the broadcast of
    the dims it covers in each operand. Without ``->`` the output is the ellipsis, then the labels
    used once, sorted (numpy's implicit mode).
    """
    inputs, arrow, output = equation.partition("->")
    terms = inputs.split(",")
    if len(terms) != len(shapes):
        return None
    sizes: dict[str, int] = {}
    counts: dict[str, int] = {}
    broadcast: tuple[int, ...] = ()
    try:
        for term, shape in zip(terms, shapes):
            labels = term.replace("...", ".")
            if "." in labels:
                k, covered = labels.index("."), len(shape) - len(labels) + 1
                broadcast = np.broadcast_shapes(broadcast, shape[k:k + covered])
                labels, shape = labels.replace(".", ""), shape[:k] + shape[k + covered:]
            if len(labels) != len(shape) or not (labels.isalpha() or not labels):
                return None
            for label, size in zip(labels, shape):
                sizes[label] = max(sizes.get(label, 1), size)
                counts[label] = counts.get(label, 0) + 1
    except ValueError:
        return None
    if not arrow:
        output = ("..." if "..." in inputs else "") + "".join(sorted(l for l, c in counts.items() if c == 1))
    labels = output.replace("...", ".")
    if any(l != "." and l not in sizes for l in labels):
        return None
    return tuple(d for l in labels for d in (broadcast if l == "." else (sizes[l],)))
