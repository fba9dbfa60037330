"""The Gauss error function: Erf (https://onnx.ai/onnx/operators/onnx__Erf.html).

numpy has no erf, so :func:`erf` and :func:`erfc` evaluate W. J. Cody's rational Chebyshev
approximations ("Rational Chebyshev approximations for the error function", Math. Comp. 23, 1969;
the coefficients of his SPECFUN routine CALERF) in float64, on three intervals of ``y = |x|``:

* ``y <= 0.46875``: ``erf(x) = x * A(x^2) / B(x^2)``;
* ``0.46875 < y <= 4``: ``erfc(y) = exp(-y^2) * C(y) / D(y)``;
* ``y > 4``: ``erfc(y) = exp(-y^2) / y * (1/sqrt(pi) - z P(z) / Q(z))`` with ``z = 1/y^2``;

and ``erf(x) = sign(x) (1 - erfc(y))``, ``erfc(-y) = 2 - erfc(y)``. ``exp(-y^2)`` is formed as
``exp(-s^2) * exp(-(y - s)(y + s))`` with ``s`` = ``y`` truncated to 1/16, so that squaring ``y``
loses no digits. The relative error is below 1e-15 in float64; float32 and float16 inputs are
evaluated in float64 and rounded once, so they are correctly rounded but for rare near-ties.

The evaluation is branch-free: all three rationals are computed for every element, each on its
argument clamped to its own interval, and the right one is selected. It runs over blocks in one
scratch buffer with in-place ufuncs, since fresh temporaries (page faults) would cost more than
the arithmetic.
"""

from __future__ import annotations

import numpy as np

from ..registry import op

_A = (3.16112374387056560e00, 1.13864154151050156e02, 3.77485237685302021e02,
      3.20937758913846947e03, 1.85777706184603153e-1)
_B = (2.36012909523441209e01, 2.44024637934444173e02, 1.28261652607737228e03,
      2.84423683343917062e03)
_C = (5.64188496988670089e-1, 8.88314979438837594e00, 6.61191906371416295e01,
      2.98635138197400131e02, 8.81952221241769090e02, 1.71204761263407058e03,
      2.05107837782607147e03, 1.23033935479799725e03, 2.15311535474403846e-8)
_D = (1.57449261107098347e01, 1.17693950891312499e02, 5.37181101862009858e02,
      1.62138957456669019e03, 3.29079923573345963e03, 4.36261909014324716e03,
      3.43936767414372164e03, 1.23033935480374942e03)
_P = (3.05326634961232344e-1, 3.60344899949804439e-1, 1.25781726111229246e-1,
      1.60837851487422766e-2, 6.58749161529837803e-4, 1.63153871373020978e-2)
_Q = (2.56852019228982242e00, 1.87295284992346047e00, 5.27905102951428412e-1,
      6.05183413124413191e-2, 2.33520497626869185e-3)
_ONE_OVER_SQRT_PI = 5.6418958354775628695e-1
_SMALL = 0.46875
#: erfc(y) is 0 in float64 for y > 26.6 (and erf(y) is 1 from 6); clamping there keeps inf out.
_ERFC_ZERO = 30.0
#: Elements per pass: the scratch buffer (12 rows of float64) stays about 1.5 MB.
_BLOCK = 16384

# Horner coefficients of (numerator, denominator) of the three intervals, highest power first,
# zero-padded to degree 8: shape (9 powers, 3 intervals, 2, 1).
_COEFS = np.array(
    [
        [(0, 0, 0, 0, _A[4], *_A[:4]), (0, 0, 0, 0, 1.0, *_B)],
        [(_C[8], *_C[:8]), (1.0, *_D)],
        [(0, 0, 0, _P[5], *_P[:5]), (0, 0, 0, 1.0, *_Q)],
    ],
    dtype=np.float64,
).transpose(2, 0, 1)[..., None]


def _block(x, out, w, complement):
    """Write erf(x), or erfc(x) if ``complement``, of the float64 vector ``x`` into ``out``.

    ``w`` is scratch of shape (12, len(x)).
    """
    y, s, yt, t, p = w[0], w[1], w[2], w[3:6], w[6:12].reshape(3, 2, -1)
    np.abs(x, out=y)
    np.clip(x, -_SMALL, _SMALL, out=s)
    np.square(s, out=t[0])  # small interval: in x^2
    np.clip(y, _SMALL, 4.0, out=t[1])  # mid interval: in y
    np.clip(y, 4.0, _ERFC_ZERO, out=yt)
    np.square(yt, out=t[2])
    np.reciprocal(t[2], out=t[2])  # tail: in 1/y^2
    tb = t[:, None, :]
    np.multiply(tb, _COEFS[0], out=p)
    for c in _COEFS[1:-1]:
        p += c
        p *= tb
    p += _COEFS[-1]
    small, mid, tail = p[0, 0], p[1, 0], p[2, 0]
    np.divide(p[:, 0], p[:, 1], out=p[:, 0])
    small *= s  # erf(x) where y <= 0.46875
    tail *= t[2]
    np.subtract(_ONE_OVER_SQRT_PI, tail, out=tail)
    tail /= yt
    np.copyto(mid, tail, where=y > 4.0)  # erfc(y) * exp(y^2) where y > 0.46875
    ye, d, e = yt, t[0], t[1]
    np.clip(y, _SMALL, _ERFC_ZERO, out=ye)
    np.multiply(ye, 16.0, out=s)
    np.trunc(s, out=s)
    s /= 16.0
    np.subtract(ye, s, out=d)
    np.add(ye, s, out=e)
    d *= e
    np.negative(d, out=d)
    mid *= np.exp(d, out=d)
    np.square(s, out=s)
    np.negative(s, out=s)
    mid *= np.exp(s, out=s)  # erfc(y) where y > 0.46875
    if complement:
        np.subtract(2.0, mid, out=e)
        np.copyto(mid, e, where=x < 0)
        np.subtract(1.0, small, out=out)
    else:
        np.subtract(1.0, mid, out=mid)
        np.copysign(mid, x, out=mid)
        np.copyto(out, small)
    np.copyto(out, mid, where=y > _SMALL)  # a NaN stays on the small branch, NaN too


def _evaluate(x, complement):
    x64 = np.asarray(x, dtype=np.float64).reshape(-1)
    out = np.empty_like(x64)
    w = np.empty((12, min(x64.size, _BLOCK)))
    with np.errstate(under="ignore"):
        for i in range(0, x64.size, _BLOCK):
            xb = x64[i:i + _BLOCK]
            _block(xb, out[i:i + _BLOCK], w[:, :xb.size], complement)
        return out.reshape(np.shape(x)).astype(x.dtype, copy=False)


def erf(x: np.ndarray) -> np.ndarray:
    """erf(x) element-wise, in ``x``'s floating dtype (see the module docstring for accuracy)."""
    return _evaluate(x, complement=False)


def erfc(x: np.ndarray) -> np.ndarray:
    """1 - erf(x) element-wise, without cancellation for large x, in ``x``'s floating dtype."""
    return _evaluate(x, complement=True)


@op("Erf", since=9)
def erf_op(x):
    """Erf-9/13: the Gauss error function (13 only added types)."""
    return erf(x)
