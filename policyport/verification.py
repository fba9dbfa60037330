"""Verification: the same observations through every backend and the source, compared tensor by tensor.

For each tensor the backends record (every node output and graph output), every backend after the
first is compared with the first; when the source's reference forward pass is known, every backend
is also compared with it on the tensors the source computes. The rule is :mod:`policyport.compare`'s:
tolerances by element type (``|candidate - reference| <= atol + rtol * |reference|``; integers,
bools and strings exactly), and for a floating tensor that fails them, the float32-rounding rule
against a float64 run of the graph on the numpy backend (the *oracle*). The first diverging tensor
is the earliest in node order that fails.

Tensors that depend on a random node (RandomNormal, Multinomial ...) are not compared — no two
backends draw the same numbers — and are listed in the report with the node that makes them random.

Observations: an input whose axis 0 is free (``batch``, ``-1``, unnamed) holds one observation per
row; scalars and inputs of fixed shape (``(1, 480)``, ``(54,)``) are one observation whatever
``samples`` says, and the report says so.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import numpy as np

from .compare import DEFAULT_ATOL, DEFAULT_RTOL, Comparison, Report, Skipped, compare, is_floating  # noqa: F401
from .errors import BadModelError, InputMismatchError, PolicyportError
from .files import check_memory
from .graph import Graph, ValueInfo
from .runtime.base import count_observations

DEFAULT_SAMPLES = 1000
#: The name of the float64 oracle in reports.
ORACLE = "numpy float64"


def sample_inputs(inputs: Sequence[ValueInfo], samples: int = DEFAULT_SAMPLES, low: float = 0.0,
                  high: float = 1.0, seed: int = 0) -> dict[str, np.ndarray]:
    """Observations drawn uniformly from ``[low, high)`` for every graph input, in its declared shape.

    The batch axis (axis 0 when it is free: a symbol such as ``batch``, or unknown) gets ``samples``
    rows, and so does any other free dimension named like a batch axis; every other free dimension
    gets 1 and every fixed one its size. A scalar input is one scalar, an input of fixed shape
    (``(1, 480)``, ``(54,)``) one array of that shape, whatever ``samples`` says.

    Args:
        inputs: the graph inputs.
        samples: rows along the batch axis (default 1000).
        low, high: the range, in the observation's own units; default [0, 1).
        seed: numpy ``default_rng`` seed (default 0), so a run can be repeated.

    Returns:
        input name -> array of the input's dtype, in input order.

    Raises:
        InputMismatchError: ``samples < 1``, an empty or non-finite range (``high - low`` too),
            a range beyond what an input's dtype holds (float32: about ±3.4e38), an input with
            unknown rank or a non-float dtype (give such inputs with ``-i``).
        LimitExceededError: the observations would need more memory than this process can get
            (see :func:`policyport.files.check_memory`).
    """
    if samples < 1 or not low < high or not np.isfinite(high - low):
        raise InputMismatchError(f"need samples >= 1 and finite low < high; got samples={samples}, range [{low}, {high})")
    rng = np.random.default_rng(seed)
    batch_symbols = {v.shape[0] for v in inputs if v.has_batch_axis and isinstance(v.shape[0], str)}
    shapes = {}
    for v in inputs:
        if v.shape is None or not np.issubdtype(v.dtype, np.floating):
            raise InputMismatchError(
                f"cannot draw samples for input {v.name!r} ({v.dtype.name}, shape {v.shape}); give inputs with -i"
            )
        largest = float(np.finfo(v.dtype).max)
        if max(-low, high) > largest:
            raise InputMismatchError(f"cannot draw {v.dtype.name} observations for input {v.name!r} from [{low:g}, {high:g}): "
                                     f"{v.dtype.name} holds at most ±{largest:.4g}; narrow --low/--high")
        shapes[v.name] = tuple(
            d if isinstance(d, int) else samples if (axis == 0 or d in batch_symbols) else 1
            for axis, d in enumerate(v.shape)
        )
    # drawn as float64, then cast: both live at once
    need = sum(math.prod(shape) * (8 + v.dtype.itemsize) for v, shape in zip(inputs, shapes.values()))
    check_memory(need, f"drawing {samples:,} observations for {len(shapes)} input(s)")
    return {v.name: np.asarray(rng.uniform(low, high, size=shapes[v.name])).astype(v.dtype) for v in inputs}


def first_rows(inputs: Sequence[ValueInfo], feeds: Mapping[str, np.ndarray], n: int) -> dict[str, np.ndarray]:
    """``feeds`` with every input that has a batch axis cut to its first ``n`` rows; scalars and
    inputs of fixed shape as they are."""
    batched = {v.name for v in inputs if v.has_batch_axis or v.shape is None}
    return {k: (a[:n] if k in batched and np.ndim(a) else a) for k, a in feeds.items()}


def verify(model, inputs=None, *, backends: Sequence[str] = ("numpy", "onnxruntime"), source=None,
           reference: Callable[[np.ndarray], Mapping[str, np.ndarray]] | None = None,
           samples: int | None = None, low: float = 0.0, high: float = 1.0, seed: int = 0,
           atol: float | None = None, rtol: float | None = None, tensors: str | list[str] | None = "*",
           outputs: str | list[str] | None = None, rounding: bool = True, trust: bool = False,
           threads: int = 0) -> Report:  # pragma: no mutate (a run's result is the same bits whatever its threads)
    """Run the same inputs through every backend (and the source) and compare every tensor.

    Args:
        model: an ``onnx.ModelProto``, a path to an ``.onnx`` file, or a packed folder.
        inputs: feeds (dict, or the array alone for a single-input model); ``None`` draws
            observations uniformly from ``[low, high)`` with ``seed`` (:func:`sample_inputs`).
        backends: names from :data:`policyport.runtime.BACKENDS`; the first is the baseline the
            others are compared with (default numpy, onnxruntime).
        source: the policy the model was converted from (path or object, as for
            :func:`policyport.convert`); its own forward pass becomes a further reference. The
            activation and head are read from the model's metadata.
        reference: instead of ``source``, a callable ``obs -> {tensor name: array}``.
        samples: observations to draw (default 1000); with ``inputs``, how many of their first rows
            to use (default all). Inputs without a batch axis are one observation either way.
        low, high, seed: see :func:`sample_inputs`.
        atol: absolute tolerance for floating tensors; ``None`` (default) follows the dtype
            (float32 1e-5, float16 1e-3 ...: :data:`policyport.compare.TOLERANCES`).
        rtol: relative tolerance, scaled by the reference's magnitude; ``None`` follows the dtype.
        tensors: which node outputs to compare (globs); graph outputs are always compared.
        outputs: compare only these graph outputs (names, or one comma-separated string), on the
            graph pruned to what they need (:func:`policyport.passes.prune`); feeds of inputs it
            no longer reads are dropped.
        rounding: apply the float32-rounding rule (default) to floating tensors that fail the
            tolerance: a float64 run of the graph on the numpy backend tells rounding from a real
            difference (:mod:`policyport.compare`). ``False``: the tolerance alone decides.
        trust: let ``source`` be a file that runs code when unpickled (a whole pickled torch module).
        threads: threads of each backend's session (see :func:`policyport.load`; the numpy
            backend's results are the same whatever the number); 0 (default) one per core.

    Returns:
        A :class:`Report`; it does not raise on a mismatch (check ``report.passed``).

    Raises:
        InputMismatchError: bad inputs, backend or output names, or nothing left to compare.
        BadModelError, UnsupportedOpError, MissingDependencyError: as :func:`policyport.load`.
        LimitExceededError: the tensors of every backend (measured on one and two rows,
        :meth:`policyport.runtime.Session.memory_needed`) would need more memory than this process can get.
    """
    from .runtime import BACKENDS, load

    backends = list(dict.fromkeys(backends))
    unknown = [b for b in backends if b not in BACKENDS]
    if not backends or unknown:
        raise InputMismatchError(f"unknown backend(s) {unknown}; choose from {', '.join(BACKENDS)}")
    if outputs is not None:
        from .passes import prune

        model = prune(model, outputs)
    sessions = {b: load(model, backend=b, threads=threads) for b in backends}
    first = sessions[backends[0]]
    notes: list[str] = []
    if inputs is None:
        asked = DEFAULT_SAMPLES if samples is None else samples
        feeds = sample_inputs(first.inputs, asked, low, high, seed)
    else:
        if isinstance(inputs, Mapping):
            feeds = dict(inputs)
            if outputs is not None:  # feeds of inputs the pruned graph no longer reads are not needed
                kept = {v.name for v in [*first.inputs, *first.optional_inputs]}
                feeds = {k: v for k, v in feeds.items() if k in kept}
        elif len(first.inputs) != 1:
            raise InputMismatchError("the model has several inputs; pass a dict of feeds")
        else:
            feeds = {first.inputs[0].name: inputs}
        asked = samples  # pragma: no mutate (read only for drawn observations, a branch not taken here)
        if samples is not None:
            given = count_observations(first.inputs, feeds)
            feeds = first_rows(first.inputs, feeds, samples)
            if any(v.has_batch_axis or v.shape is None for v in first.inputs):
                notes.append(f"using the first {min(samples, given)} of the {given} observations given"
                             + (f" ({samples} asked)" if samples > given else ""))
    if source is not None and reference is None:
        reference = _source_reference(model, source, trust)
    if len(backends) < 2 and reference is None:
        raise InputMismatchError(
            f"nothing to compare: one backend ({backends[0]}) and no source; name two backends or give a source"
        )
    n = count_observations(first.inputs, feeds)
    if n == 0:
        raise InputMismatchError("no observations to verify on: the inputs hold 0 rows")
    if inputs is None and n != asked:
        from .summary import format_shape

        fixed = ", ".join(f"{v.name} {format_shape(v.shape)}" for v in first.inputs)
        notes.append(f"the inputs have no batch axis ({fixed}): {n} observation, not the {asked} asked")
    copies = len(sessions) + (reference is not None)  # each backend's tensors, and the source's
    check_memory(first.memory_needed(feeds, tensors) * copies,
                 f"verifying {n:,} observations ({copies} sets of recorded tensors)")
    recorded = {b: s.record(feeds, tensors) for b, s in sessions.items()}
    graph = _graph(model, sessions)  # pragma: no mutate (every backend of BACKENDS holds its graph: the model is not read)
    random = graph.stochastic_tensors()
    report = Report(backends, None, int(n), atol, rtol, notes=notes)
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
    pairs = []  # (tensor, candidate name, candidate array, reference name, reference array)
    for name in recorded[backends[0]]:
        if name in random:
            report.skipped.append(Skipped(name, f"depends on the random {random[name]}"))
            continue
        base = recorded[backends[0]][name]
        pairs += [(name, other, recorded[other][name], backends[0], base) for other in backends[1:]]
        if name in ref_values:
            pairs += [(name, b, recorded[b][name], "source", ref_values[name]) for b in backends]
    if not pairs:
        raise InputMismatchError(
            "nothing to compare: every tensor depends on a random node; choose deterministic outputs with --outputs"
        )
    report.comparisons = [compare(t, c, a, r, b, atol, rtol) for t, c, a, r, b in pairs]
    failing = {c.tensor for c in report.comparisons if not c.passed and c.rule == "tolerance" and c.max_abs < np.inf}
    if failing and rounding:
        oracle = _oracle(graph, feeds, recorded[backends[0]], failing, report)
        report.comparisons = [
            compare(t, c, a, r, b, atol, rtol, oracle[t]) if t in oracle and not old.passed else old
            for (t, c, a, r, b), old in zip(pairs, report.comparisons)
        ]
    return report


def _oracle(graph: Graph, feeds: Mapping[str, np.ndarray], baseline: Mapping[str, np.ndarray],
            wanted: set[str], report: Report) -> dict[str, np.ndarray]:
    """The float64 run's values of the ``wanted`` tensors it can vouch for; notes on the report why
    the others have none. Sets ``report.oracle`` when it ran."""
    from .passes import widen_to_float64
    from .runtime import load

    try:
        session = load(widen_to_float64(graph), backend="numpy")  # pragma: no mutate (numpy is load's default)
        wide = {k: (v.astype(np.float64) if v.dtype.name in ("float16", "bfloat16", "float32")
                    else v.astype(np.complex128) if v.dtype == np.complex64 else v) for k, v in feeds.items()}
        values = session.record(wide, "*")  # pragma: no mutate ("*" is record's default)
    except PolicyportError as e:
        report.notes.append(f"no float64 oracle for the rounding rule: {e}")
        return {}
    report.oracle = ORACLE
    # A float32 comparison, ArgMax or Cast to an integer can land on the other side in float64: the
    # oracle is then no oracle for what depends on it.
    differ = {name: f"its {name!r} differs from {report.backends[0]}'s" for name, value in values.items()
              if name in baseline and not is_floating(value.dtype) and value.dtype.kind not in ("O", "S", "U")
              and (value.shape != baseline[name].shape or not np.array_equal(value, baseline[name]))}
    invalid = graph.downstream(differ) if differ else {}  # pragma: no mutate (downstream of nothing is nothing)
    blind = sorted(t for t in wanted if t in invalid)
    if blind:
        report.notes.append(f"the float64 run took other branches ({invalid[blind[0]]}); "
                            f"no rounding rule for {', '.join(blind)}")
    return {t: values[t] for t in wanted if t in values and t not in invalid}


def _graph(model, sessions) -> Graph:
    """The :class:`Graph` view of the model (the numpy session's, else read from the model)."""
    for s in sessions.values():
        graph = getattr(s.backend, "graph", None)  # pragma: no mutate (without it the same graph is read from the model)
        if isinstance(graph, Graph):
            return graph
    from .files import ensure_model
    from .graph import from_onnx

    return from_onnx(ensure_model(model))  # pragma: no mutate (for a backend without a graph; every one of BACKENDS has it)


def _source_reference(model, source, trust: bool) -> Callable:
    """The source's forward pass, rebuilt with the options recorded in the model at conversion.

    A source of another kind than the model was converted from (the TorchScript file of a module
    whose ``state_dict`` was converted, say) carries its own architecture: only the options that
    choose what it outputs (``keep_value``) carry over, and it is run as it is. A source whose kind
    cannot be told from its name is taken to be of the kind the conversion recorded.
    """
    import dataclasses

    from .converter import FILE_KINDS, OPTIONS_KEY, ConvertOptions, UnknownKindError, convert_source, detect_kind
    from .files import ensure_model

    proto = ensure_model(model)  # a packed folder's model.onnx too
    props = {p.key: p.value for p in proto.metadata_props}
    options = ConvertOptions.from_metadata(props.get(OPTIONS_KEY))
    if OPTIONS_KEY not in props:  # written before the options were recorded: what the metadata tells
        head = props.get("policyport.head")
        options = ConvertOptions(activation=props.get("policyport.activation"), head=None if head in (None, "none") else head,
                                 keep_value=any(o.name == "value" for o in proto.graph.output))
    recorded_kind = props.get("policyport.source_kind")
    try:
        try:
            kind = detect_kind(source)
        except UnknownKindError:  # a source named unlike its kind: the kind convert recorded
            if recorded_kind not in FILE_KINDS:
                raise
            kind = recorded_kind
        if recorded_kind and kind != recorded_kind:
            options = dataclasses.replace(ConvertOptions(), keep_value=options.keep_value, opset=options.opset)
        converted = convert_source(source, kind=kind, options=options, trust=trust)
    except BadModelError as e:
        raise BadModelError(f"cannot rebuild the source's forward pass for verification: {e}") from e
    return converted.reference
