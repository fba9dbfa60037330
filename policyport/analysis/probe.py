"""Linear probes: how much of a label each recorded layer encodes linearly.

For every selected tensor of a recording, a linear model is fitted from the tensor's activations
(each row flattened to a feature vector) to a label per observation, on a random part of the rows,
and scored on the rest (held out):

* ``ridge``: ridge regression, scikit-learn's ``RidgeCV`` (the penalty picked among
  ``1e-4 ... 1e4`` by efficient leave-one-out cross-validation on the training rows) after
  ``StandardScaler``; the score is the held-out coefficient of determination R²
  (``sklearn.metrics.r2_score``, averaged uniformly over the columns of a 2-D label). 1 is a
  perfect linear read-out; 0 is no better than predicting the mean; below 0 is worse.
* ``logistic``: logistic regression (``LogisticRegression``, L2 penalty ``C=1``, multinomial for
  more than two classes) after ``StandardScaler``; the score is the held-out accuracy, beside the
  chance level (the share of the most common class among the held-out rows).

This is the linear probe of Alain & Bengio, "Understanding intermediate layers using linear
classifier probes" (2016), as circrl and rl_interrogate fit it on policy rollouts. The probes need
scikit-learn (the ``probe`` extra). Each tensor's rows are held in memory while its probe is fitted
(scikit-learn fits in memory), one tensor at a time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import InputMismatchError, OptionError, listing, require

#: Probe kinds: ``ridge`` (R²) and ``logistic`` (accuracy).
KINDS = ("ridge", "logistic")
#: The penalties ``RidgeCV`` chooses among.
RIDGE_ALPHAS = tuple(10.0 ** k for k in range(-4, 5))


@dataclass
class ProbeScore:
    """The probe of one tensor.

    Attributes:
        name: the recorded tensor; features: its values per observation (the row flattened).
        score: held-out R² (ridge) or accuracy (logistic); train_score: the same on the training rows.
        penalty: the ridge penalty ``alpha`` chosen, or the logistic inverse penalty ``C``.
    """

    name: str
    features: int
    score: float
    train_score: float
    penalty: float


@dataclass
class Probes:
    """What :func:`probe` found.

    Attributes:
        kind: ``"ridge"`` or ``"logistic"``; metric: ``"r2"`` or ``"accuracy"``.
        rows, train_rows, test_rows: observations in all, fitted on, scored on.
        tensors: one :class:`ProbeScore` per selected tensor, in the recording's order.
        chance: logistic only: the accuracy of always answering the held-out rows' most common class.
        seed: the seed of the split.
    """

    kind: str
    metric: str
    rows: int
    train_rows: int
    test_rows: int
    tensors: list[ProbeScore] = field(default_factory=list)
    chance: float | None = None
    seed: int = 0

    def to_dict(self) -> dict:
        """JSON-ready: per tensor its held-out ``score``."""
        doc = {"kind": self.kind, "metric": self.metric, "rows": self.rows, "train_rows": self.train_rows,
               "test_rows": self.test_rows, "seed": self.seed,
               "tensors": [{"name": t.name, "features": t.features, "score": t.score, "train_score": t.train_score,
                            "penalty": t.penalty} for t in self.tensors]}
        if self.chance is not None:
            doc["chance"] = self.chance
        return doc


def read_labels(path, rows: int, kind: str) -> np.ndarray:
    """The labels of ``path`` (an ``.npy``, or an ``.npz`` holding one array): one per observation.

    Returns:
        ridge: float64 array, shape (rows,) or (rows, k); logistic: the array as stored, shape (rows,).

    Raises:
        UnreadableFileError: not a readable npy/npz.
        InputMismatchError: several arrays; another number of rows than the recording; non-finite
            ridge labels; logistic labels that are not classes (integers, bools or strings) or not 1-D.
    """
    from ..io.arrays import load_arrays

    arrays = load_arrays(path)
    if len(arrays) != 1:
        raise InputMismatchError(f"{path} holds {len(arrays)} arrays [{listing(arrays)}]; the labels are one array")
    y = next(iter(arrays.values()))
    if y.ndim == 0 or len(y) != rows:
        raise InputMismatchError(f"{path} holds {y.shape[0] if y.ndim else 'a scalar, no'} labels and the recording "
                                 f"{rows:,} observations; give one label per observation, in the recording's order")
    if kind == "ridge":
        if y.dtype.kind not in "biuf" or y.ndim > 2:
            raise InputMismatchError(f"{path}: a ridge probe fits numbers of shape (rows,) or (rows, k); the labels "
                                     f"are {y.dtype.name}{tuple(y.shape)}")
        y = y.astype(np.float64)
        if not np.isfinite(y).all():
            raise InputMismatchError(f"{path}: {int((~np.isfinite(y)).sum()):,} labels are NaN or infinite")
        return y
    if y.ndim != 1 or y.dtype.kind not in "biuUS":
        raise InputMismatchError(f"{path}: a logistic probe fits classes, one integer, bool or string per observation; "
                                 f"the labels are {y.dtype.name}{tuple(y.shape)} (fit numbers with --kind ridge)")
    if len(np.unique(y)) < 2:
        raise InputMismatchError(f"{path}: every label is {y[0]!r}; a classifier needs two classes at least")
    return y


def probe(recording, labels, *, tensors=None, kind: str = "ridge", test_fraction: float = 0.25,
          seed: int = 0) -> Probes:
    """Fit a linear probe per recorded tensor and score it on held-out rows (see the module docstring).

    Args:
        recording: a recording (``.npz``, ``.parquet`` or a folder; :func:`~policyport.analysis.open_recording`).
        labels: a path to an ``.npy`` with one label per observation of the recording, in its order
            (ridge: numbers, shape (rows,) or (rows, k); logistic: classes, shape (rows,)), or the array.
        tensors: ``fnmatch`` globs over the recorded tensors (default all).
        kind: ``"ridge"`` (default) or ``"logistic"``.
        test_fraction: the share of rows held out for the score (default 0.25), drawn at random
            with ``seed`` (``sklearn.model_selection.train_test_split``); the same rows for every tensor.
        seed: the seed of the split (default 0).

    Returns:
        A :class:`Probes`.

    Raises:
        OptionError: an unknown kind, a test fraction outside (0, 1), a split that leaves a side
            with fewer than 2 rows (exit 2).
        InputMismatchError: labels that do not fit (see :func:`read_labels`), a pattern that
            matches no tensor, a tensor with NaN or infinite values, a training part with one class.
        UnreadableFileError: an unreadable recording or labels file.
        MissingDependencyError: scikit-learn is missing (the ``probe`` extra).
    """
    if kind not in KINDS:
        raise OptionError(f"unknown probe kind {kind!r} (--kind, kind=); choose one of {', '.join(KINDS)}")
    if not 0 < test_fraction < 1:
        raise OptionError(f"the held-out fraction (--test-fraction, test_fraction=) must be between 0 and 1, "
                          f"got {test_fraction}")
    require("sklearn", "probe", "fitting linear probes")
    from sklearn.linear_model import LogisticRegression, RidgeCV
    from sklearn.metrics import accuracy_score, r2_score
    from sklearn.model_selection import train_test_split
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from .recording import open_recording

    rec = open_recording(recording)
    names = rec.select(tensors)
    if isinstance(labels, (str, os.PathLike)):
        y = read_labels(labels, rec.rows, kind)
    else:
        y = np.asarray(labels)
        if len(y) != rec.rows:
            raise InputMismatchError(f"{len(y):,} labels for {rec.rows:,} observations; give one per observation")
    test_rows = int(np.ceil(rec.rows * test_fraction))
    if test_rows < 2 or rec.rows - test_rows < 2:
        raise OptionError(f"{rec.rows:,} observations held out at {test_fraction:g} leave {rec.rows - test_rows} to fit "
                          f"and {test_rows} to score; a probe needs 2 at least on each side")
    train, test = train_test_split(np.arange(rec.rows), test_size=test_rows, random_state=seed)
    result = Probes(kind, "r2" if kind == "ridge" else "accuracy", rec.rows, len(train), len(test), seed=seed)
    if kind == "logistic":
        if len(np.unique(y[train])) < 2:
            raise InputMismatchError("the training rows hold one class only; give more observations of the others")
        _, counts = np.unique(y[test], return_counts=True)
        result.chance = float(counts.max() / len(test))
    for name in names:
        x = rec.head(rec.rows, [name])[name]
        x = x.reshape(len(x), -1)
        if not np.isfinite(x).all():
            raise InputMismatchError(f"tensor {name!r} holds NaN or infinite values in {int((~np.isfinite(x).all(axis=1)).sum()):,} "
                                     "observations; a probe needs finite activations (select other tensors with --tensors)")
        if kind == "ridge":
            model = make_pipeline(StandardScaler(), RidgeCV(alphas=RIDGE_ALPHAS))
            model.fit(x[train], y[train])
            score, fitted = r2_score(y[test], model.predict(x[test])), r2_score(y[train], model.predict(x[train]))
            penalty = float(model[-1].alpha_)
        else:
            model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
            model.fit(x[train], y[train])
            score, fitted = accuracy_score(y[test], model.predict(x[test])), accuracy_score(y[train], model.predict(x[train]))
            penalty = float(model[-1].C)
        result.tensors.append(ProbeScore(name, x.shape[1], float(score), float(fitted), penalty))
    return result


def plot_probes(result: Probes, path, *, force: bool = False) -> Path:
    """A PNG: the held-out score of each tensor's probe (bars), with the training score (dots) and,
    for a logistic probe, the chance level (matplotlib, Agg).

    Raises:
        OutputExistsError: ``path`` exists (without ``force``).
        MissingDependencyError: matplotlib missing.
    """
    from ..io.outputs import write_atomic
    from .plots import _figure, _quiet_matplotlib, shown

    n = len(result.tensors)
    fig = _figure(max(4.0, 0.9 * n + 2), 3.6)
    ax = fig.subplots()
    ax.bar(range(n), [t.score for t in result.tensors], color="tab:blue", label="held out")
    ax.plot(range(n), [t.train_score for t in result.tensors], "o", color="tab:orange", label="training rows")
    if result.chance is not None:
        ax.axhline(result.chance, color="grey", linestyle="--", linewidth=1, label="chance")
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_xticks(range(n), [shown(t.name) for t in result.tensors], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("R²" if result.metric == "r2" else "accuracy")
    ax.set_title(f"{result.kind} probe per layer: {result.test_rows:,} held-out of {result.rows:,} observations",
                 fontsize=9)
    ax.legend(fontsize=7)
    with _quiet_matplotlib():
        return write_atomic(Path(path), lambda f: fig.savefig(f, format="png"), force)
