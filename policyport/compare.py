"""The comparison rule: one tensor of a candidate against the same tensor of a reference.

An element passes when ``|candidate - reference| <= atol + rtol * |reference|`` (numpy.isclose's
rule); NaN matches NaN only at the same position. A :class:`Report` gathers the comparisons of one
verification run. Needs numpy only, so a packed folder can verify itself on a numpy-only machine.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

DEFAULT_ATOL = 1e-5
DEFAULT_RTOL = 1e-5


@dataclass(frozen=True)
class Comparison:
    """One tensor, one candidate against one reference.

    ``max_abs`` is the largest absolute difference; ``max_rel`` the largest ``|diff| / |reference|``
    over elements whose reference is non-zero (0 when there are none); both ``inf`` on a shape or
    NaN-pattern mismatch, which ``detail`` then describes.
    """

    tensor: str
    candidate: str
    reference: str
    shape: tuple[int, ...]
    dtype: str
    max_abs: float
    max_rel: float
    passed: bool
    detail: str = ""


@dataclass
class Report:
    """The outcome of :func:`verify`. ``passed`` is true when every comparison passed."""

    backends: list[str]
    reference: str | None
    samples: int
    atol: float
    rtol: float
    comparisons: list[Comparison] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.comparisons)

    @property
    def first_divergence(self) -> Comparison | None:
        """The first failing comparison in node order, or ``None``."""
        return next((c for c in self.comparisons if not c.passed), None)

    def worst(self, reference: str | None = None) -> float:
        """The largest ``max_abs`` over comparisons (against ``reference`` only, if given)."""
        values = [c.max_abs for c in self.comparisons if reference in (None, c.reference)]
        return max(values, default=0.0)

    def to_dict(self) -> dict:
        """JSON-ready form: settings, ``passed``, ``first_divergence`` and every comparison."""
        first = self.first_divergence
        return {
            "passed": self.passed,
            "backends": self.backends,
            "source": self.reference,
            "samples": self.samples,
            "atol": self.atol,
            "rtol": self.rtol,
            "first_divergence": None if first is None else _json(asdict(first)),
            "comparisons": [_json(asdict(c)) for c in self.comparisons],
        }


def _json(d: dict) -> dict:
    d["shape"] = list(d["shape"])
    for k in ("max_abs", "max_rel"):
        if not np.isfinite(d[k]):
            d[k] = str(d[k])
    return d


def compare(tensor: str, candidate: str, a: np.ndarray, reference: str, b: np.ndarray,
            atol: float, rtol: float) -> Comparison:
    """Compare array ``a`` (from ``candidate``) with ``b`` (from ``reference``); see the module rule."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return Comparison(tensor, candidate, reference, tuple(a.shape), a.dtype.name, float("inf"), float("inf"),
                          False, f"shape {tuple(a.shape)} vs {tuple(b.shape)}")
    if a.size == 0:
        return Comparison(tensor, candidate, reference, a.shape, a.dtype.name, 0.0, 0.0, True)
    af, bf = a.astype(np.float64), b.astype(np.float64)
    nan_a, nan_b = np.isnan(af), np.isnan(bf)
    if (nan_a != nan_b).any():
        return Comparison(tensor, candidate, reference, a.shape, a.dtype.name, float("inf"), float("inf"), False,
                          f"NaN in {int((nan_a & ~nan_b).sum())} places of {candidate} only, "
                          f"{int((nan_b & ~nan_a).sum())} of {reference} only")
    ok = ~nan_a
    same_inf = np.isinf(af) & (af == bf)
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf is masked out just below
        diff = np.where(ok & ~same_inf, np.abs(af - bf), 0.0)
    scale = np.abs(np.where(ok, bf, 0.0))
    nonzero = scale > 0
    max_rel = float((diff[nonzero] / scale[nonzero]).max()) if nonzero.any() else 0.0
    passed = bool((diff <= atol + rtol * np.where(np.isinf(scale), 0.0, scale)).all())
    return Comparison(tensor, candidate, reference, a.shape, a.dtype.name, float(diff.max()), max_rel, passed)
