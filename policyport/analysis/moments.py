"""Per-neuron running statistics of a stream of blocks, in one pass, numerically stable, mergeable.

Each block's moments are computed in float64 and merged into the running ones with the pairwise
update of Chan, Golub and LeVeque ("Updating formulae and a pairwise algorithm for computing sample
variances", 1979): for counts ``n_a, n_b``, means ``m_a, m_b`` and sums of squared deviations
``M2_a, M2_b``, with ``d = m_b - m_a`` and ``n = n_a + n_b``::

    m  = m_a + d * n_b / n
    M2 = M2_a + M2_b + d**2 * n_a * n_b / n

so the result does not depend on how the rows were split into blocks (up to rounding), and moments
computed on different workers merge into the same statistics. Moments run over the finite values of
each neuron; NaN and infinite values are counted apart. Needs numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: What "saturated" means per activation: the op type of the node that made the tensor -> test.
SATURATION = {
    "Tanh": "|x| > 0.99",
    "Sigmoid": "x < 0.01 or x > 0.99",
}
_FIELDS = ("count", "mean", "m2", "minimum", "maximum", "nan", "inf", "active", "saturated")
#: Bytes the running statistics of one neuron hold: nine 8-byte numbers.
STATE_BYTES = 8 * len(_FIELDS)
#: Bytes per neuron that adding a block takes beside the running statistics and the block's values:
#: the block's own moments and the merge's temporaries (peak 209 bytes per neuron with the state,
#: measured with tracemalloc on a one-row block holding a NaN, the costlier path).
MERGE_BYTES = 140
#: Bytes per value of a block that :meth:`Moments.of_block` holds at its peak beside the block itself:
#: its float64 copy, the finite mask, the squared deviations (33.1 measured as above).
BLOCK_BYTES = 34


@dataclass
class Moments:
    """Running statistics of one tensor, per neuron (an element of a row, in C order).

    Attributes (float64 or int64 arrays of shape ``(neurons,)``):
        count: finite values seen; mean, m2: their mean and sum of squared deviations;
        minimum, maximum: their extremes (``nan`` while ``count`` is 0);
        nan, inf: NaN and ±inf values seen; active: finite values ``> 0``;
        saturated: finite values in the saturated range of ``saturation``.
        rows: rows seen; saturation: ``"Tanh"``, ``"Sigmoid"`` or None (no saturated range).
    """

    count: np.ndarray
    mean: np.ndarray
    m2: np.ndarray
    minimum: np.ndarray
    maximum: np.ndarray
    nan: np.ndarray
    inf: np.ndarray
    active: np.ndarray
    saturated: np.ndarray
    rows: int = 0
    saturation: str | None = None

    @classmethod
    def empty(cls, neurons: int, saturation: str | None = None) -> Moments:
        """No rows seen yet."""
        z = lambda dtype: np.zeros(neurons, dtype)  # noqa: E731
        nan = np.full(neurons, np.nan)
        return cls(z(np.int64), z(np.float64), z(np.float64), nan, nan.copy(), z(np.int64), z(np.int64),
                   z(np.int64), z(np.int64), 0, saturation if saturation in SATURATION else None)

    @classmethod
    def of_block(cls, block: np.ndarray, saturation: str | None = None) -> Moments:
        """The moments of one block ``(rows, *shape)`` of any real dtype, computed in float64."""
        block = np.asarray(block)
        rows = len(block)
        x = block.reshape(rows, int(np.prod(block.shape[1:], dtype=np.int64))).astype(np.float64)
        sat = saturation if saturation in SATURATION else None
        finite = np.isfinite(x)
        if finite.all():
            count = np.full(x.shape[1], rows, np.int64)
            mean = x.mean(axis=0) if rows else np.zeros(x.shape[1])
            m2 = ((x - mean) ** 2).sum(axis=0)
            with np.errstate(invalid="ignore"):
                minimum = x.min(axis=0) if rows else np.full(x.shape[1], np.nan)
                maximum = x.max(axis=0) if rows else np.full(x.shape[1], np.nan)
            nan = inf = np.zeros(x.shape[1], np.int64)
            valid = x
        else:
            count = finite.sum(axis=0)
            valid = np.where(finite, x, 0.0)
            with np.errstate(invalid="ignore", divide="ignore"):
                mean = np.where(count > 0, valid.sum(axis=0) / np.maximum(count, 1), 0.0)
            m2 = (np.where(finite, x - mean, 0.0) ** 2).sum(axis=0)
            minimum = np.where(count > 0, np.where(finite, x, np.inf).min(axis=0), np.nan)
            maximum = np.where(count > 0, np.where(finite, x, -np.inf).max(axis=0), np.nan)
            nan = np.isnan(x).sum(axis=0)
            inf = np.isinf(x).sum(axis=0)
        active = (valid > 0).sum(axis=0)
        if sat == "Tanh":
            saturated = (np.abs(valid) > 0.99).sum(axis=0)
        elif sat == "Sigmoid":
            saturated = ((valid < 0.01) & finite | (valid > 0.99)).sum(axis=0)
        else:
            saturated = np.zeros(x.shape[1], np.int64)
        return cls(count.astype(np.int64), mean, m2, minimum, maximum, nan.astype(np.int64), inf.astype(np.int64),
                   active.astype(np.int64), saturated.astype(np.int64), rows, sat)

    def update(self, block: np.ndarray) -> None:
        """Add the rows of ``block`` ``(rows, *shape)``."""
        self.merge(Moments.of_block(block, self.saturation))

    def merge(self, other: Moments) -> None:
        """Add the rows ``other`` has seen (Chan et al.'s pairwise update, see the module docstring)."""
        n_a, n_b = self.count.astype(np.float64), other.count.astype(np.float64)
        n = n_a + n_b
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(n > 0, n_b / np.where(n > 0, n, 1), 0.0)
            delta = other.mean - self.mean
            self.mean = np.where(n_b > 0, self.mean + delta * share, self.mean)
            self.m2 = self.m2 + other.m2 + np.where(n_b > 0, delta ** 2 * n_a * share, 0.0)
        self.minimum = np.fmin(self.minimum, other.minimum)
        self.maximum = np.fmax(self.maximum, other.maximum)
        self.count = self.count + other.count
        for name in ("nan", "inf", "active", "saturated"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.rows += other.rows

    @property
    def std(self) -> np.ndarray:
        """Population standard deviation (``ddof=0``) of the finite values; nan where none."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.count > 0, np.sqrt(self.m2 / np.maximum(self.count, 1)), np.nan)

    def pooled(self) -> Moments:
        """The moments of all neurons together, as one neuron: a layer's figures (the same update
        for many parts at once: ``M2 = sum M2_i + sum n_i (m_i - m)**2``)."""
        n = self.count.sum()
        mean = float((self.count * self.mean).sum() / n) if n else 0.0
        m2 = float(self.m2.sum() + (self.count * (self.mean - mean) ** 2).sum())
        one = lambda v: np.array([v])  # noqa: E731
        with np.errstate(invalid="ignore"):
            lo, hi = (np.nanmin(self.minimum), np.nanmax(self.maximum)) if n else (np.nan, np.nan)
        return Moments(one(n), one(mean), one(m2), one(lo), one(hi), *(one(getattr(self, f).sum()) for f in _FIELDS[5:]),
                       self.rows, self.saturation)

    def to_state(self) -> dict[str, np.ndarray]:
        """Plain arrays (for shipping between processes); :meth:`from_state` rebuilds the object."""
        return {**{f: getattr(self, f) for f in _FIELDS}, "rows": np.int64(self.rows),
                "saturation": np.array(self.saturation or "")}

    @classmethod
    def from_state(cls, state: dict) -> Moments:
        return cls(*(np.asarray(state[f]) for f in _FIELDS), int(state["rows"]), str(state["saturation"]) or None)
