"""Verification: the same observations through every backend and the source, compared tensor by tensor.

For each tensor the backends record (every node output and graph output), every backend after the
first is compared with the first; when the source's reference forward pass is known, every backend
is also compared with it on the tensors the source computes (by name; a source that computes none of
them is refused, and the report notes those it does not compute). The rule is :mod:`policyport.verification.compare`'s:
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
import os
import re
from typing import Callable, Mapping, Sequence

import numpy as np

from .compare import (DEFAULT_ATOL, DEFAULT_RTOL, Comparison, ComparisonFold, Report, Skipped,  # noqa: F401
                      compare, is_floating)
from ..errors import (BadModelError, InputMismatchError, LimitExceededError, PolicyportError, TrustRequiredError,
                     UndrawableInputError, UnreadableFileError, UntrustedFileError, listing)
from ..io.limits import check_memory
from ..graph.model import INPUT_RANGES_KEY, Graph, ValueInfo, recorded_assumptions
from ..runtime.base import count_observations, native_order

DEFAULT_SAMPLES = 1000
#: The name of the float64 oracle in reports.
ORACLE = "numpy float64"


def sample_inputs(inputs: Sequence[ValueInfo], samples: int = DEFAULT_SAMPLES, low: float = 0.0,
                  high: float = 1.0, seed: int = 0, ranges: Mapping[str, tuple] | None = None) -> dict[str, np.ndarray]:
    """Observations drawn uniformly for every graph input, in its declared shape.

    A floating input is drawn from ``[low, high)``. An integer input is drawn from the integers of
    its valid range when the model records one (``ranges``: a ``Discrete(n)`` observation's
    ``[0, n)``), else from the integers in ``[low, high)``, which must hold at least two; a bool
    input is drawn from ``{False, True}``.

    The batch axis (axis 0 when it is free: a symbol such as ``batch``, or unknown) gets ``samples``
    rows, and so does any other free dimension named like a batch axis; every other free dimension
    gets 1 and every fixed one its size. A scalar input is one scalar, an input of fixed shape
    (``(1, 480)``, ``(54,)``) one array of that shape, whatever ``samples`` says.

    Args:
        inputs: the graph inputs.
        samples: rows along the batch axis (default 1000).
        low, high: the range, in the observation's own units; default [0, 1).
        seed: numpy ``default_rng`` seed (default 0), so a run can be repeated.
        ranges: input name -> ``(low, high)`` integer bounds (``high`` exclusive; numbers, or arrays
            along the input's last axis), as :func:`input_ranges` reads them from a model; they
            take precedence over ``low``/``high`` for those inputs.

    Returns:
        input name -> array of the input's dtype, in input order.

    Raises:
        InputMismatchError: ``samples < 1``, an empty or non-finite range (``high - low`` too),
            a range beyond what an input's dtype holds (float32: about ±3.4e38).
        UndrawableInputError: an input with unknown rank, a dtype neither floating, integer nor
            bool, or an integer input with no recorded range whose ``[low, high)`` holds fewer than
            two integers (give such inputs' observations yourself).
        LimitExceededError: the observations would need more memory than this process can get
            (see :func:`policyport.io.limits.check_memory`).
    """
    if samples < 1 or not low < high or not np.isfinite(high - low):
        raise InputMismatchError(f"need samples >= 1 and finite low < high; got samples={samples}, range [{low}, {high})")
    rng = np.random.default_rng(seed)
    ranges = ranges or {}
    batch_symbols = {v.shape[0] for v in inputs if v.has_batch_axis and isinstance(v.shape[0], str)}
    shapes = {}
    for v in inputs:
        _check_drawable(v, low, high, v.name in ranges)
        shapes[v.name] = tuple(
            d if isinstance(d, int) else samples if (axis == 0 or d in batch_symbols) else 1
            for axis, d in enumerate(v.shape)
        )
    # drawn as float64, then cast: both live at once
    need = sum(math.prod(shape) * (8 + v.dtype.itemsize) for v, shape in zip(inputs, shapes.values()))
    check_memory(need, f"drawing {samples:,} observations for {len(shapes)} input(s)")
    return {v.name: _draw(rng, v, shapes[v.name], low, high, ranges.get(v.name)) for v in inputs}


def _check_drawable(v: ValueInfo, low: float, high: float, ranged: bool) -> None:
    """Refuse an input :func:`sample_inputs` cannot draw for from ``[low, high)``."""
    what = f"cannot draw samples for input {v.name!r} ({v.dtype.name}, shape {v.shape})"
    if v.shape is None:
        raise UndrawableInputError(f"{what}: its rank is unknown", integer=False)
    if np.issubdtype(v.dtype, np.floating):
        largest = float(np.finfo(v.dtype).max)
        if max(-low, high) > largest:
            raise InputMismatchError(f"cannot draw {v.dtype.name} observations for input {v.name!r} from [{low:g}, {high:g}): "
                                     f"{v.dtype.name} holds at most ±{largest:.4g}; narrow --low/--high")
    elif np.issubdtype(v.dtype, np.integer) and not ranged:
        first, end = math.ceil(low), math.ceil(high)  # the integers i with low <= i < high
        info = np.iinfo(v.dtype)
        if end - first < 2:
            held = "no integer" if end <= first else f"only one integer ({first})"
            raise UndrawableInputError(
                f"{what}: the model does not record the integers it takes, and [{low:g}, {high:g}) holds {held}",
                integer=True)
        if first < info.min or end - 1 > info.max:
            raise UndrawableInputError(f"{what}: [{low:g}, {high:g}) reaches beyond {v.dtype.name}'s "
                                       f"[{info.min}, {info.max}]", integer=True)
    elif not (np.issubdtype(v.dtype, np.integer) or v.dtype == np.bool_):
        raise UndrawableInputError(f"{what}: policyport draws floating, integer and bool observations", integer=False)


def _draw(rng, v: ValueInfo, shape: tuple[int, ...], low: float, high: float, bounds) -> np.ndarray:
    """One input's observations: see :func:`sample_inputs`."""
    if v.dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if np.issubdtype(v.dtype, np.integer):
        lo, hi = (math.ceil(low), math.ceil(high)) if bounds is None else bounds
        return rng.integers(np.asarray(lo, np.int64), np.asarray(hi, np.int64), size=shape).astype(v.dtype)
    return np.asarray(rng.uniform(low, high, size=shape)).astype(v.dtype)


def _integers(low, high) -> str:
    """``the integers 0..3`` of the range ``[low, high)``, or of one range per position."""
    if np.ndim(low) == 0 and np.ndim(high) == 0:
        return f"the integers {int(low)}..{int(high) - 1}"
    return "per position the integers of the ranges"


def input_ranges(metadata: Mapping[str, str]) -> dict[str, tuple]:
    """The integer ranges a converter recorded for graph inputs (model metadata
    :data:`policyport.graph.model.INPUT_RANGES_KEY`), as :func:`sample_inputs` takes them.

    Returns:
        input name -> ``(low, high)``, each an int64 array (a scalar, or one value per position
        along the input's last axis); ``{}`` when the model records none.

    Raises:
        BadModelError: the metadata is not ``{input: {"low": ..., "high": ...}}`` of integers with
            ``low < high``.
    """
    from ..io.schema import load_json

    text = metadata.get(INPUT_RANGES_KEY)
    if not text:
        return {}
    recorded = load_json(text, f"model metadata {INPUT_RANGES_KEY!r}")
    try:
        ranges = {str(name): (_bound(r["low"]), _bound(r["high"])) for name, r in recorded.items()}
        if not all(np.all(lo < hi) for lo, hi in ranges.values()):
            raise ValueError("a range with low >= high")
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise BadModelError(f"model metadata {INPUT_RANGES_KEY!r} is malformed: {e}") from e
    return ranges


def _bound(value) -> np.ndarray:
    """A recorded range's bound as int64: a whole number (``3`` or ``3.0``) or a list of them, within
    int64's range."""
    bound = np.asarray(value)
    info = np.iinfo(np.int64)
    whole = bound.dtype.kind in "iu" or (bound.dtype.kind == "f" and bool(np.all(np.isfinite(bound)))
                                         and bool(np.all(bound == np.floor(bound))))
    if not whole or bound.size == 0 or not info.min <= bound.min() <= bound.max() < 2.0**63:
        raise ValueError(f"bound {value!r:.80} is not a whole number within int64's range, nor a list of them")
    return bound.astype(np.int64)


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
           threads: int = 0, reference_oracle=None, obs_norm: str | os.PathLike | None = None) -> Report:  # pragma: no mutate (a run's result is the same bits whatever its threads)
    """Run the same inputs through every backend (and the source) and compare every tensor.

    Args:
        model: an ``onnx.ModelProto``, a path to an ``.onnx`` file, or a packed folder.
        inputs: feeds (dict, or the array alone for a single-input model); ``None`` draws
            observations uniformly from ``[low, high)`` with ``seed`` (:func:`sample_inputs`).
        backends: names from :data:`policyport.runtime.BACKENDS`; the first is the baseline the
            others are compared with (default numpy, onnxruntime).
        source: the policy the model was converted from (path or object, as for
            :func:`policyport.convert`); its own forward pass becomes a further reference. The
            activation and head are read from the model's metadata. The report names what that
            forward pass is (``source_oracle``: the framework running the source's own code, or
            policyport's reconstruction of it) and the assumptions it shares with the model.
        reference: instead of ``source``, a callable ``obs -> {tensor name: array}``.
        reference_oracle: what ``reference`` is (an :class:`~policyport.converter.assumptions.Oracle`),
            for the report; ``None``: an unnamed reference.
        samples: observations to draw (default 1000); with ``inputs``, how many of their first rows
            to use (default all). Inputs without a batch axis are one observation either way.
        low, high, seed: see :func:`sample_inputs`.
        atol: absolute tolerance for floating tensors; ``None`` (default) follows the dtype
            (float32 1e-5, float16 1e-3 ...: :data:`policyport.verification.compare.TOLERANCES`).
        rtol: relative tolerance, scaled by the reference's magnitude; ``None`` follows the dtype.
        tensors: which node outputs to compare (globs); graph outputs are always compared.
        outputs: compare only these graph outputs (names, or one comma-separated string), on the
            graph pruned to what they need (:func:`policyport.runtime.expose.prune`); feeds of inputs it
            no longer reads are dropped.
        rounding: apply the float32-rounding rule (default) to floating tensors that fail the
            tolerance: a float64 run of the graph on the numpy backend tells rounding from a real
            difference (:mod:`policyport.verification.compare`). ``False``: the tolerance alone decides.
        trust: let ``source`` be a file that runs code it holds when loaded (a TorchScript file, a
            SavedModel, a whole pickled torch module).
        obs_norm: the observation-normalisation file to rebuild ``source`` with (an SB3 zip's
            ``vecnormalize.pkl``, as ``convert --obs-norm`` took it). A path the model's metadata
            records is never opened: without this, the source is read as ``convert`` reads it
            without ``--obs-norm`` (the files beside it), and a note names the file the model was
            converted with.
        threads: threads of each backend's session (see :func:`policyport.load`; the numpy
            backend's results are the same whatever the number); 0 (default) one per core.

    Returns:
        A :class:`Report`; it does not raise on a mismatch (check ``report.passed``).

    Raises:
        ArgumentTypeError: ``atol``, ``rtol``, ``samples`` or ``seed`` is not a number of its kind.
        InputMismatchError: bad inputs, backend or output names, nothing left to compare, or a number
            out of range (a negative tolerance, no samples, a negative seed).
        BadModelError, UnsupportedOpError, MissingDependencyError: as :func:`policyport.load`; and a
            source that does not fit the model: it computes none of the compared tensors (they are
            compared by name), its forward pass fails on the observations (whatever its framework
            raises), or it cannot take the options the model was converted with.
        LimitExceededError: the tensors of every backend (measured on one and two rows,
        :meth:`policyport.runtime.Session.memory_needed`) would need more memory than this process can get.
        TrustRequiredError: ``source`` is a TorchScript file or a SavedModel and ``trust`` is false
            (nothing from it ran).
        UntrustedFileError: ``source`` asks for more than arrays and containers while unpickling (a
            whole pickled module) and ``trust`` is false.
    """
    from ..errors import check_argument
    from ..runtime import BACKENDS, load

    atol = check_argument(atol, "atol (absolute tolerance)", "real", 0, none=True)
    rtol = check_argument(rtol, "rtol (relative tolerance)", "real", 0, none=True)
    samples = check_argument(samples, "samples (observations to draw)", "int", 1, none=True)
    seed = check_argument(seed, "seed (of the drawn observations)", "int", 0)
    backends = list(dict.fromkeys(backends))
    unknown = [b for b in backends if b not in BACKENDS]
    if not backends or unknown:
        raise InputMismatchError(f"unknown backend(s) {unknown}; choose from {', '.join(BACKENDS)}")
    if outputs is not None:
        from ..runtime.expose import prune

        model = prune(model, outputs)
    sessions = {b: load(model, backend=b, threads=threads) for b in backends}
    first = sessions[backends[0]]
    notes: list[str] = []
    if inputs is None:
        asked = DEFAULT_SAMPLES if samples is None else samples
        ranges = input_ranges(_graph(model, sessions).metadata)
        feeds = sample_inputs(first.inputs, asked, low, high, seed, ranges)
        ranged = [v.name for v in first.inputs if v.name in ranges]
        if ranged and (low, high) != (0.0, 1.0):  # the range asked for does not reach these inputs: say so
            if len(ranged) < len(first.inputs):
                notes.append(f"input(s) {', '.join(map(repr, ranged))} take the integers of the range the model "
                             f"records; [{low:g}, {high:g}) (--low/--high, low=/high=) applies to the other inputs")
            else:
                notes.append(f"[{low:g}, {high:g}) (--low/--high, low=/high=) applies to no input: "
                             + "; ".join(f"{name!r} takes {_integers(*ranges[name])}" for name in ranged)
                             + " the model records")
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
        feeds = {k: native_order(v) for k, v in feeds.items()}  # the source's forward pass gets them too
        asked = samples  # pragma: no mutate (read only for drawn observations, a branch not taken here)
        if samples is not None:
            given = count_observations(first.inputs, feeds)
            feeds = first_rows(first.inputs, feeds, samples)
            if any(v.has_batch_axis or v.shape is None for v in first.inputs):
                notes.append(f"using the first {min(samples, given)} of the {given} observations given"
                             + (f" ({samples} asked)" if samples > given else ""))
    if len(backends) < 2 and reference is None and source is None:
        raise InputMismatchError(
            f"nothing to compare: one backend ({backends[0]}) and no source; name two backends or give a source"
        )
    n = count_observations(first.inputs, feeds)
    if n == 0:
        raise InputMismatchError("no observations to verify on: the inputs hold 0 rows")
    _check_finite(first.inputs, feeds, n, notes)
    source_assumptions = None  # a reference given: the conversion's own, making the model's assumptions
    if source is not None and reference is None:
        rebuilt, read_as = _source_reference(model, source, trust, obs_norm)
        reference, reference_oracle, source_assumptions = rebuilt.reference, rebuilt.oracle, rebuilt.assumptions
        notes += read_as
    if inputs is None and n != asked:
        from .summary import format_shape

        fixed = ", ".join(f"{v.name} {format_shape(v.shape)}" for v in first.inputs)
        notes.append(f"the inputs have no batch axis ({fixed}): {n} observation, not the {asked} asked")
    copies = len(sessions) + (reference is not None)  # each backend's tensors, and the source's
    graph = _graph(model, sessions)  # pragma: no mutate (every backend of BACKENDS holds its graph: the model is not read)
    blocks = _blocks(graph, sessions, feeds, tensors, n, copies, rounding)
    report = Report(backends, None, int(n), atol, rtol, notes=notes)
    if reference is not None:
        report.reference = "source"
    _name_assumptions(report, graph.metadata, reference_oracle if reference is not None else None, source_assumptions)
    random = graph.stochastic_tensors()
    folds: dict[tuple[str, str, str], ComparisonFold] = {}
    for i, (part, sides) in enumerate(_run_blocks(blocks, sessions, feeds, tensors, reference)):
        if i == 0:
            folds = _folds(sides, backends, random, report, atol, rtol)
        for (name, candidate, against), fold in folds.items():
            if i == 0 or name not in blocks.whole:
                fold.add(sides[candidate][name], sides[against][name])
    report.comparisons = [fold.result() for fold in folds.values()]
    report.non_finite = list(dict.fromkeys(name for (name, _, _), fold in folds.items() if fold.nowhere_finite))
    if report.non_finite:
        report.notes.append(f"NaN or infinite in every element on both sides, so their comparisons pass and prove "
                            f"nothing: {listing(report.non_finite)}")
    failing = {c.tensor for c in report.comparisons if not c.passed and c.rule == "tolerance" and c.max_abs < np.inf}
    if failing and rounding:
        _rounding_rule(graph, blocks, sessions, feeds, tensors, reference, folds, failing, report)
    _against_batch_of_one(model, graph, sessions[backends[0]], backends[0], feeds, atol, rtol, report)
    return report


#: Observations a model whose fixed batch of 1 policyport freed is also run on one at a time, on the
#: file's own graph, and compared with the freed graph's batch.
BATCH_OF_ONE_ROWS = 1000


def _against_batch_of_one(model, graph: Graph, session, backend: str, feeds: Mapping[str, np.ndarray],
                          atol, rtol, report: Report) -> None:
    """When the file declares a batch of 1 that :func:`policyport.load` freed, add to ``report`` the
    comparison of every graph output of ``backend`` on the first :data:`BATCH_OF_ONE_ROWS` observations,
    run as one batch, with the file's own graph run on each of them alone (reference
    ``"<backend> batch 1"``), and a note saying so. A packed folder holds the freed graph only: the note
    then gives the check its packing made."""
    import json
    import os

    from ..graph.passes import BATCH_FREED_KEY

    if BATCH_FREED_KEY not in graph.metadata:
        return
    fixed = json.loads(graph.metadata[BATCH_FREED_KEY])
    if isinstance(model, Graph) or (isinstance(model, (str, os.PathLike)) and os.path.isdir(model)):
        checked = json.loads(graph.metadata.get("policyport.batch_checked", "{}"))  # runtime.batch.BATCH_CHECKED_KEY
        how = (f": checked then on {checked['rows']} observations against the file's graph run on each alone, "
               f"{checked['backend']}, max abs {checked['max_abs']:.3g}" if {"rows", "backend", "max_abs"} <= set(checked) else "")
        report.notes.append(f"the model's file declared {', '.join(fixed)} with a batch of 1, which policyport freed "
                            f"before it was packed{how}")
        return
    from ..graph.onnx_files import ensure_model
    from ..runtime import load

    original = load(ensure_model(model), backend, free=False)
    rows = min(BATCH_OF_ONE_ROWS, count_observations(session.inputs, feeds))
    part = {k: (v[:rows] if k in fixed else v) for k, v in feeds.items()}
    together = session.run(part)
    alone = [original.run({k: (v[i:i + 1] if k in fixed else v) for k, v in part.items()}) for i in range(rows)]
    against = f"{backend} batch 1"
    for name, value in together.items():
        report.comparisons.append(compare(name, backend, value, against, np.concatenate([a[name] for a in alone]),
                                          atol, rtol))
    report.notes.append(f"the file declares {', '.join(fixed)} with a batch of 1; policyport runs it at any batch (every "
                        f"node computes each row alone), and compares the graph outputs of the first {rows:,} "
                        f"observations run together with the file's own graph run on each alone ({against})")


#: Rows of observations checked for NaN and infinity at a time (bounds the check's temporaries).
_FINITE_ROWS = 65536


def _check_finite(inputs: Sequence[ValueInfo], feeds: Mapping[str, np.ndarray], n: int, notes: list[str]) -> None:
    """Refuse observations that hold a NaN or an infinity in every one of their ``n`` rows (every
    tensor computed from them is NaN or infinite on every side, and NaN matches NaN: comparing
    them proves nothing); note how many rows hold one when only some do. A value of a floating
    input without a batch axis belongs to every observation.

    Raises:
        InputMismatchError: every observation holds a NaN or an infinity.
    """
    batched = {v.name for v in inputs if v.has_batch_axis or v.shape is None}
    bad = np.zeros(n, dtype=bool)
    for name, value in feeds.items():
        value = np.asarray(value)
        if value.size == 0 or not is_floating(value.dtype):
            continue
        if name in batched and value.ndim and len(value) == n:
            for start in range(0, n, _FINITE_ROWS):
                block = value[start:start + _FINITE_ROWS]
                bad[start:start + len(block)] |= ~np.isfinite(block.reshape(len(block), -1)).all(axis=1)
        elif not np.isfinite(value).all():
            bad[:] = True
    count = int(bad.sum())
    if count == n:
        held = "the observation holds" if n == 1 else f"every one of the {n:,} observations holds"
        raise InputMismatchError(f"{held} NaN or infinity: every tensor computed from {'it' if n == 1 else 'them'} "
                                 "is NaN or infinite on every side, and NaN matches NaN, so comparing them proves "
                                 "nothing; give observations whose values are finite")
    if count:
        notes.append(f"{count:,} of the {n:,} observations hold NaN or infinity: what is computed from them is "
                     f"compared NaN with NaN, which proves nothing; the verdict rests on the other {n - count:,}")


def _name_assumptions(report: Report, metadata: Mapping[str, str], oracle, source_assumptions) -> None:
    """Put on ``report`` what the source side is and every assumption the verdict rests on, the
    model's recorded ones and the source side's, each once (see :class:`Report` for the keys).

    Per topic: an assumption both sides make (:func:`_same_assumption`: a file they name, however
    spelled, counts as the same as a file of the same bytes) is ``side`` ``"both"``; the
    others are one side's alone, and where both sides assume something on a topic but not the same,
    they differ there (``differs``, ``report.disagreements`` and a note: they compute different things
    by design). A model's assumption the source side does not make is ``checked`` when the source
    side is the framework's own code and settles its topic (``oracle.checks``); that holds on the
    compared observations only, which a note says.

    ``source_assumptions`` ``None``: the source side is the reference of the conversion that recorded
    the model's assumptions, and makes the same ones.
    """
    model = recorded_assumptions(dict(metadata)) or []
    if oracle is None:
        report.assumptions = [{**a, "checked": False} for a in model]
        return
    report.source_oracle = oracle.to_dict()
    source = model if source_assumptions is None else [a.to_dict() for a in source_assumptions]
    named: list[dict] = []
    for topic in dict.fromkeys(a["topic"] for a in [*model, *source]):
        mine = [a for a in model if a["topic"] == topic]
        theirs = [a for a in source if a["topic"] == topic]
        both = [a for a in mine if any(_same_assumption(a, b) for b in theirs)]
        alone = [a for a in mine if a not in both]
        other = [b for b in theirs if not any(_same_assumption(a, b) for a in mine)]
        differs = bool(alone and other)
        named += [{**a, "side": "both", "checked": False, "differs": False} for a in both]
        named += [{**a, "side": "model", "checked": not theirs and topic in oracle.checks, "differs": differs}
                  for a in alone]
        named += [{**b, "side": "source", "checked": False, "differs": differs} for b in other]
        if differs:
            report.disagreements.append({"topic": topic, "model": [a["assumes"] for a in alone],
                                         "source": [b["assumes"] for b in other]})
            report.notes.append(
                f"the model and the source side assume differently on {topic} (the model: "
                f"{'; '.join(a['assumes'] for a in alone)}; the source side: {'; '.join(b['assumes'] for b in other)}): "
                "they compute different things there, so a mismatch may come from that difference alone")
    report.assumptions = named
    tested = [f"{a['topic']} {a['assumes']}" for a in named if a["checked"]]
    if tested:
        n = report.samples
        report.notes.append(f"the source side's own code tested what the model assumes on the {n:,} observation"
                            f"{'s' if n != 1 else ''} compared only, and an assumption they do not exercise (an action "
                            f"mean beyond the bounds, say) is untested: {'; '.join(tested)}")


def _same_assumption(a: Mapping[str, str], b: Mapping[str, str]) -> bool:
    """Whether two assumptions assume the same thing: one topic, and what they assume alike once
    every file named in it stands for its contents (:func:`_files_as_contents`)."""
    return a["topic"] == b["topic"] and (a["assumes"] == b["assumes"]
                                         or _files_as_contents(a["assumes"]) == _files_as_contents(b["assumes"]))


#: The most words of an assumption searched for paths (each run of words is one file-system lookup).
_PATH_WORDS = 40
#: The largest file an assumption names that is compared by its contents; a larger one by its resolved path.
_HASHED_BYTES = 64 << 20


def _files_as_contents(text: str) -> str:
    """``text`` with each run of words that names an existing file (a path may hold spaces; the
    longest run first, brackets and punctuation around it kept) replaced by its contents' sha256, and
    each that names a folder by its resolved path: one file named relatively and absolutely, or two
    files of the same bytes (the same statistics copied along with a policy), read the same. A path
    that does not resolve from this working folder is left as written."""
    import os
    from pathlib import Path

    from ..io.kinds import sha256_file

    words = text.split(" ")
    if len(words) > _PATH_WORDS:
        return text
    out, i = [], 0
    while i < len(words):
        for j in range(len(words), i, -1):
            run = " ".join(words[i:j])
            core = run.strip("()[],;:'\"")
            path = Path(core)
            if core and ("/" in core or os.sep in core or "." in core) and path.exists():
                try:
                    small = path.is_file() and path.stat().st_size <= _HASHED_BYTES
                    named = f"sha256:{sha256_file(path)}" if small else str(path.resolve())
                except OSError:
                    continue
                start = run.index(core)
                out.append(run[:start] + named + run[start + len(core):])
                i = j
                break
        else:
            out.append(words[i])
            i += 1
    return " ".join(out)


class _Blocks:
    """How :func:`verify` goes through the observations: ``bounds``, the ``(start, stop)`` rows of
    each block (one block of every row when the graph does not compute row by row); ``inputs``, the
    feeds cut into those rows; ``whole``, the tensors the same in every block (compared once);
    ``oracle``, the bytes the rounding rule's float64 run of one block needs and what needs them,
    for its memory check (0 when they cannot be told)."""

    def __init__(self, bounds: list[tuple[int, int]], inputs: frozenset[str] = frozenset(),
                 whole: frozenset[str] = frozenset(), oracle: tuple[int, str] = (0, "")):
        self.bounds, self.inputs, self.whole, self.oracle = bounds, inputs, whole, oracle

    def parts(self, feeds: Mapping[str, np.ndarray]):
        """The feeds of each block, in row order."""
        if len(self.bounds) == 1:
            yield feeds
            return
        for start, stop in self.bounds:
            yield {k: (v[start:stop] if k in self.inputs else v) for k, v in feeds.items()}


#: The most memory one block of :func:`verify` is planned to take: the tensors every backend (and
#: the source) records, the float64 run's, and the comparison's float64 temporaries.
BLOCK_BYTES = 256 << 20
#: Bytes per element of the largest tensor that the comparison of one pair holds at its peak: about
#: twelve float64 arrays of its size (both sides and the float64 run widened, the differences, the
#: reference's magnitude, a relative error's operands and the masks between them). Measured
#: (``ru_maxrss``, MLPs of 64 units): some 60 bytes an element for a comparison, 65 for the rounding rule.
COMPARE_BYTES = 96


class _BlockMemory:
    """The bytes :func:`verify` holds at its peak while it verifies blocks of ``rows`` rows.

    Its comparison pass holds every side's recorded tensors — each backend's as its record holds
    them (:meth:`policyport.runtime.base.Backend.memory_needed`: the numpy backend's row-block
    threads, onnxruntime's arena), the source's twice over (its results and its framework's
    tensors) — and, in many blocks, the sides of the block before while the next is recorded, and
    the comparison's temporaries (:data:`COMPARE_BYTES` an element of the largest tensor). The
    rounding rule's pass records every side again while the last sides are still held, and adds the
    float64 run: a numpy record of every tensor at twice the bytes (float32 widened), the run of
    the block before in many blocks, and the widened inputs.

    Args:
        sessions: backend name -> session.
        sizes: every tensor's size (:meth:`policyport.runtime.Session.tensor_sizes`).
        names: the node outputs each side records (graph outputs too).
        copies: the sides: the backends, and the source when there is one.
    """

    def __init__(self, sessions: Mapping, sizes, names: list[str], copies: int):
        self.sessions, self.sizes, self.names, self.copies = sessions, sizes, names, copies
        first = next(iter(sessions.values()))
        self.kept = list(dict.fromkeys([*names, *(v.name for v in first.outputs)]))
        self.source = copies > len(sessions)

    def _side(self, rows: int) -> int:
        nbytes = self.sizes.nbytes(rows)
        return sum(nbytes.get(n, 0) for n in self.kept)

    def _largest(self, rows: int) -> int:
        return max((e for n, e in self.sizes.elements(rows).items() if n in self.kept), default=0)

    def compare(self, rows: int, many: bool) -> int:
        """Bytes of the comparison pass over blocks of ``rows`` rows (``many``: more than one block)."""
        side = self._side(rows)
        held = sum(s.backend.memory_needed(self.sizes, rows, self.names) for s in self.sessions.values())
        held += 2 * side if self.source else 0
        return held + (self.copies * side if many else 0) + COMPARE_BYTES * self._largest(rows)

    def oracle(self, rows: int, many: bool) -> int:
        """Bytes of the rounding rule's pass over blocks of ``rows`` rows."""
        every = self.sizes.nbytes(rows)
        numpy = self.sessions.get("numpy")
        if numpy is None:  # no numpy session here: a whole batch's record, the most a numpy plan holds
            wide = 2 * (sum(every.values()) + max(every.values(), default=0))
        else:
            wide = 2 * numpy.backend.memory_needed(self.sizes, rows, list(every))
        before = 2 * sum(every.values()) if many else 0
        inputs = 8 * self.sizes.input_elements(rows)
        return self.compare(rows, many) + self.copies * self._side(rows) + wide + before + inputs


def _blocks(graph: Graph, sessions: Mapping, feeds: Mapping[str, np.ndarray], tensors, n: int, copies: int,
            rounding: bool) -> _Blocks:
    """Split ``n`` observations into blocks whose verification fits :data:`BLOCK_BYTES` (and half the
    memory this process may take), when the graph computes row by row; check the memory the
    comparison of one block needs, and tell what the rounding rule's float64 run of one will need.

    Every tensor's bytes are measured on one and two rows and extrapolated
    (:meth:`policyport.runtime.Session.tensor_sizes`) and held as :class:`_BlockMemory` says; blocks
    are as large as both passes allow (the rounding rule's with ``rounding`` only). Measured peaks
    (``ru_maxrss``, MLPs of 64 and 256 units) stay below each estimate and above half of it.

    Raises:
        LimitExceededError: even the smallest block needs more memory than this process can get.
    """
    from ..io.limits import memory_limit

    first = next(iter(sessions.values()))
    sizes = first.tensor_sizes(feeds)
    memory = None if sizes is None else _BlockMemory(sessions, sizes, first.selection(tensors), copies)

    def planned(rows: int, many: bool) -> int:
        return max(memory.compare(rows, many), memory.oracle(rows, many) if rounding else 0)

    split = _row_split(graph, sessions, feeds, n)
    rows = n
    if split is not None and memory is not None:
        target = min(BLOCK_BYTES, memory_limit() // 2)
        if planned(n, False) > target:  # the most rows a block fits, halving the range (memory grows with rows)
            low, high = 1, n
            while low < high:
                middle = (low + high + 1) // 2
                low, high = (middle, high) if planned(middle, True) <= target else (low, middle - 1)
            rows = low
    count = -(-n // rows)
    size, extra = divmod(n, count)
    bounds, start = [], 0
    for i in range(count):
        bounds.append((start, start + size + (i < extra)))
        start = bounds[-1][1]
    largest, many = size + (extra > 0), count > 1
    in_blocks = f", in {count:,} blocks of {largest:,} row{'s' if largest > 1 else ''}" if many else ""
    oracle = (0, "") if memory is None else (
        memory.oracle(largest, many), f"the rounding rule's float64 run over {n:,} observations{in_blocks}")
    blocks = _Blocks(bounds, *(() if split is None else (frozenset(split.inputs), split.whole)), oracle=oracle)
    check_memory(0 if memory is None else memory.compare(largest, many),  # pragma: no mutate (nothing measured: a byte more is nothing to a memory check)
                 f"verifying {n:,} observations ({copies} sets of recorded tensors and their comparison{in_blocks})")
    return blocks


def _row_split(graph: Graph, sessions: Mapping, feeds: Mapping[str, np.ndarray], n: int):
    """The numpy plan's :class:`~policyport.runtime.numpy.plan.RowSplit` of the graph when blocks of
    rows verify it as the whole batch does: the graph computes row by row, no optional input (an
    initializer) is fed, and every batched input holds ``n`` rows. Otherwise ``None``."""
    from ..runtime import load

    session = sessions.get("numpy")
    try:
        session = session or load(graph, backend="numpy")
    except PolicyportError:
        return None
    split = getattr(session.backend, "plan", None) and session.backend.plan.row_split
    if not split or n < 2 or set(feeds) - {v.name for v in session.inputs}:
        return None
    if any(np.ndim(feeds[k]) == 0 or np.shape(feeds[k])[0] != n for k in split.inputs):
        return None
    return split


def _run_blocks(blocks: _Blocks, sessions: Mapping, feeds: Mapping[str, np.ndarray], tensors, reference):
    """For each block: its feeds, and every side's recorded tensors (backend name or ``"source"`` ->
    tensor name -> array)."""
    for part in blocks.parts(feeds):
        sides = {b: s.record(part, tensors) for b, s in sessions.items()}
        if reference is not None:
            try:  # one input: its array, as every reference takes it; several: the feeds by input name
                sides["source"] = reference(next(iter(part.values())) if len(part) == 1 else dict(part))
            except (PolicyportError, MemoryError):
                raise
            except Exception as e:  # noqa: BLE001 - what the framework raises: torch RuntimeError, tf TypeError ...
                shapes = (f"{tuple(np.shape(next(iter(feeds.values()))))}" if len(feeds) == 1
                          else ", ".join(f"{k} {tuple(np.shape(v))}" for k, v in feeds.items()))
                raise BadModelError(f"the source does not fit the model: its forward pass fails on the model's "
                                    f"inputs {shapes} ({_first_line(e)})") from e
        yield part, sides


#: Where a framework's message starts printing the tensors it was given (tf's ``Received args:
#: (<tf.Tensor: ... numpy=array([[...``, torch's ``tensor([[...``).
_TENSOR_DUMP = re.compile(r"<tf\.Tensor|\b(?:tensor|array)\(")
#: The most characters of a framework's message a refusal quotes.
_MESSAGE_CHARS = 300


def _first_line(error: BaseException) -> str:
    """The first line of an exception's message, without the tensors some frameworks print in it
    (cut at the sentence before them), at most :data:`_MESSAGE_CHARS` characters; the exception's
    type name when the message is empty."""
    line = next((text.strip() for text in str(error).splitlines() if text.strip()), type(error).__name__)
    dump = _TENSOR_DUMP.search(line)
    if dump:
        sentence = line.rfind(". ", 0, dump.start())
        line = line[:sentence + 1] if sentence > 0 else line[:dump.start()].rstrip(" :(,=")
    return line if len(line) <= _MESSAGE_CHARS else line[:_MESSAGE_CHARS - 1] + "…"


def _folds(sides: Mapping[str, Mapping[str, np.ndarray]], backends: list[str], random: Mapping[str, str],
           report: Report, atol, rtol) -> dict[tuple[str, str, str], ComparisonFold]:
    """(tensor, candidate, reference) -> its fold, in node order: every backend after the first against
    the first, then every backend against the source; random tensors are listed as skipped."""
    folds = {}
    source = sides.get("source", {})
    if "source" in sides:
        _check_source_tensors(sides[backends[0]], source, random, report)
    for name in sides[backends[0]]:
        if name in random:
            report.skipped.append(Skipped(name, f"depends on the random {random[name]}"))
            continue
        pairs = [(other, backends[0]) for other in backends[1:]]
        pairs += [(b, "source") for b in backends] if name in source else []
        for candidate, against in pairs:
            folds[name, candidate, against] = ComparisonFold(name, candidate, against, atol, rtol)
    if not folds:
        raise InputMismatchError(
            "nothing to compare: every tensor depends on a random node; choose deterministic outputs with --outputs"
        )
    return folds


def _check_source_tensors(recorded: Mapping[str, np.ndarray], source: Mapping[str, np.ndarray],
                          random: Mapping[str, str], report: Report) -> None:
    """Refuse a source that computes none of the recorded tensors (tensors are compared by name: such
    a source proves nothing about the model); note on the report which of them it does not compute
    when it computes only some.

    Raises:
        BadModelError: the source computes none of them.
    """
    compared = [name for name in recorded if name not in random]
    missing = [name for name in compared if name not in source]
    if compared and len(missing) == len(compared):
        raise BadModelError(f"the source does not fit the model: it computes none of the model's tensors (the model's: "
                            f"{listing(compared, 5)}; the source's: {listing(source, 5) or 'none'})")
    if missing:
        report.notes.append(f"the source computes {len(compared) - len(missing)} of the model's {len(compared)} "
                            f"compared tensors; not compared with it: {listing(missing)}")


def _rounding_rule(graph: Graph, blocks: _Blocks, sessions: Mapping, feeds: Mapping[str, np.ndarray], tensors,
                   reference, folds: dict[tuple[str, str, str], ComparisonFold], failing: set[str],
                   report: Report) -> None:
    """Judge the ``failing`` tensors again by the rounding rule against a float64 run of the graph on
    the numpy backend (the *oracle*), block by block as they were compared; notes on the report why
    a tensor has none (a float64 run that needs more memory than this process can get, as
    ``blocks.oracle`` tells before it starts, among them). Sets ``report.oracle`` when it ran."""
    from ..graph.passes import widen_to_float64
    from ..runtime import load

    baseline = report.backends[0]
    known = set(graph.tensor_names)  # the widened graph's Casts are not the baseline's
    differ: dict[str, str] = {}
    try:
        check_memory(*blocks.oracle)
        session = load(widen_to_float64(graph), backend="numpy")  # pragma: no mutate (numpy is load's default)
        for i, (part, sides) in enumerate(_run_blocks(blocks, sessions, feeds, tensors, reference)):  # pragma: no mutate (recording every tensor costs memory, not the result)
            wide = {k: (v.astype(np.float64) if v.dtype.name in ("float16", "bfloat16", "float32")
                        else v.astype(np.complex128) if v.dtype == np.complex64 else v) for k, v in part.items()}
            values = session.record(wide, "*")  # pragma: no mutate ("*" is record's default)
            if i == 0:
                order = list(values)
            # A float32 comparison, ArgMax or Cast to an integer can land on the other side in float64:
            # the oracle is then no oracle for what depends on it. Every such tensor is checked, also
            # those ``tensors`` leaves out (the baseline records them for this check alone).
            branches = {name: value for name, value in values.items() if name in known
                        and not is_floating(value.dtype) and value.dtype.kind not in ("O", "S", "U")}
            unseen = [name for name in branches if name not in sides[baseline]]
            seen = {**sides[baseline], **(sessions[baseline].record(part, unseen) if unseen else {})}  # pragma: no mutate (recording more than unseen costs a run, not the result)
            differ.update({name: f"its {name!r} differs from {baseline}'s" for name, value in branches.items()
                           if value.shape != seen[name].shape or not np.array_equal(value, seen[name])})
            for (name, candidate, against), fold in folds.items():
                if name in failing and name in values and fold.wants_rounding and (i == 0 or name not in blocks.whole):
                    fold.add_rounding(sides[candidate][name], sides[against][name], values[name])
    except PolicyportError as e:
        report.notes.append(f"no float64 oracle for the rounding rule: {e}")
        return
    report.oracle = ORACLE
    differ = {name: differ[name] for name in order if name in differ}
    invalid = graph.downstream(differ) if differ else {}  # pragma: no mutate (downstream of nothing is nothing)
    blind = sorted(t for t in failing if t in invalid)
    if blind:
        report.notes.append(f"the float64 run took other branches ({invalid[blind[0]]}); "
                            f"no rounding rule for {', '.join(blind)}")
    vouched = {t for t in failing if t in order and t not in invalid}
    report.comparisons = [fold.result() if key[0] in vouched and not old.passed else old
                          for (key, fold), old in zip(folds.items(), report.comparisons)]


def _graph(model, sessions) -> Graph:
    """The :class:`Graph` view of the model (the numpy session's, else read from the model)."""
    for s in sessions.values():
        graph = getattr(s.backend, "graph", None)  # pragma: no mutate (without it the same graph is read from the model)
        if isinstance(graph, Graph):
            return graph
    from ..graph.onnx_files import ensure_model
    from ..graph.model import from_onnx

    return from_onnx(ensure_model(model))  # pragma: no mutate (for a backend without a graph; every one of BACKENDS has it)


def _observation_shape(proto) -> tuple[int, ...] | None:
    """The shape without the batch axis of a model's one graph input, when every such axis is fixed;
    else ``None``. It is the shape the source's forward pass is fed, so a source that cannot tell
    its own (a torch module starting with ``Flatten``) takes it."""
    initializers = {t.name for t in proto.graph.initializer}
    inputs = [i for i in proto.graph.input if i.name not in initializers]
    if len(inputs) != 1 or not inputs[0].type.HasField("tensor_type"):
        return None
    dims = inputs[0].type.tensor_type.shape.dim[1:]
    shape = tuple(d.dim_value if d.HasField("dim_value") else 0 for d in dims)
    return shape if shape and all(n > 0 for n in shape) else None


def _input_options(proto, named: bool) -> dict:
    """The options that give a torch source the inputs the model takes, when the conversion recorded
    none (it was given example inputs): ``input_shape`` of the one graph input (:func:`_observation_shape`),
    or, for a source that takes ``named`` inputs (``input_dtypes``) and a model of several graph
    inputs, each one's shape without the batch axis and dtype by name."""
    from onnx.helper import tensor_dtype_to_np_dtype

    initializers = {t.name for t in proto.graph.initializer}
    inputs = [i for i in proto.graph.input if i.name not in initializers and i.type.HasField("tensor_type")]
    if len(inputs) < 2 or not named:
        single = {"input_shape": _observation_shape(proto)}
        dtype = tensor_dtype_to_np_dtype(inputs[0].type.tensor_type.elem_type) if len(inputs) == 1 else None
        if named and single["input_shape"] and dtype is not None and dtype.kind in "biu":  # an index or a flag
            single["input_dtypes"] = {"obs": dtype.name}
        return single
    shapes = {i.name: tuple(d.dim_value for d in i.type.tensor_type.shape.dim[1:]) for i in inputs}
    if not all(all(n > 0 for n in shape) for shape in shapes.values()):
        return {}
    return {"input_shape": shapes,
            "input_dtypes": {i.name: tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type).name for i in inputs}}


def _source_reference(model, source, trust: bool, obs_norm=None):
    """The source's forward pass, rebuilt with the options recorded in the model at conversion: the
    :class:`~policyport.converter.Converted` of the source (its ``reference``, ``oracle`` and
    ``assumptions``), and notes on how the source was read.

    The kind the source is read as: the kind the conversion recorded when the source is the file
    converted (the sha256 the model records, ``policyport.source``), however it is named; else the
    kind its name tells (:func:`~policyport.converter.detect_kind`), or the recorded kind when its
    name tells none. A source that kind cannot read is read as the recorded kind, then as the kind
    its contents tell (:func:`policyport.io.kinds.file_kind`), and a note says so.

    A source of another kind than the model was converted from (the TorchScript file of a module
    whose ``state_dict`` was converted, say) carries its own architecture: only the options that
    choose what it outputs (``keep_value``) carry over, and it is run as it is. A torch source with
    no recorded ``input_shape`` takes the model's graph input shapes (without the batch axis) and,
    for several inputs, their dtypes (:func:`_input_options`). The
    observation-normalisation file is ``obs_norm`` as given, never the path the model records.

    Returns:
        ``(converted, notes)``.

    Raises:
        BadModelError: the source cannot be read or rebuilt as any of those kinds, or an option the
            model was converted with does not apply to it (the converter's OptionError, named as the
            source's misfit); the first kind's refusal is the one given.
    """
    import dataclasses

    from ..converter import FILE_KINDS, HEADS, OPTIONS_KEY, ConvertOptions, UnknownKindError, detect_kind
    from ..graph.onnx_files import ensure_model

    proto = ensure_model(model)  # a packed folder's model.onnx too
    props = {p.key: p.value for p in proto.metadata_props}
    options = ConvertOptions.from_metadata(props.get(OPTIONS_KEY))
    if OPTIONS_KEY not in props:  # written before the options were recorded: what the metadata tells
        head = props.get("policyport.head")
        options = ConvertOptions(activation=props.get("policyport.activation"), head=head if head in HEADS else None,
                                 keep_value=any(o.name == "value" for o in proto.graph.output))
    used = props.get("policyport.activation")
    if options.activation is None and used not in (None, "none") and props.get("policyport.source_kind") in (
            "npz", "state-dict", "rllib-torch"):  # converted when these kinds defaulted: the one the conversion used
        options = dataclasses.replace(options, activation=used)
    notes = []
    if obs_norm is not None:
        options = dataclasses.replace(options, obs_norm=str(obs_norm))
    elif recorded_norm := _recorded_obs_norm(props.get(OPTIONS_KEY)):
        notes.append(f"the model was converted with --obs-norm {recorded_norm}, a path its metadata records and "
                     "verify never opens; the source is read without it (as convert reads it: the files beside it) "
                     "— give it again with --obs-norm (obs_norm=)")
    recorded_kind = props.get("policyport.source_kind")
    recorded_kind = recorded_kind if recorded_kind in FILE_KINDS else None
    if recorded_kind and _is_the_converted_file(source, props.get("policyport.source")):
        return _rebuild(proto, source, recorded_kind, recorded_kind, options, used, trust), notes
    try:
        kind, told = detect_kind(source), "as its name says"
    except UnknownKindError as e:  # a source named unlike its kind: the kind convert recorded
        if recorded_kind is None:
            raise BadModelError(f"cannot rebuild the source's forward pass for verification: {e}") from e
        kind, told = recorded_kind, "the kind the model was converted from"
    try:
        return _rebuild(proto, source, kind, recorded_kind, options, used, trust), notes
    except (BadModelError, UnreadableFileError, UntrustedFileError) as refused:
        if isinstance(refused, (LimitExceededError, TrustRequiredError)):  # the file is this kind: no other reading
            raise
        for other, why in _other_readings(source, kind, recorded_kind):
            try:
                converted = _rebuild(proto, source, other, recorded_kind, options, used, trust)
            except TrustRequiredError:  # it is of that kind, which loads only with trust: say so
                raise
            except (PolicyportError, MemoryError):
                continue
            cause = re.split(r" \(|: |; ", str(refused.__cause__ or refused), maxsplit=1)[0]
            return converted, [*notes, f"{source} is read as a {other} source, {why}; read as {kind}, {told}, it "
                               f"cannot be: {cause}"]
        raise


def _recorded_obs_norm(text: str | None) -> str | None:
    """The ``--obs-norm`` path a model's recorded convert options name, as text, if any."""
    from ..io.schema import load_json

    try:
        recorded = load_json(text or "{}", "model metadata 'policyport.convert_options'")
    except BadModelError:
        return None
    value = recorded.get("obs_norm") if isinstance(recorded, dict) else None
    return value if isinstance(value, str) and value else None


def _other_readings(source, kind: str, recorded_kind: str | None) -> list[tuple[str, str]]:
    """The kinds to read a source as when ``kind`` cannot read it, and why each: the kind the model
    was converted from, then the kind the file's contents tell."""
    from pathlib import Path

    from ..io.kinds import file_kind

    readings = [(recorded_kind, "the kind the model was converted from")] if recorded_kind not in (None, kind) else []
    if isinstance(source, (str, Path)) and Path(source).exists():
        contents = file_kind(source)
        if contents is not None and contents.source and contents.source not in (kind, recorded_kind):
            readings.append((contents.source, f"which its contents are ({contents.what})"))
    return readings


def _is_the_converted_file(source, recorded: str | None) -> bool:
    """Whether ``source`` is the file the model was converted from: a file whose sha256 is the one
    the conversion recorded (``policyport.source``'s ``sha256``)."""
    from pathlib import Path

    from ..io.kinds import sha256_file
    from ..io.schema import load_json

    try:
        provenance = load_json(recorded or "{}", "model metadata 'policyport.source'")
    except BadModelError:
        return False
    digest = provenance.get("sha256") if isinstance(provenance, dict) else None
    if not isinstance(digest, str) or not isinstance(source, (str, Path)) or not Path(source).is_file():
        return False
    try:
        return sha256_file(source) == digest
    except OSError:
        return False


def _rebuild(proto, source, kind: str, recorded_kind: str | None, options, used: str | None, trust: bool):
    """The :class:`~policyport.converter.Converted` of ``source`` read as ``kind`` with the model's
    recorded ``options`` (only ``keep_value`` and ``opset`` for another kind than ``recorded_kind``);
    a source that does not record its activation takes the model's own (``used``).

    Raises:
        BadModelError: as :func:`_source_reference`.
    """
    import dataclasses

    from ..converter import READS, ConvertOptions, convert_source, flag_list, given_fields
    from ..converter.activations import ActivationNeeded
    from ..errors import OptionError

    if recorded_kind and kind != recorded_kind:
        options = dataclasses.replace(ConvertOptions(), keep_value=options.keep_value, opset=options.opset,
                                      obs_norm=options.obs_norm)
    recorded = given_fields(options)
    if options.input_shape is None and "input_shape" in READS.get(kind, ()):
        options = dataclasses.replace(options, **_input_options(proto, "input_dtypes" in READS.get(kind, ())))
    try:
        try:
            converted = convert_source(source, kind=kind, options=options, trust=trust)
        except ActivationNeeded:  # another kind's file that does not record it (a zip's policy.pth)
            if used in (None, "none") or options.activation is not None:
                raise
            converted = convert_source(source, kind=kind, options=dataclasses.replace(options, activation=used),
                                       trust=trust)
            converted.assumptions = [_from_the_model(a, used) for a in converted.assumptions]
    except BadModelError as e:
        raise BadModelError(f"cannot rebuild the source's forward pass for verification: {e}") from e
    except OptionError as e:  # an option the model records does not apply to this source: the source's fault
        named = [n for n in recorded if flag_list([n]) in str(e)]
        converted_with = f"it was converted with {_flags(options, named)}, and " if named else ""
        raise BadModelError(f"the source does not fit the model: {converted_with}{e}") from e
    return converted


def _from_the_model(assumption, activation: str):
    """An activation assumption of a source rebuilt with the activation the model was built with."""
    import dataclasses

    if assumption.topic != "activation":
        return assumption
    return dataclasses.replace(assumption, because=f"the model's own ({activation}, its policyport.activation), since "
                               f"the source does not record it; {assumption.because.split('; ', 1)[-1]}")


def _flags(options, names) -> str:
    """Option fields ``names`` of ``options`` as the command line spells them: ``--head diag-gaussian
    --keep-value``."""
    from ..converter import flag_list

    def spelled(name: str) -> str:
        value = getattr(options, name)
        if isinstance(value, bool):
            return flag_list([name])
        return f"{flag_list([name])} {','.join(map(str, value)) if isinstance(value, tuple) else value}"

    return " ".join(spelled(name) for name in names)
