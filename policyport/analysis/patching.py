"""Activation patching: how much of the difference between a clean and a corrupt input's outputs a
tensor (or one neuron of it) carries.

The model runs on the clean observations A and on the corrupt observations B; then, for each chosen
tensor, on B with that tensor's values taken from A's run (all of it, or one neuron at a time with
``per_neuron``), and every later node computes from the patched values. The fraction restored on a
floating graph output ``y`` is the patched output's progress from B's towards A's, measured along the
clean-minus-corrupt difference over every row and element::

    restored = <y_patched - y_B, y_A - y_B> / <y_A - y_B, y_A - y_B>

1 when the patch gives A's output, 0 when it leaves B's; it is the normalised patching metric of
Meng et al. (2022, "Locating and editing factual associations in GPT") and of Zhang & Nanda (2024,
"Towards best practices of activation patching"), taken along the whole output vector rather than one
logit difference. A tensor that every path from the inputs to the output passes through (a whole
layer of an MLP) restores 1 exactly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from ..errors import InputMismatchError, listing
from ..runtime.overrides import patch


@dataclass
class PatchedTensor:
    """One tensor's result.

    Attributes:
        name: the tensor.
        restored: graph output name -> fraction restored by patching the whole tensor.
        neurons: with ``per_neuron``: graph output name -> float64 array ``(width,)``, the fraction
            each neuron (a position on the last axis) restores when patched alone; else empty.
    """

    name: str
    restored: dict[str, float]
    neurons: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class Patching:
    """The result of :func:`activation_patching`.

    Attributes:
        output: the graph output ``restored`` is reported on (``action`` or the first floating one unless chosen).
        outputs: every floating graph output measured.
        difference: output name -> ``||y_A - y_B||`` (the Euclidean norm over rows and elements).
        tensors: one :class:`PatchedTensor` per chosen tensor, in node order.
        skipped: chosen tensors without one row per observation (a constant, a shape): not patched.
        backend: the backend that ran the model.
        rows: observations in each of A and B.
    """

    output: str
    outputs: list[str]
    difference: dict[str, float]
    tensors: list[PatchedTensor]
    skipped: list[str]
    backend: str
    rows: int

    def to_dict(self) -> dict:
        """The JSON document of ``policyport patch --json``: ``restored`` of each tensor on
        :attr:`output`, by output in ``outputs``, and per neuron under ``neurons`` when measured."""
        from .statistics import _num

        def tensor(t: PatchedTensor) -> dict:
            doc = {"name": t.name, "restored": _num(t.restored[self.output]),
                   "outputs": {n: _num(r) for n, r in t.restored.items()}}
            if t.neurons:
                doc["neurons"] = [_num(x) for x in t.neurons[self.output]]
            return doc

        return {"output": self.output, "outputs": self.outputs, "difference": self.difference,
                "backend": self.backend, "rows": self.rows, "tensors": [tensor(t) for t in self.tensors],
                "skipped": self.skipped}


def restored_fraction(patched: np.ndarray, clean: np.ndarray, corrupt: np.ndarray) -> float:
    """``<patched - corrupt, clean - corrupt> / ||clean - corrupt||²`` over every element, in float64.

    Raises:
        InputMismatchError: the clean and corrupt outputs are the same (nothing to restore).
    """
    delta = clean.astype(np.float64) - corrupt
    norm = float(np.vdot(delta, delta))
    if norm == 0.0:
        raise InputMismatchError("the clean and corrupt observations give the same output; there is nothing to restore")
    return float(np.vdot(patched.astype(np.float64) - corrupt, delta)) / norm


def activation_patching(session, clean: Mapping[str, np.ndarray], corrupt: Mapping[str, np.ndarray],
                        tensors: str | list[str] | None = "*", *, per_neuron: bool = False,
                        output: str | None = None, progress: Callable[[int, int], None] | None = None) -> Patching:
    """Patch each chosen tensor (and each neuron of it) from the clean run into the corrupt one.

    Args:
        session: the model, a :class:`~policyport.runtime.Session` on any backend.
        clean: feeds A (input name -> array, or the array of a single-input model, as for
            :meth:`Session.run <policyport.runtime.Session.run>`).
        corrupt: feeds B, the same inputs; as many observations as A, or A holds one (its activations
            then go into every row of B).
        tensors: node-output names or globs (default every one); tensors without one row per
            observation are skipped and listed.
        per_neuron: also patch each neuron alone (one run per neuron).
        output: the graph output to report ``restored`` on; default ``action`` when the model has a
            floating one (a decoded deterministic action), else the first floating graph output.
            Every floating graph output is measured.
        progress: called as ``progress(runs_done, runs_total)`` after each patched run.

    Returns:
        A :class:`Patching`.

    Raises:
        InputMismatchError: bad feeds or tensors; A and B of different row counts (A not one row);
            an unknown or non-floating ``output``; clean and corrupt outputs that do not differ.
    """
    names = session.selection(tensors)
    clean, corrupt = as_feeds(session, clean), as_feeds(session, corrupt)
    rows_a, rows_b = (_rows(session, f) for f in (clean, corrupt))
    if rows_a not in (1, rows_b):
        raise InputMismatchError(f"the clean observations have {rows_a:,} rows and the corrupt {rows_b:,}; give as "
                                 "many, or one clean observation to patch into every corrupt one")
    a = session.record(dict(clean), names)
    b = session.run(dict(corrupt))
    floating, output = measured_output(session, b, output)
    clean_out = {n: np.broadcast_to(a[n], b[n].shape) for n in floating}
    difference = {n: float(np.linalg.norm(clean_out[n].astype(np.float64) - b[n])) for n in floating}
    restored_fraction(b[output], clean_out[output], b[output])  # refuses outputs that do not differ
    found = session.per_observation(dict(clean), names)
    with_rows = set(found[0]) if found is not None else set(names)
    chosen = [n for n in names if n in with_rows]
    skipped = [n for n in names if n not in with_rows]

    def measure(outputs: Mapping[str, np.ndarray]) -> dict[str, float]:
        return {n: restored_fraction(outputs[n], clean_out[n], b[n]) if difference[n] else float("nan") for n in floating}

    widths = {n: (a[n].shape[-1] if a[n].ndim else 1) for n in chosen}
    total, done = len(chosen) + (sum(widths.values()) if per_neuron else 0), 0
    results = []
    for name in chosen:
        result = PatchedTensor(name, measure(session.run(dict(corrupt), overrides=[patch(name, a[name])])))
        done += 1
        if progress is not None:
            progress(done, total)
        if per_neuron:
            per = {n: np.empty(widths[name]) for n in floating}
            for i in range(widths[name]):
                fractions = measure(session.run(dict(corrupt), overrides=[patch(name, a[name], i)]))
                for n, r in fractions.items():
                    per[n][i] = r
                done += 1
                if progress is not None:
                    progress(done, total)
            result.neurons = per
        results.append(result)
    return Patching(output, floating, difference, results, skipped, session.backend.name, rows_b)


def measured_output(session, outputs: Mapping[str, np.ndarray], output: str | None) -> tuple[list[str], str]:
    """The floating graph outputs of a run (``outputs``), and the one to report: ``output`` if given,
    else ``action`` when it is floating (a decoded deterministic action), else the first.

    Raises:
        InputMismatchError: no floating graph output, or ``output`` is not one.
    """
    floating = [v.name for v in session.outputs if np.issubdtype(outputs[v.name].dtype, np.floating)]
    if output is None:
        if not floating:
            raise InputMismatchError("the model has no floating graph output to measure")
        return floating, "action" if "action" in floating else floating[0]
    if output not in floating:
        raise InputMismatchError(f"{output!r} is not a floating graph output; choose one of {listing(floating, show=str)}")
    return floating, output


def as_feeds(session, feeds) -> dict[str, np.ndarray]:
    """``feeds`` as a dict: an array alone feeds a single-input model's input (as :meth:`Session.run
    <policyport.runtime.Session.run>` takes it); the session checks the rest."""
    if isinstance(feeds, Mapping):
        return dict(feeds)
    if len(session.inputs) != 1:
        raise InputMismatchError(f"the model has inputs {[v.name for v in session.inputs]}; pass a dict of feeds")
    return {session.inputs[0].name: feeds}


def _rows(session, feeds: Mapping[str, np.ndarray]) -> int:
    from ..runtime.base import count_observations

    return count_observations(session.inputs, feeds)


def plot_patching(result: Patching, path: str | os.PathLike, *, force: bool = False) -> Path:
    """:func:`patching_png` written to ``path``, atomically.

    Raises:
        MissingDependencyError: matplotlib is missing (the ``analysis`` extra).
        OutputExistsError: ``path`` exists and ``force`` is false.
    """
    from ..io.outputs import check_writable, write_atomic

    check_writable(path, force)
    return write_atomic(path, patching_png(result), force)


def patching_png(result: Patching):
    """A writer (``write(file)``) of the heat map of ``restored`` as a PNG: tensor × neuron with
    ``per_neuron`` (a tensor narrower than the widest left blank beyond its width), else tensor ×
    graph output, each cell labelled.

    Raises:
        InputMismatchError: no tensor was patched.
        MissingDependencyError: matplotlib is missing (the ``analysis`` extra).
    """
    from .plots import _figure, _quiet_matplotlib, shown

    tensors = [t.name for t in result.tensors]
    if not tensors:
        raise InputMismatchError("no tensor was patched, so there is nothing to plot")
    per_neuron = bool(result.tensors[0].neurons)
    if per_neuron:
        width = max(len(t.neurons[result.output]) for t in result.tensors)
        grid = np.full((len(tensors), width), np.nan)
        for i, t in enumerate(result.tensors):
            grid[i, :len(t.neurons[result.output])] = t.neurons[result.output]
        columns, xlabel = None, f"neuron (restored on {result.output})"
    else:
        grid = np.array([[t.restored[o] for o in result.outputs] for t in result.tensors])
        columns, xlabel = result.outputs, "graph output"
    with _quiet_matplotlib():
        fig = _figure(min(14.0, 3.0 + 0.04 * grid.shape[1]) if per_neuron else 2.5 + 1.4 * grid.shape[1],
                      1.2 + 0.45 * len(tensors))
        ax = fig.add_subplot()
        finite = grid[np.isfinite(grid)]
        largest = float(np.abs(finite).max()) if finite.size else 0.0
        bound = (largest or 1.0) if per_neuron else max(1.0, largest)  # a neuron alone restores little
        image = ax.imshow(grid, aspect="auto", cmap="RdBu_r", vmin=-bound, vmax=bound, interpolation="nearest")
        ax.set_yticks(range(len(tensors)), [shown(n) for n in tensors])
        if columns is not None:
            ax.set_xticks(range(len(columns)), [shown(c) for c in columns])
            for i in range(grid.shape[0]):
                for j in range(grid.shape[1]):
                    ax.text(j, i, f"{grid[i, j]:.3f}", ha="center", va="center", fontsize=8)
        ax.set_xlabel(xlabel)
        ax.set_title(f"activation patching: fraction of the clean-vs-corrupt difference restored ({result.backend})",
                     fontsize=9)
        fig.colorbar(image, ax=ax, label="restored")
    return lambda f: fig.savefig(f, format="png")
