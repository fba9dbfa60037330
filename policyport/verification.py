"""Verification: the same observations through every backend and the source, compared tensor by tensor.

For each tensor the backends record (every node output and graph output), every backend after the
first is compared with the first; when the source's reference forward pass is known, every backend
is also compared with it on the tensors the source computes. An element passes when
``|candidate - reference| <= atol + rtol * |reference|`` (numpy.isclose's rule); NaN matches NaN
only at the same position. The first diverging tensor is the earliest in node order that fails.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import numpy as np

from .compare import DEFAULT_ATOL, DEFAULT_RTOL, Comparison, Report, compare  # noqa: F401  (re-exported)
from .errors import BadModelError, InputMismatchError
from .files import check_memory
from .graph import ValueInfo

DEFAULT_SAMPLES = 1000


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
        LimitExceededError: the observations would need more memory than this process can get
            (see :func:`policyport.files.check_memory`).
    """
    if samples < 1 or not low < high:
        raise InputMismatchError(f"need samples >= 1 and low < high; got samples={samples}, range [{low}, {high})")
    rng = np.random.default_rng(seed)
    shapes = {}
    for v in inputs:
        if v.shape is None or not np.issubdtype(v.dtype, np.floating):
            raise InputMismatchError(
                f"cannot draw samples for input {v.name!r} ({v.dtype.name}, shape {v.shape}); give inputs with -i"
            )
        shapes[v.name] = tuple(d if isinstance(d, int) else samples for d in v.shape)
    # drawn as float64, then cast: both live at once
    need = sum(math.prod(shape) * (8 + v.dtype.itemsize) for v, shape in zip(inputs, shapes.values()))
    check_memory(need, f"drawing {samples:,} observations for {len(shapes)} input(s)")
    return {v.name: rng.uniform(low, high, size=shapes[v.name]).astype(v.dtype) for v in inputs}


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
        MissingDependencyError: as :func:`policyport.load`. LimitExceededError: the tensors of
        every backend (measured on one and two rows, :meth:`policyport.runtime.Session.memory_needed`)
        would need more memory than this process can get.
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
    copies = len(sessions) + (reference is not None)  # each backend's tensors, and the source's
    check_memory(first.memory_needed(feeds, tensors) * copies,
                 f"verifying {n:,} observations ({copies} sets of recorded tensors)")
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
    """The source's forward pass, rebuilt with the options recorded in the model at conversion."""
    from .converter import OPTIONS_KEY, ConvertOptions, convert_source
    from .files import ensure_model

    proto = ensure_model(model)  # a packed folder's model.onnx too
    props = {p.key: p.value for p in proto.metadata_props}
    options = ConvertOptions.from_metadata(props.get(OPTIONS_KEY))
    if OPTIONS_KEY not in props:  # written before the options were recorded: what the metadata tells
        head = props.get("policyport.head", "none")
        options = ConvertOptions(activation=props.get("policyport.activation"), head=None if head == "none" else head,
                                 keep_value=any(o.name == "value" for o in proto.graph.output))
    try:
        converted = convert_source(source, options=options)
    except BadModelError as e:
        raise BadModelError(f"cannot rebuild the source's forward pass for verification: {e}") from e
    return converted.reference
