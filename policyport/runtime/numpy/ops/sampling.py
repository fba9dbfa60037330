"""Random generators and samplers: RandomNormal(Like), RandomUniform(Like), Multinomial, Bernoulli.

https://onnx.ai/onnx/operators/onnx__RandomNormal.html, onnx__RandomNormalLike.html,
onnx__RandomUniform.html, onnx__RandomUniformLike.html, onnx__Multinomial.html,
onnx__Bernoulli.html. Their only later versions (22) added element types.

Each op draws from the ``numpy.random.Generator`` it receives as ``rng``: the plan passes the
session's generator, or, when the node has a ``seed`` attribute, a generator of the node's own
seeded with it (:func:`~policyport.runtime.numpy.plan.node_generator`); the ``seed`` parameter
itself is therefore not read here. The ONNX project's reference implementation and onnxruntime use
other generators, so the same seed draws other numbers there: only the distributions agree.

``dtype`` is a ``TensorProto`` element type code. Floating results are drawn in float32 or float64
(float16 and bfloat16 are drawn in float32 and rounded once).
"""

from __future__ import annotations

import numpy as np

from ....io.limits import check_tensor_shape
from ....graph.model import onnx_dtype
from ..registry import op


def _floating(dtype) -> np.dtype:
    if not (np.issubdtype(dtype, np.floating) or dtype.name == "bfloat16"):
        raise ValueError(f"random values are floating point; dtype {dtype.name} is not")
    return dtype


def _like(x, dtype) -> np.dtype:
    """The element type of a ``*Like`` op's output: ``dtype`` if given, else the input's."""
    return x.dtype if dtype is None else onnx_dtype(dtype)


def _draw_dtype(dtype):
    return dtype if dtype in (np.float32, np.float64) else np.dtype(np.float32)


def _normal(shape, dtype, mean, scale, rng):
    shape = check_tensor_shape(shape, _draw_dtype(dtype))  # drawn at least as wide as dtype
    values = rng.standard_normal(shape, dtype=_draw_dtype(dtype))
    return (values * scale + mean).astype(dtype, copy=False)


def _uniform(shape, dtype, low, high, rng):
    work = _draw_dtype(dtype)
    shape = check_tensor_shape(shape, work)
    values = (rng.random(shape, dtype=work) * (high - low) + low).astype(dtype, copy=False)
    if high > low:  # rounding low + (high - low) * u can reach high; the range is [low, high)
        top = np.nextafter(np.array(high, dtype=work), np.array(low, dtype=work)).astype(dtype)
        values = np.minimum(values, top)
    return values


@op("RandomNormal", since=1)
def random_normal(*, shape, dtype=1, mean=0.0, scale=1.0, seed=None, rng):
    """Samples of N(mean, scale^2) of shape ``shape`` and element type ``dtype`` (default float32)."""
    return _normal(shape, _floating(onnx_dtype(dtype)), mean, scale, rng)


@op("RandomNormalLike", since=1)
def random_normal_like(x, *, dtype=None, mean=0.0, scale=1.0, seed=None, rng):
    """Samples of N(mean, scale^2) with x's shape; element type ``dtype``, by default x's."""
    return _normal(x.shape, _floating(_like(x, dtype)), mean, scale, rng)


@op("RandomUniform", since=1)
def random_uniform(*, shape, dtype=1, high=1.0, low=0.0, seed=None, rng):
    """Samples of the uniform distribution on [low, high) of shape ``shape`` (default float32)."""
    return _uniform(shape, _floating(onnx_dtype(dtype)), low, high, rng)


@op("RandomUniformLike", since=1)
def random_uniform_like(x, *, dtype=None, high=1.0, low=0.0, seed=None, rng):
    """Samples of the uniform distribution on [low, high) with x's shape; type ``dtype``, default x's."""
    return _uniform(x.shape, _floating(_like(x, dtype)), low, high, rng)


@op("Multinomial", since=7)
def multinomial(x, *, dtype=6, sample_size=1, seed=None, rng):
    """``sample_size`` class indices per row, drawn with replacement.

    Args:
        x: (batch, classes) unnormalized log-probabilities: class k of row b is drawn with
            probability exp(x[b, k]) / sum_j exp(x[b, j]), so a class at -inf (or so far below the
            row's maximum that exp underflows in float64) is never drawn.
        dtype: int32 (6, the default) or int64 (7).

    Returns:
        (batch, sample_size) indices. A row without a finite maximum (all -inf, +inf or NaN) draws 0.
    """
    out = onnx_dtype(dtype)
    if out not in (np.int32, np.int64):
        raise ValueError(f"Multinomial's dtype must be int32 or int64, not {out.name}")
    logits = np.asarray(x, dtype=np.float64)
    if logits.ndim != 2:
        raise ValueError(f"Multinomial takes (batch, classes) log-probabilities, got shape {x.shape}")
    classes = logits.shape[1]
    # the largest arrays: (batch, sample_size, classes) booleans below, (batch, sample_size) float64 targets
    check_tensor_shape((logits.shape[0], sample_size, max(classes, np.dtype(np.float64).itemsize)), np.bool_)
    with np.errstate(under="ignore", invalid="ignore"):
        weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    cdf = np.cumsum(weights, axis=1)
    target = rng.random((logits.shape[0], sample_size)) * cdf[:, -1:]
    # the class whose cumulative-weight interval holds the target; equal neighbours (weight 0) are skipped
    index = (cdf[:, None, :] <= target[:, :, None]).sum(axis=2)
    last_possible = classes - 1 - np.argmax(weights[:, ::-1] > 0, axis=1)  # target rounded up to the total
    index = np.where(np.isfinite(cdf[:, -1:]), np.minimum(index, last_possible[:, None]), 0)
    return index.astype(out)


@op("Bernoulli", since=15)
def bernoulli(x, *, dtype=None, seed=None, rng):
    """1 with probability x, else 0, element-wise; element type ``dtype``, by default x's.

    x: probabilities, any shape (values below 0 never draw 1, values above 1 always do).
    """
    return (rng.random(x.shape) < x).astype(_like(x, dtype))
