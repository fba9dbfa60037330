"""Verification: the same observations through every backend and the source, compared tensor by tensor.

For each tensor the backends record (every node output and graph output), every backend after the
first is compared with the first; when the source's reference forward pass is known, every backend
is also compared with it on the tensors the source computes. An element passes when
``|candidate - reference| <= atol + rtol * |reference|`` (numpy.isclose's rule); NaN matches NaN
only at the same position. The first diverging tensor is the earliest in node order that fails.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from .errors import BadModelError, InputMismatchError
from .graph import ValueInfo

DEFAULT_ATOL = 1e-5
DEFAULT_RTOL = 1e-5
DEFAULT_SAMPLES = 1000


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


def sample_inputs(inputs: Sequence[ValueInfo], samples: int = DEFAULT_SAMPLES, low: float = 0.0,
                  high: float = 1.0, seed: int = 0) -> dict[str, np.ndarray]:
    """Observations drawn uniformly from ``[low, high)`` for every graph input.

    Args:
        inputs: the graph inputs; every symbolic or unknown dimension becomes ``samples``.
        samples: batch size (default 1000).
        low, high: the range, in the observation's own units; default [0, 1).
        seed: numpy ``default_rng`` seed (default 0), so a run can be repeated.

    Raises:
        InputMismatchError: an input with unknown rank or a non-float dtype.
    """
    if samples < 1 or not low < high:
        raise InputMismatchError(f"need samples >= 1 and low < high; got samples={samples}, range [{low}, {high})")
    rng = np.random.default_rng(seed)
    feeds = {}
    for v in inputs:
        if v.shape is None or not np.issubdtype(v.dtype, np.floating):
            raise InputMismatchError(
                f"cannot draw samples for input {v.name!r} ({v.dtype.name}, shape {v.shape}); give inputs with -i"
            )
        shape = tuple(d if isinstance(d, int) else samples for d in v.shape)
        feeds[v.name] = rng.uniform(low, high, size=shape).astype(v.dtype)
    return feeds


def verify(model, inputs=None, *, backends: Sequence[str] = ("numpy", "onnxruntime"), source=None,
           reference: Callable[[np.ndarray], Mapping[str, np.ndarray]] | None = None,
           samples: int = DEFAULT_SAMPLES, low: float = 0.0, high: float = 1.0, seed: int = 0,
           atol: float = DEFAULT_ATOL, rtol: float = DEFAULT_RTOL, tensors: str | list[str] = "*") -> Report:
    """Run the same inputs through every backend (and the source) and compare every tensor.

    Args:
        model: an ``onnx.ModelProto``, a path to an ``.onnx`` file, or a packed folder.
        inputs: feeds (dict, or the array alone for a single-input model); ``None`` draws
            ``samples`` observations uniformly from ``[low, high)`` with ``seed``.
        backends: names from :data:`policyport.runtime.BACKENDS`; the first is the baseline the
            others are compared with (default numpy, onnxruntime).
        source: the policy the model was converted from (path or object, as for
            :func:`policyport.convert`); its own forward pass becomes a further reference. The
            activation and head are read from the model's metadata.
        reference: instead of ``source``, a callable ``obs -> {tensor name: array}``.
        samples, low, high, seed: see :func:`sample_inputs`.
        atol: absolute tolerance (default 1e-5). rtol: relative tolerance (default 1e-5).
        tensors: which node outputs to compare (globs); graph outputs are always compared.

    Returns:
        A :class:`Report`; it does not raise on a mismatch (check ``report.passed``).

    Raises:
        InputMismatchError: bad inputs or backend names. BadModelError, UnsupportedOpError,
        MissingDependencyError: as :func:`policyport.load`.
    """
    from .runtime import BACKENDS, load

    backends = list(dict.fromkeys(backends))
    unknown = [b for b in backends if b not in BACKENDS]
    if not backends or unknown:
        raise InputMismatchError(f"unknown backend(s) {unknown}; choose from {', '.join(BACKENDS)}")
    sessions = {b: load(model, backend=b) for b in backends}
    first = sessions[backends[0]]
    if inputs is None:
        feeds = sample_inputs(first.inputs, samples, low, high, seed)
    elif isinstance(inputs, Mapping):
        feeds = dict(inputs)
    else:
        if len(first.inputs) != 1:
            raise InputMismatchError("the model has several inputs; pass a dict of feeds")
        feeds = {first.inputs[0].name: inputs}
    if source is not None and reference is None:
        reference = _source_reference(model, source)
    if len(backends) < 2 and reference is None:
        raise InputMismatchError(
            f"nothing to compare: one backend ({backends[0]}) and no source; name two backends or give a source"
        )
    n = next(iter(feeds.values())).shape[0] if feeds and np.ndim(next(iter(feeds.values()))) else 0
    if n == 0:
        raise InputMismatchError("no observations to verify on: the inputs hold 0 rows")
    recorded = {b: s.record(feeds, tensors) for b, s in sessions.items()}
    order = list(recorded[backends[0]])
    report = Report(backends, None, int(n), atol, rtol)
    ref_values: Mapping[str, np.ndarray] = {}
    if reference is not None:
        if len(feeds) != 1:
            raise InputMismatchError("a source reference takes one observation input")
        try:
            ref_values = reference(next(iter(feeds.values())))
        except ValueError as e:  # the source's arrays do not fit these observations
            raise BadModelError(
                f"the source does not fit the model: its forward pass fails on the model's inputs "
                f"{tuple(next(iter(feeds.values())).shape)} ({e})"
            ) from e
        report.reference = "source"
    for name in order:
        base = recorded[backends[0]][name]
        for other in backends[1:]:
            report.comparisons.append(compare(name, other, recorded[other][name], backends[0], base, atol, rtol))
        if name in ref_values:
            for b in backends:
                report.comparisons.append(compare(name, b, recorded[b][name], "source", ref_values[name], atol, rtol))
    return report


def _source_reference(model, source) -> Callable:
    from .converter import convert_source
    from .files import ensure_model

    proto = ensure_model(model)  # a packed folder's model.onnx too
    props = {p.key: p.value for p in proto.metadata_props}
    head = props.get("policyport.head", "none")
    try:
        converted = convert_source(
            source,
            activation=props.get("policyport.activation", "tanh"),
            head=None if head == "none" else head,
            keep_value=any(o.name == "value" for o in proto.graph.output),
        )
    except BadModelError as e:
        raise BadModelError(f"cannot rebuild the source's forward pass for verification: {e}") from e
    return converted.reference
