"""An exporter's fixed batch of 1, freed and checked against the file's graph at batch 1.

:func:`policyport.graph.passes.free_batch` reads the graph only. :func:`free_checked` is what
:func:`policyport.load` (and so ``run``, ``record``, ``verify``, ``pack`` and ``inspect``) applies: it frees
the batch where the pass allows, then runs the freed graph on :data:`CHECK_ROWS` observations at once and
the file's graph on each of them alone, on the backend asked for, and keeps the file's graph unless every
graph output agrees row for row. The outcome is recorded in the freed model's metadata
(:data:`BATCH_CHECKED_KEY`), so a packed folder carries it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from ..errors import PolicyportError

#: Observations the freed graph is checked on, against the file's graph run on each alone.
CHECK_ROWS = 3
#: Model metadata a checked freed model gets: ``{"rows", "backend", "max_abs"}`` of that check (JSON).
BATCH_CHECKED_KEY = "policyport.batch_checked"
#: Graph metadata (set on the loaded graph, never written to a file) saying why a fixed batch stays fixed.
BATCH_KEPT_KEY = "policyport.batch_kept"
#: Absolute and relative tolerance of the check, by dtype: a row computed alone and within a batch may
#: take another BLAS path (float32: a few ulps of the largest value).
CHECK_TOLERANCE = {"float16": 1e-3, "bfloat16": 1e-2, "float32": 1e-5, "float64": 1e-9}


@dataclass
class BatchFreeing:
    """The outcome of :func:`free_checked`.

    Attributes:
        model: the model to run: the freed copy, or the one given.
        inputs: graph inputs the file declares with a batch of 1 (empty: nothing to free).
        freed: whether ``model`` is the freed copy.
        reason: why the batch stays fixed (``None`` when freed or nothing to free).
        max_abs: the largest absolute difference the check found over every graph output (freed only).
        rows: observations the check ran.
        backend: the backend it ran on.
    """

    model: object
    inputs: list[str] = field(default_factory=list)
    freed: bool = False
    reason: str | None = None
    max_abs: float | None = None
    rows: int = 0
    backend: str = "numpy"

    def describe(self) -> str | None:
        """One sentence for people: what the file fixes and what policyport made of it (``None``: nothing fixed)."""
        if not self.inputs:
            return None
        said = f"batch fixed at 1 in the file ({', '.join(self.inputs)})"
        if self.freed:
            return (f"{said}; every node computes each row alone, so policyport runs it at any batch (checked on "
                    f"{self.rows} observations against the file's graph run on each alone, {self.backend}: max abs "
                    f"{self.max_abs:.3g})")
        return f"{said} and kept: {self.reason}; feed one observation at a time"


def free_checked(proto, backend: str = "numpy", *, threads: int = 1, seed: int = 0) -> BatchFreeing:
    """Free ``proto``'s fixed batch of 1 where the graph allows it and the freed graph computes each row as
    the file's graph does at batch 1.

    Args:
        proto: an ``onnx.ModelProto`` (left untouched).
        backend: ``"numpy"`` or ``"onnxruntime"``: where both graphs are run for the check.
        threads: threads of the check's sessions (default 1).
        seed: seed of the check's observations, drawn uniformly from [0, 1) (default 0).

    Returns:
        A :class:`BatchFreeing`; ``model`` is ``proto`` itself unless freed, and the freed copy then holds
        :data:`BATCH_CHECKED_KEY`. A freed graph that fails to run at :data:`CHECK_ROWS` rows, or whose graph
        outputs differ from the file's beyond :data:`CHECK_TOLERANCE`, is not used, and ``reason`` says so.

    Raises:
        PolicyportError: the file's own graph cannot be loaded or run at batch 1 on ``backend`` (as :func:`policyport.load`).
    """
    from ..graph.passes import BATCH_FREED_KEY, fixed_batch, free_batch

    found = fixed_batch(proto)
    if not found.inputs:
        return BatchFreeing(proto, backend=backend)
    if any(p.key == BATCH_FREED_KEY for p in proto.metadata_props):  # freed and checked before (a packed model)
        checked = _recorded_check({p.key: p.value for p in proto.metadata_props}.get(BATCH_CHECKED_KEY, "{}"))
        return BatchFreeing(proto, found.inputs, True, None, checked.get("max_abs"), checked.get("rows", 0),
                            checked.get("backend", backend))
    if found.reason is not None:
        return BatchFreeing(proto, found.inputs, False, found.reason, backend=backend)
    freed = free_batch(proto)
    original, candidate = _backend(proto, backend, threads), _backend(freed, backend, threads)
    rng = np.random.default_rng(seed)
    feeds = {}
    for v in candidate.inputs:
        shape = tuple(CHECK_ROWS if (axis == 0 and v.name in found.inputs) else (d if isinstance(d, int) else 1)
                      for axis, d in enumerate(v.shape or ()))
        feeds[v.name] = (rng.uniform(0.0, 1.0, shape) if np.issubdtype(v.dtype, np.floating)
                         else rng.integers(0, 2, shape)).astype(v.dtype)
    with np.errstate(all="ignore"):
        alone = [original.run({k: (a[i:i + 1] if k in found.inputs else a) for k, a in feeds.items()})
                 for i in range(CHECK_ROWS)]
        try:
            together = candidate.run(feeds)
        except PolicyportError as e:
            return BatchFreeing(proto, found.inputs, False, f"the freed graph fails at a batch of {CHECK_ROWS} ({e})",
                                backend=backend)
    worst = 0.0
    for name, value in together.items():
        rows = np.concatenate([out[name] for out in alone]) if alone[0][name].ndim else None
        if rows is None or rows.shape != value.shape:
            return BatchFreeing(proto, found.inputs, False, f"the freed graph's output {name!r} has shape {value.shape} at "
                                f"a batch of {CHECK_ROWS}, not the file's {tuple(alone[0][name].shape)} per observation",
                                backend=backend)
        if np.issubdtype(value.dtype, np.floating):
            tol = CHECK_TOLERANCE.get(value.dtype.name, 1e-5)
            a, b = value.astype(np.float64), rows.astype(np.float64)
            with np.errstate(all="ignore"):
                diff = np.where(np.isnan(a) & np.isnan(b), 0.0, np.abs(a - b))
            bad = ~(diff <= tol + tol * np.abs(b))
            worst = max(worst, float(np.nanmax(diff, initial=0.0)) if not np.isnan(diff).all() else np.inf)
        else:
            bad = value != rows
        if bad.any():
            return BatchFreeing(proto, found.inputs, False, f"the freed graph's output {name!r} differs from the file's "
                                f"graph run on each observation alone (checked on {CHECK_ROWS})", backend=backend)
    entry = freed.metadata_props.add()  # freed is this function's own copy
    entry.key, entry.value = BATCH_CHECKED_KEY, json.dumps({"rows": CHECK_ROWS, "backend": backend, "max_abs": worst})
    return BatchFreeing(freed, found.inputs, True, None, worst, CHECK_ROWS, backend)


def _backend(proto, backend: str, threads: int):
    """``proto`` on ``backend`` as the file declares it, batch left fixed: the check builds its feeds from the
    graph inputs itself, so it runs the backend without a :class:`~policyport.runtime.Session` (whose
    :func:`~policyport.runtime.load` calls :func:`free_checked`)."""
    from ..graph.model import from_onnx

    graph = from_onnx(proto)
    if backend == "numpy":
        from .numpy import NumpyBackend

        return NumpyBackend(graph, threads=threads)
    from .ort import OrtBackend

    return OrtBackend(proto, graph, threads=threads)


def _recorded_check(text: str) -> dict:
    """The check of a freed batch a model records under :data:`BATCH_CHECKED_KEY`: ``max_abs`` (a number
    or null), ``rows`` (a whole number) and ``backend`` (a name), each optional.

    Raises:
        BadModelError: text that is not such a JSON object (the model file is damaged).
    """
    from ..errors import BadModelError
    from ..io.schema import load_json

    what = f"model metadata {BATCH_CHECKED_KEY!r}"
    checked = load_json(text, what)
    kinds = {"max_abs": (int, float, type(None)), "rows": int, "backend": str}
    if not isinstance(checked, dict) or any(
            k in checked and (not isinstance(checked[k], t) or isinstance(checked[k], bool)) for k, t in kinds.items()):
        raise BadModelError(f"{what} is malformed: expected an object of max_abs (a number), rows (a whole number) "
                            f"and backend (a name), got {str(text)[:80]!r}")
    return checked
