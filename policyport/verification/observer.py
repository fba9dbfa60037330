"""The observer check: recording and patch points change nothing they should not.

Recording activations (every node output made a graph output on onnxruntime, an observer of the run
loop on numpy) and patching them (the graph split at the patched tensor on onnxruntime, a steered
plan on numpy) must leave the model's computation as it was. On each backend, three checks:

1. **transparency**: the graph outputs of a plain run, of a record of the chosen tensors and of a run
   with a patch point at each of them that changes nothing (``TENSOR[*]*=1``) are equal: bit for bit
   on numpy, whose code is the same; within the dtype tolerance on onnxruntime, whose fusions differ
   once tensors are exposed or the graph is split (Polygraphy compares "mark every tensor as an
   output" runs the same way);
2. **replay**: every node run alone on its recorded inputs (and the model's initializers) reproduces
   its recorded outputs, as TorchLens validates a recording by replaying each op: a recorded tensor
   is what its node computes from what was recorded before it;
3. **sensitivity**: each floating recorded tensor perturbed (``alpha`` times ones added on its last
   axis, ``alpha = 0.25 * (1 + max |value|)``) moves some graph output that depends on it through
   values, and no other: a patch point that moves nothing it feeds is **dead** (its node fused away,
   or its value never read), one that moves an output it does not feed **leaks**.

Tensors that depend on a random node are skipped (no two runs draw the same numbers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from ..errors import InputMismatchError
from .compare import compare, is_floating

#: Ops that read only the shape of their inputs: a perturbed value does not reach their outputs.
SHAPE_READERS = frozenset({"Shape", "Size"})


@dataclass
class Transparency:
    """One graph output of an instrumented run against the plain run: ``instrument`` is ``record``
    or ``patch points``; ``max_abs`` the largest absolute difference; ``exact`` whether bit for bit."""

    backend: str
    instrument: str
    output: str
    max_abs: float
    exact: bool
    passed: bool


@dataclass
class Replay:
    """One node run alone on its recorded inputs: its worst output's ``max_abs`` against the record."""

    backend: str
    node: str
    op_type: str
    outputs: list[str]
    max_abs: float
    exact: bool
    passed: bool
    skipped: str | None = None


@dataclass
class Sensitivity:
    """One perturbed tensor: the graph outputs that depend on it through values (``feeds``), those that
    ``moved``, and the verdict: ``moves``, ``dead`` (feeds floating outputs, moved none), ``leaks``
    (moved an output it does not feed), ``feeds no output`` or ``skipped`` (with ``reason``)."""

    backend: str
    tensor: str
    feeds: list[str]
    moved: list[str]
    status: str
    reason: str | None = None

    @property
    def passed(self) -> bool:
        return self.status in ("moves", "feeds no output", "skipped")


@dataclass
class ObserverReport:
    """The three checks on each backend; :attr:`passed` when every one passes."""

    backends: list[str]
    samples: int
    transparency: list[Transparency] = field(default_factory=list)
    replay: list[Replay] = field(default_factory=list)
    sensitivity: list[Sensitivity] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in [*self.transparency, *self.replay, *self.sensitivity])

    @property
    def dead(self) -> list[Sensitivity]:
        """The dead patch points."""
        return [s for s in self.sensitivity if s.status == "dead"]

    def to_dict(self) -> dict:
        """The JSON document of ``policyport verify --observer --json``."""
        from dataclasses import asdict

        return {"passed": self.passed, "backends": self.backends, "samples": self.samples,
                "transparency": [asdict(t) for t in self.transparency],
                "replay": [asdict(r) for r in self.replay],
                "sensitivity": [{**asdict(s), "passed": s.passed} for s in self.sensitivity],
                "dead": [s.tensor for s in self.dead]}


def observer_check(model, feeds: Mapping[str, np.ndarray], *, backends: Sequence[str] = ("numpy", "onnxruntime"),
                   tensors: str | list[str] | None = "*", atol: float | None = None,
                   rtol: float | None = None) -> ObserverReport:
    """Check that recording and patching leave the model's computation as it was (module docstring).

    Args:
        model: an ``onnx.ModelProto`` or a path to an ``.onnx`` file.
        feeds: input name -> array, the observations to run (or one array for a single-input model).
        backends: the backends to check (default numpy and onnxruntime).
        tensors: the node outputs recorded, patched and perturbed (globs; default every one).
        atol, rtol: tolerances where equality within tolerance is asked for (onnxruntime's
            transparency, every replay); ``None`` (default): by dtype
            (:data:`~policyport.verification.compare.TOLERANCES`).

    Returns:
        An :class:`ObserverReport`.

    Raises:
        InputMismatchError: bad feeds, an unknown backend, patterns that match no tensor.
        UnreadableFileError: the model cannot be read.
    """
    from ..graph.model import from_onnx
    from ..graph.onnx_files import ensure_model
    from ..runtime import load

    proto = ensure_model(model)
    graph = from_onnx(proto)
    random = graph.stochastic_tensors()
    report = ObserverReport(list(backends), 0)
    for backend in backends:
        session = load(proto, backend=backend, free=False)
        if not isinstance(feeds, Mapping):
            feeds = {session.inputs[0].name: feeds}
        names = [n for n in session.selection(tensors) if n not in random]
        plain = session.run(dict(feeds))
        recorded = session.record(dict(feeds), "*")
        from ..runtime.base import count_observations

        report.samples = count_observations(session.inputs, feeds)
        outputs = [v.name for v in session.outputs if v.name not in random]
        identity = [f"{n}[*]*=1" for n in names if _patchable(recorded[n])]
        instrumented = {"record": recorded,
                        "patch points": session.run(dict(feeds), overrides=identity) if identity else plain}
        for instrument, values in instrumented.items():
            for name in outputs:
                c = compare(name, instrument, values[name], "plain", plain[name], atol, rtol)
                exact = _same_bits(values[name], plain[name])
                report.transparency.append(Transparency(
                    backend, instrument, name, float(c.max_abs), exact, exact if backend == "numpy" else c.passed))
        report.replay += _replays(proto, graph, backend, feeds, recorded, random, atol, rtol)
        report.sensitivity += _sensitivity(session, graph, backend, feeds, plain, recorded, names, outputs)
    return report


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _patchable(value) -> bool:
    return isinstance(value, np.ndarray) and value.ndim >= 1 and value.size > 0 and is_floating(value.dtype) \
        and value.dtype.kind == "f"


def _replays(proto, graph, backend: str, feeds, recorded, random, atol, rtol) -> list[Replay]:
    """Each node of the main graph as a one-node model fed its recorded inputs."""
    from onnx import helper

    from ..errors import PolicyportError
    from ..runtime import load

    initializers = {t.name: t for t in proto.graph.initializer}
    values = {**feeds, **recorded}
    results = []
    for node in proto.graph.node:
        outs = [o for o in node.output if o]
        name = node.name or (outs[0] if outs else node.op_type)
        skip = None
        if any(a.type in (a.GRAPH, a.GRAPHS) for a in node.attribute):
            skip = "holds subgraphs"
        elif any(o in random for o in outs):
            skip = f"random: {random[outs[0]]}" if outs[0] in random else "random"
        elif not all(o in recorded for o in outs):
            skip = "an output was not recorded"
        if skip is None:
            inputs, inits = [], []
            for i in dict.fromkeys(x for x in node.input if x):
                if i in initializers and i not in feeds:
                    inits.append(initializers[i])
                else:
                    array = np.asarray(values[i])
                    inputs.append(helper.make_tensor_value_info(i, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape))
            one = helper.make_model(
                helper.make_graph([node], "replay", inputs,
                                  [helper.make_tensor_value_info(o, helper.np_dtype_to_tensor_dtype(np.asarray(recorded[o]).dtype), None)
                                   for o in outs], inits),
                opset_imports=list(proto.opset_import), ir_version=proto.ir_version)
            try:
                got = load(one, backend=backend, free=False).run({v.name: np.asarray(values[v.name]) for v in inputs})
            except PolicyportError as e:
                skip = f"cannot run alone: {e}"
        if skip is not None:
            results.append(Replay(backend, name, node.op_type, outs, 0.0, False, True, skip))
            continue
        worst, exact, passed = 0.0, True, True
        for o in outs:
            c = compare(o, "replay", np.asarray(got[o]), "recorded", np.asarray(recorded[o]), atol, rtol)
            worst = max(worst, float(c.max_abs)) if c.max_abs == c.max_abs else worst
            exact &= _same_bits(got[o], recorded[o])
            passed &= c.passed
        results.append(Replay(backend, name, node.op_type, outs, worst, exact, passed))
    return results


def downstream(graph, tensor: str) -> set[str]:
    """The tensors computed from the value of ``tensor``: through every node that reads it, except
    the shape readers (:data:`SHAPE_READERS`), transitively."""
    readers: dict[str, list] = {}
    for node in graph.nodes:
        if node.op_type in SHAPE_READERS:
            continue
        for i in node.inputs:
            if i:
                readers.setdefault(i, []).append(node)
    reached, todo = set(), [tensor]
    while todo:
        for node in readers.get(todo.pop(), ()):
            for o in node.outputs:
                if o and o not in reached:
                    reached.add(o)
                    todo.append(o)
    return reached


def _sensitivity(session, graph, backend: str, feeds, plain, recorded, names, outputs) -> list[Sensitivity]:
    from ..runtime.overrides import add_direction

    results = []
    for name in names:
        value = recorded[name]
        fed = [o for o in outputs if o in downstream(graph, name)]
        if not _patchable(value):
            results.append(Sensitivity(backend, name, fed, [], "skipped",
                                       "not a floating tensor with a last axis (overrides address neurons there)"))
            continue
        if name in outputs and name not in fed:
            fed = [name, *fed]
        alpha = 0.25 * (1.0 + float(np.max(np.abs(value[np.isfinite(value)]), initial=0.0)))
        try:
            bumped = session.run(dict(feeds), overrides=[add_direction(name, np.ones(value.shape[-1]), alpha)])
        except InputMismatchError as e:
            results.append(Sensitivity(backend, name, fed, [], "skipped", str(e)))
            continue
        moved = [o for o in outputs if not _same_bits(bumped[o], plain[o])]
        leaked = [o for o in moved if o not in fed]
        floating_fed = [o for o in fed if is_floating(np.asarray(plain[o]).dtype)]
        if leaked:
            status = "leaks"
        elif not fed:
            status = "feeds no output"
        elif not moved and floating_fed:
            status = "dead"
        elif not moved:
            status = "skipped"
        else:
            status = "moves"
        reason = "feeds only integer outputs, which a small change need not move" if status == "skipped" else None
        results.append(Sensitivity(backend, name, fed, moved, status, reason))
    return results
