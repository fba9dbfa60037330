"""Ablation importance: how much an output moves when one neuron is ablated, over a whole dataset.

For every neuron ``j`` of every selected tensor ``T`` (a neuron is a position on ``T``'s last axis,
as for :mod:`policyport.runtime.overrides`), the neuron is *ablated*, set to a constant ``c_j``
for every observation, and the chosen output ``y`` is computed again:

* ``zero`` ablation: ``c_j = 0``;
* ``mean`` ablation: ``c_j`` is the neuron's mean over the dataset (over the rows and every axis but
  the last), found in a first streaming pass, or read from a recording of the same tensors.

The neuron's score is the mean absolute change of the output,
``score_j = mean over observations and selected output elements of |y(T with T[..., j] = c_j) - y|``,
and ``mean_change_j`` the same mean of the signed change: the unit ablation of Meyes et al., "Ablation
Studies in Artificial Neural Networks" (2019), with zero or mean ablation as interpretability work
uses them, averaged over a dataset.

How it is computed, fast: the model is cut after ``T`` (:func:`policyport.graph.passes.split_at`),
so only the part of the graph that reads ``T`` (its *downstream*) runs again. Each block of
observations is recorded once; then its ``T`` (and whatever else the downstream reads) is
replicated once per neuron of a group of neurons, and in copy ``k`` neuron ``j0 + k`` is set to
``c`` by an override edit (:class:`policyport.runtime.overrides.Edit`): one run of the downstream on
``group × block`` rows ablates ``group`` neurons at once. The replicated batch holds at most
``max(batch_size, max_rows)`` rows, so memory is bounded by the block and ``max_rows`` however large
the dataset (1 million observations stream like 1,000).

Engines: ``local`` (this process, numpy or onnxruntime) and ``ray`` (Ray Data: each worker builds the
sessions once and returns the per-neuron sums of its block, which are added up in the caller).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import InputMismatchError, OptionError, check_argument, listing, require

#: Ablations: ``zero`` sets a neuron to 0, ``mean`` to its mean over the dataset.
ABLATIONS = ("zero", "mean")
#: Default observations per block.
DEFAULT_BATCH = 1024
#: Default largest batch a downstream run takes (a block replicated once per neuron of a group).
MAX_ROWS = 16384

Progress = Callable[[int, int], None]  # (rows done, rows in total), over every pass

_OUTPUT = re.compile(r"^(?P<name>.+?)\[(?P<index>[^\[\]]*)\]$")


@dataclass
class TensorImportance:
    """The ablation importance of every neuron of one tensor.

    Attributes:
        name: the tensor (a node output).
        values: float64 array, shape (neurons,): the value each neuron was set to (0, or its mean).
        scores: float64 array, shape (neurons,): mean absolute change of the output per neuron.
        mean_change: float64 array, shape (neurons,): mean signed change of the output per neuron.
    """

    name: str
    values: np.ndarray
    scores: np.ndarray
    mean_change: np.ndarray

    @property
    def neurons(self) -> int:
        return len(self.scores)

    def ranked(self, top: int | None = None) -> list[dict]:
        """Neurons by falling score (ties by neuron number): ``{"neuron", "score", "mean_change",
        "value"}`` each; the first ``top`` (default all)."""
        order = sorted(range(self.neurons), key=lambda j: (-self.scores[j], j))[:top]
        return [{"neuron": j, "score": float(self.scores[j]), "mean_change": float(self.mean_change[j]),
                 "value": float(self.values[j])} for j in order]


@dataclass
class Importance:
    """What :func:`importance` found.

    Attributes:
        output: the graph output measured; ``elements``: its last-axis positions measured (None: all).
        ablation: ``"zero"`` or ``"mean"``.
        rows: observations.
        tensors: one :class:`TensorImportance` per selected tensor, in node order.
        skipped: selected tensors left out, name -> why (no batch axis, the output does not read them).
        backend, engine: what ran it; seconds: wall time.
    """

    output: str
    elements: tuple[int, ...] | None
    ablation: str
    rows: int
    tensors: list[TensorImportance]
    skipped: dict[str, str] = field(default_factory=dict)
    backend: str = "numpy"
    engine: str = "local"
    seconds: float = 0.0

    @property
    def measured(self) -> str:
        """The output as given: ``action`` or ``action[0]``."""
        return self.output if self.elements is None else f"{self.output}[{','.join(map(str, self.elements))}]"

    def to_dict(self, top: int | None = None) -> dict:
        """JSON-ready: per tensor a ranked list of neurons with their ``score`` (the first ``top``)."""
        return {"output": self.measured, "ablation": self.ablation, "rows": self.rows, "backend": self.backend,
                "engine": self.engine, "seconds": self.seconds,
                "score": "mean absolute change of the output over observations and output elements",
                "tensors": [{"name": t.name, "neurons": t.neurons, "ranked": t.ranked(top)} for t in self.tensors],
                "skipped": [{"name": n, "reason": r} for n, r in self.skipped.items()]}


def parse_output(text: str) -> tuple[str, tuple[int, ...] | None]:
    """``NAME`` or ``NAME[INDEX]`` (INDEX: a position on the last axis, a comma list, or a range
    ``a:b``, as in the override grammar) -> (name, positions or None for all).

    Raises:
        OptionError: a malformed index (exit 2).
    """
    m = _OUTPUT.match(text.strip())
    if not m:
        return text.strip(), None
    index = m["index"].strip()
    bad = OptionError(f"--output (output=) {text!r}: index {index!r} is not a position, a comma list or a range a:b")
    try:
        numbers = [int(p) for p in index.split(":" if ":" in index else ",")]
    except ValueError:
        raise bad from None
    if ":" in index:
        if len(numbers) != 2 or not 0 <= numbers[0] < numbers[1]:
            raise bad
        numbers = list(range(*numbers))
    if min(numbers) < 0:
        raise bad
    return m["name"].strip(), tuple(dict.fromkeys(numbers))


def choose_output(outputs: list[str], given: str | None) -> tuple[str, tuple[int, ...] | None]:
    """The output to measure: ``given`` (``NAME`` or ``NAME[INDEX]``), else ``action`` if the model
    has it, else its only graph output.

    Raises:
        InputMismatchError: ``given`` names no graph output (exit 3, as ``run --outputs`` and
            ``patch --output`` do).
        OptionError: none is given and the model has several outputs and none is called ``action``
            (exit 2).
    """
    if given is None:
        if "action" in outputs or len(outputs) == 1:
            return ("action" if "action" in outputs else outputs[0]), None
        raise OptionError(f"the model has outputs [{listing(outputs)}] and none is called 'action'; "
                                 "name the one to measure with --output (output=)")
    name, elements = parse_output(given)
    if name not in outputs:
        raise InputMismatchError(f"--output (output=) {given!r}: the model has no graph output {name!r}; it has "
                                 f"[{listing(outputs)}]")
    return name, elements


@dataclass
class Downstream:
    """The part of a model that reads one tensor ``T``: a session of the stage after the cut, and what it reads.

    When ``T``'s only reader is a linear node ``Z = alpha * T @ W (+ C)`` (MatMul or Gemm with
    ``transA=0``, the weight an initializer), the cut is after that node instead and ``linear``
    holds ``alpha * W`` as rows (K, N): setting ``T[..., j]`` to ``c`` moves ``Z`` by
    ``(c - T[..., j]) * alpha * W[j, :]``, a rank-one update, so the ablated ``Z`` is computed
    without the matrix product (ONNX Gemm, opset 13: ``Y = alpha * A' @ B' + beta * C``; MatMul:
    numpy.matmul semantics). ``session`` is None when ``Z`` is the measured output itself.
    """

    tensor: str
    session: object  # policyport.runtime.Session, or None (the cut tensor is the output)
    inputs: list[str]
    linear: np.ndarray | None = None
    cut: str = ""  # the tensor the stage reads in place of T (T itself, or Z)

    def __post_init__(self):
        self.cut = self.cut or self.tensor


def linear_reader(proto, tensor: str) -> tuple[str, np.ndarray] | None:
    """``(Z, alpha * W)`` when the only node reading ``tensor`` is ``Z = alpha * tensor @ W (+ C)``
    with ``W`` a 2-D initializer (see :class:`Downstream`); else None."""
    from ..graph.model import tensor_array

    g = proto.graph
    readers = [n for n in g.node if tensor in n.input]
    outputs = {o.name for o in g.output}
    if len(readers) != 1 or tensor in outputs:
        return None
    n = readers[0]
    attrs = {a.name: a for a in n.attribute}
    inits = {t.name: t for t in g.initializer}
    if n.domain not in ("", "ai.onnx") or n.op_type not in ("MatMul", "Gemm") or len(n.input) < 2:
        return None
    if n.input[0] != tensor or tensor in n.input[1:] or n.input[1] not in inits:
        return None
    weight = tensor_array(inits[n.input[1]]).astype(np.float64)
    if weight.ndim != 2 or weight.dtype.kind != "f":
        return None
    if n.op_type == "Gemm":
        if "transA" in attrs and attrs["transA"].i:
            return None
        if "transB" in attrs and attrs["transB"].i:
            weight = weight.T
        weight = weight * (attrs["alpha"].f if "alpha" in attrs else 1.0)
    return n.output[0], weight


def downstreams(proto, names: list[str], output: str, backend: str, threads: int = 0
                ) -> tuple[dict[str, Downstream], dict[str, str]]:
    """For each tensor of ``names``, the stage of the model after a cut at it that computes ``output``
    (after its linear reader, where it has one: see :class:`Downstream`).

    Returns:
        (tensor -> :class:`Downstream`, tensor -> why it is left out: the output does not read it).
    """
    from ..graph.passes import split_at
    from ..runtime import load

    def stage_after(cut: str):
        return next((s for s in split_at(proto, [cut], keep=[output]) if cut in s.inputs and output in s.outputs), None)

    found, skipped = {}, {}
    for name in names:
        if name == output:
            skipped[name] = "it is the measured output"
            continue
        stage = stage_after(name)
        if stage is None:
            skipped[name] = f"{output!r} does not depend on it"
            continue
        linear = linear_reader(proto, name)
        if linear is not None and linear[0] == output:
            found[name] = Downstream(name, None, [output], linear[1], output)
            continue
        if linear is not None and (after := stage_after(linear[0])) is not None:
            stage = after
        else:
            linear = None
        found[name] = Downstream(name, load(stage.model, backend=backend, threads=threads), list(stage.inputs),
                                 *(() if linear is None else (linear[1], linear[0])))
    return found, skipped


def ablation_edits(tensor: str, values: np.ndarray) -> list:
    """One override edit per neuron: ``TENSOR[j]=values[j]`` (:class:`~policyport.runtime.overrides.Edit`)."""
    from ..runtime.overrides import parse_overrides

    return parse_overrides({tensor: {j: float(v) for j, v in enumerate(values)}})


class Ablator:
    """The per-block computation of :func:`importance`: sums of absolute and signed output changes
    for every neuron of every tensor, over the blocks given to :meth:`add`.

    Args:
        session: the whole model, loaded.
        downs: tensor -> its :class:`Downstream`.
        values: tensor -> float64 array (neurons,), the ablated values.
        output, elements: the measured graph output and its last-axis positions (None: all).
        max_rows: the largest batch a downstream run takes (at least one block).
    """

    def __init__(self, session, downs: dict[str, Downstream], values: dict[str, np.ndarray], output: str,
                 elements: tuple[int, ...] | None, max_rows: int = MAX_ROWS):
        self.session, self.downs, self.output, self.max_rows = session, downs, output, max_rows
        self.elements = None if elements is None else np.asarray(elements, dtype=np.intp)
        self.values = values
        self.edits = {t: ablation_edits(t, values[t]) for t in downs}
        needed = list(dict.fromkeys(n for d in downs.values() for n in [d.tensor, *d.inputs]))
        self.recorded = [n for n in needed if n in set(session.tensor_names)]
        self.abs_sums = {t: np.zeros(len(values[t])) for t in downs}
        self.sums = {t: np.zeros(len(values[t])) for t in downs}
        self.largest_run = 0  # the most rows a downstream run took so far

    def _measured(self, y: np.ndarray) -> np.ndarray:
        return y if self.elements is None else y[..., self.elements]

    def add(self, feeds: dict[str, np.ndarray]) -> int:
        """Add one block of observations (feeds as for :meth:`Session.run`); returns its rows."""
        values = self.session.record(feeds, self.recorded)
        rows = None
        for t, down in self.downs.items():
            sources = {n: (values[n] if n in values else feeds[n]) for n in down.inputs}
            rows = len(values[t])
            width = values[t].shape[-1]
            base = self._measured(sources[down.cut] if down.session is None else down.session.run(sources)[self.output])
            group = max(1, min(width, self.max_rows // max(rows, 1)))
            for j0 in range(0, width, group):
                g = min(group, width - j0)
                fed = {n: np.tile(a, (g,) + (1,) * (a.ndim - 1)) for n, a in sources.items() if n != down.cut}
                fed[down.cut] = self._ablated(down, values[t], sources[down.cut], j0, g)
                self.largest_run = max(self.largest_run, g * rows)
                y = self._measured(fed[down.cut] if down.session is None else down.session.run(fed)[self.output])
                change = (y.reshape(g, *base.shape) - base).reshape(g, -1).astype(np.float64)
                per_row = change.shape[1] / max(rows, 1)  # output elements per observation
                self.abs_sums[t][j0:j0 + g] += np.abs(change).sum(axis=1) / per_row
                self.sums[t][j0:j0 + g] += change.sum(axis=1) / per_row
        return 0 if rows is None else rows

    def _ablated(self, down: Downstream, value: np.ndarray, cut: np.ndarray, j0: int, g: int) -> np.ndarray:
        """``g`` copies of the block's cut tensor, neuron ``j0 + k`` of ``T`` ablated in copy ``k``,
        rows ``(g * rows, ...)``: by the override edit itself, or through the linear reader."""
        if down.linear is None:
            copies = np.tile(cut, (g,) + (1,) * (cut.ndim - 1))
            blocks = copies.reshape(g, len(cut), *cut.shape[1:])
            for k in range(g):
                self.edits[down.tensor][j0 + k].apply(blocks[k])
            return copies
        targets = self.values[down.tensor][j0:j0 + g].astype(value.dtype)
        delta = np.moveaxis(targets - value[..., j0:j0 + g], -1, 0)  # (g, rows, ...): c_j - T[..., j]
        rows_of_w = down.linear[j0:j0 + g].astype(cut.dtype).reshape(g, *(1,) * (cut.ndim - 1), -1)
        copies = delta[..., None] * rows_of_w
        copies += cut
        return copies.reshape(g * len(cut), *cut.shape[1:])


def neuron_sums(blocks, names: list[str]) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """Per-neuron float64 sums over rows and every axis but the last, and the count of values each
    sum holds, of the tensors ``names`` over ``blocks`` (dicts name -> array with rows first)."""
    sums: dict[str, np.ndarray] = {}
    counts = dict.fromkeys(names, 0)
    for block in blocks:
        for n in names:
            a = np.asarray(block[n])
            flat = a.reshape(-1, a.shape[-1]) if a.ndim >= 2 else a.reshape(-1, 1)
            sums[n] = sums.get(n, 0) + flat.sum(axis=0, dtype=np.float64)
            counts[n] += len(flat)
    return sums, counts


def _means(sums, counts, names, where: str) -> dict[str, np.ndarray]:
    empty = [n for n in names if not counts.get(n)]
    if empty:
        raise InputMismatchError(f"{where} has no rows for [{listing(empty)}]: no mean to ablate to")
    return {n: sums[n] / counts[n] for n in names}


def recorded_means(recording, names: list[str], batch_size: int = 65536) -> dict[str, np.ndarray]:
    """Per-neuron means of ``names`` from a recording (:func:`~policyport.analysis.open_recording`).

    Raises:
        InputMismatchError: the recording lacks a tensor, or has no rows.
    """
    from .recording import open_recording

    rec = open_recording(recording)
    missing = [n for n in names if n not in {t.name for t in rec.tensors}]
    if missing:
        raise InputMismatchError(f"mean ablation: the recording {recording} holds no [{listing(missing)}]; record "
                                 f"them with policyport record --tensors, or drop --means to compute the means")
    return _means(*neuron_sums(rec.iter_batches(batch_size, names), names), names, f"the recording {recording}")


def importance(model, data, *, tensors="*", ablation: str = "zero", output: str | None = None, means=None,
               batch_size: int = DEFAULT_BATCH, engine: str = "local", backend: str = "numpy",
               max_rows: int = MAX_ROWS, progress: Progress | None = None, threads: int = 0) -> Importance:
    """Ablation importance of every neuron of the selected tensors, over a dataset (see the module docstring).

    Args:
        model: an ``onnx.ModelProto``, a path to an ``.onnx`` file or a packed folder.
        data: observations: an ``.npy``, ``.npz`` or ``.parquet`` file, or a folder of them, of any
            size, read block by block (as for :func:`~policyport.analysis.record_dataset`).
        tensors: ``fnmatch`` globs over node-output names (default every tensor); tensors without a
            row per observation and those the output does not read are left out (``skipped``).
        ablation: ``"zero"`` (default) or ``"mean"``.
        output: the graph output to measure, ``NAME`` or ``NAME[INDEX]`` (positions on its last
            axis: ``action[0]``); default ``action``, or the only output.
        means: for ``mean`` ablation, a recording holding the selected tensors to take the means
            from; default None: a first streaming pass over ``data`` computes them.
        batch_size: observations per block (default 1,024).
        engine: ``"local"`` (default) or ``"ray"`` (numpy backend on every worker; the ``ray`` extra).
        backend: the local engine's backend, ``"numpy"`` (default) or ``"onnxruntime"``.
        max_rows: the largest batch one downstream run takes (default 16,384): memory is bounded by
            ``max(batch_size, max_rows)`` rows of the downstream's tensors.
        progress: called as ``progress(rows_done, rows_total)`` after each block; with a mean pass
            the total counts the dataset twice.
        threads: threads of the local engine's sessions (0: one per core).

    Returns:
        An :class:`Importance`.

    Raises:
        OptionError: an unknown ablation or engine, a batch size or ``max_rows`` below 1, an output
            without a row per observation, ``means`` with zero ablation, the ray engine with another
            backend than numpy (exit 2).
        InputMismatchError: an output the model lacks or positions not on its last axis, a tensor
            pattern that matches nothing, no selected tensor that the output reads, data that does
            not fit the model (exit 3).
        UnreadableFileError: unreadable data or recording.
        MissingDependencyError: onnx (the cut), pyarrow (parquet) or ray missing.
    """
    from ..graph.onnx_files import ensure_model, load_onnx
    from ..runtime import load
    from .engines import ENGINES, batched_tensors, feed_columns
    from .tables import open_table

    if ablation not in ABLATIONS:
        raise OptionError(f"unknown ablation {ablation!r} (--ablation, ablation=); choose one of {', '.join(ABLATIONS)}")
    if engine not in ENGINES:
        raise OptionError(f"unknown engine {engine!r} (--engine, engine=); choose one of {', '.join(ENGINES)}")
    if means is not None and ablation != "mean":
        raise OptionError("a recording of means (--means, means=) is for mean ablation; add --ablation mean (ablation='mean')")
    for value, what in ((batch_size, "batch_size (observations per block)"), (max_rows, "max_rows")):
        check_argument(value, what, "int")
        if value < 1:
            raise OptionError(f"{what} must be at least 1, got {value}")
    if engine == "ray" and backend != "numpy":
        raise OptionError("the ray engine (--engine ray, engine='ray') runs the numpy backend on every worker; drop --backend")
    proto = load_onnx(model) if isinstance(model, (str, os.PathLike)) and Path(model).is_dir() else ensure_model(model)
    session = load(proto, backend=backend, threads=threads)
    out_name, elements = choose_output([v.name for v in session.outputs], output)
    table = open_table(data)
    columns = feed_columns(table, [v.name for v in session.inputs])
    selected = session.selection(tensors)
    infos, no_rows = batched_tensors(session, table, columns, selected)
    if table.rows == 0:
        raise InputMismatchError(f"{data} holds no observations")
    nodes = set(selected)  # the record also returns every graph output
    candidates = [t.name for t in infos if t.name in nodes and t.name != out_name and t.shape]
    skipped = {n: "no row per observation" for n in no_rows}
    if out_name in nodes:
        skipped[out_name] = "it is the measured output"
    skipped.update({t.name: "one value per observation, no neuron axis" for t in infos
                    if t.name in nodes and t.name != out_name and not t.shape})
    out_info = next((t for t in infos if t.name == out_name), None)
    if out_info is None:
        raise OptionError(f"output {out_name!r} has no row per observation; choose another with --output (output=)")
    if elements is not None and (not out_info.shape or max(elements) >= out_info.shape[-1]):
        raise InputMismatchError(f"--output (output=) {output!r}: {out_name!r} has shape {tuple(out_info.shape)} per "
                                 f"observation; positions {list(elements)} are not on its last axis")
    downs, left = downstreams(proto, candidates, out_name, backend, threads)
    skipped.update(left)
    if not downs:
        raise InputMismatchError(f"no selected tensor feeds {out_name!r}: {listing(skipped, show=lambda n: f'{n} ({skipped[n]})')}")
    widths = {t.name: t.shape[-1] for t in infos if t.name in downs}
    passes = 2 if ablation == "mean" and means is None else 1
    started = time.perf_counter()
    if engine == "ray":
        result = _importance_ray(proto, table, data, columns, widths, out_name, elements, ablation, means,
                                 batch_size, max_rows, progress, passes)
    else:
        result = _importance_local(session, downs, table, columns, widths, out_name, elements, ablation, means,
                                   batch_size, max_rows, progress, passes)
    result.skipped, result.backend, result.engine = skipped, backend, engine
    result.seconds = time.perf_counter() - started
    return result


def feed_blocks(table, columns: dict[str, str], batch_size: int):
    """The dataset's feeds, block by block: graph input -> array of at most ``batch_size`` rows."""
    for block in table.iter_batches(batch_size, list(dict.fromkeys(columns.values()))):
        yield {i: block[c] for i, c in columns.items()}


def _counted(blocks, progress: Progress | None, offset: int, total: int):
    done = offset
    for feeds in blocks:
        yield feeds
        done += len(next(iter(feeds.values())))
        if progress is not None:
            progress(done, total)


def _importance_local(session, downs, table, columns, widths, out_name, elements, ablation, means, batch_size,
                      max_rows, progress, passes) -> Importance:
    total, names = table.rows * passes, list(widths)
    if ablation == "zero":
        values = {n: np.zeros(widths[n]) for n in names}
    elif means is not None:
        values = recorded_means(means, names)
    else:
        blocks = (session.record(f, names) for f in _counted(feed_blocks(table, columns, batch_size), progress, 0, total))
        values = _means(*neuron_sums(blocks, names), names, f"the dataset {table.path}")
    ablator = Ablator(session, downs, values, out_name, elements, max_rows)
    for feeds in _counted(feed_blocks(table, columns, batch_size), progress, total - table.rows, total):
        ablator.add(feeds)
    return finish(ablator.abs_sums, ablator.sums, values, table.rows, out_name, elements, ablation)


def finish(abs_sums, sums, values, rows: int, out_name, elements, ablation) -> Importance:
    """The :class:`Importance` from the per-neuron sums over ``rows`` observations."""
    scale = 1 / max(rows, 1)
    return Importance(out_name, elements, ablation, rows,
                      [TensorImportance(n, np.asarray(values[n], dtype=np.float64), abs_sums[n] * scale, sums[n] * scale)
                       for n in abs_sums])


def plot_importance(result: Importance, path, *, top: int = 20, force: bool = False) -> Path:
    """A PNG: per tensor, a bar chart of its ``top`` neurons by score (matplotlib, Agg).

    Raises:
        OutputExistsError: ``path`` exists (without ``force``).
        MissingDependencyError: matplotlib missing.
    """
    from ..io.outputs import write_atomic
    from .plots import _figure, _quiet_matplotlib, shown

    n = len(result.tensors)
    fig = _figure(7, 2.2 * n + 0.6)
    axes = fig.subplots(n, 1, squeeze=False)[:, 0]
    for ax, t in zip(axes, result.tensors):
        ranked = t.ranked(top)
        ax.bar(range(len(ranked)), [r["score"] for r in ranked], color="tab:blue")
        ax.set_xticks(range(len(ranked)), [str(r["neuron"]) for r in ranked], fontsize=7)
        ax.set_title(f"{shown(t.name)}: top {len(ranked)} of {t.neurons} neurons", fontsize=9)
        ax.set_ylabel("mean |change|", fontsize=8)
        ax.set_xlabel("neuron", fontsize=8)
    fig.suptitle(f"{result.ablation}-ablation importance for {shown(result.measured)} over {result.rows:,} observations",
                 fontsize=10)
    with _quiet_matplotlib():
        return write_atomic(Path(path), lambda f: fig.savefig(f, format="png"), force)


# ------------------------------------------------------------------------------------------------ ray


class AblateBatch:
    """The Ray Data map of the ``ray`` engine: the sessions built once per worker; each call reads
    one block of rows and returns the per-neuron sums of that block, one float64 vector.

    ``values`` None: the mean pass (per-neuron sums of the tensors and their counts); else the
    ablation pass (absolute and signed output-change sums, tensor after tensor)."""

    def __init__(self, model: bytes, names: list[str], output: str, elements, columns: dict[str, str],
                 values: dict[str, np.ndarray] | None, max_rows: int):
        from ..runtime import load
        from .engines import _proto

        proto = _proto(model)
        self.session = load(proto, backend="numpy", threads=1)  # one worker per core already
        self.names, self.columns = names, columns
        self.ablator = None
        if values is not None:
            downs, _ = downstreams(proto, names, output, "numpy", threads=1)
            self.ablator = Ablator(self.session, downs, values, output, elements, max_rows)
        self._tables: dict = {}

    def __call__(self, item: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from .tables import open_table

        path, start, stop = (item[k][0] for k in ("path", "start", "stop"))
        table = self._tables.get(path) or self._tables.setdefault(path, open_table(path))
        block = table.read_rows(int(start), int(stop), list(dict.fromkeys(self.columns.values())))
        feeds = {i: block[c] for i, c in self.columns.items()}
        if self.ablator is None:
            sums, counts = neuron_sums([self.session.record(feeds, self.names)], self.names)
            vector = np.concatenate([np.append(sums[n], counts[n]) for n in self.names])
        else:
            for t in self.names:
                self.ablator.abs_sums[t][:] = 0
                self.ablator.sums[t][:] = 0
            self.ablator.add(feeds)
            vector = np.concatenate([np.concatenate([self.ablator.abs_sums[n], self.ablator.sums[n]]) for n in self.names])
        return {"rows": np.array([stop - start]), "sums": vector[None, :]}


def _importance_ray(proto, table, data, columns, widths, out_name, elements, ablation, means, batch_size,
                    max_rows, progress, passes) -> Importance:
    """The ``ray`` engine of :func:`importance`: blocks of ``batch_size`` rows of one file each, a Ray
    dataset of ``(file, first row, last row)``; ``map_batches`` runs :class:`AblateBatch` on each and
    the caller adds up the vectors it returns. The data files must be reachable from every worker."""
    from .engines import start_ray
    from .tables import FolderTable

    ray = require("ray", "ray", "importance with --engine ray")
    parts = table.parts if isinstance(table, FolderTable) else [table]
    kinds = {p.path.suffix for p in parts}
    if not kinds <= {".npy", ".parquet"}:
        raise InputMismatchError(f"the ray engine reads .npy and .parquet files; {data} holds {sorted(kinds)}")
    blocks = [{"path": str(p.path), "start": s, "stop": min(s + batch_size, p.rows)}
              for p in parts for s in range(0, p.rows, batch_size)]
    names = list(widths)
    model = proto.SerializeToString()
    total = table.rows * passes
    ray_data = start_ray(ray)

    def run(values, offset: int) -> np.ndarray:
        mapped = ray_data.from_items(blocks).map_batches(AblateBatch, fn_constructor_kwargs={
            "model": model, "names": names, "output": out_name, "elements": elements, "columns": columns,
            "values": values, "max_rows": max_rows}, batch_size=1, batch_format="numpy",
            compute=ray_data.ActorPoolStrategy(min_size=1))
        total_sums, done = 0, offset
        for row in mapped.iter_rows():
            total_sums = total_sums + np.asarray(row["sums"], dtype=np.float64)
            done += int(row["rows"])
            if progress is not None:
                progress(done, total)
        return total_sums

    if ablation == "zero":
        values = {n: np.zeros(widths[n]) for n in names}
    elif means is not None:
        values = recorded_means(means, names)
    else:
        vector, sums, counts, at = run(None, 0), {}, {}, 0
        for n in names:
            sums[n], counts[n] = vector[at:at + widths[n]], int(vector[at + widths[n]])
            at += widths[n] + 1
        values = _means(sums, counts, names, f"the dataset {data}")
    vector, abs_sums, signed, at = run(values, total - table.rows), {}, {}, 0
    for n in names:
        abs_sums[n], signed[n] = vector[at:at + widths[n]], vector[at + widths[n]:at + 2 * widths[n]]
        at += 2 * widths[n]
    return finish(abs_sums, signed, values, table.rows, out_name, elements, ablation)
