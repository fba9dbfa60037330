"""Per-neuron and per-layer statistics of a recording, in one pass over it.

For every tensor and every neuron (an element of a row; for a ``(batch, width)`` activation, a
position on the last axis): mean and standard deviation (population, ``ddof=0``) of the finite
values, min, max, NaN and ±inf counts, the fraction of finite values that are active (``> 0``, what
"on" means for a ReLU-like unit) and the fraction saturated (``|x| > 0.99`` after a Tanh, ``x < 0.01``
or ``x > 0.99`` after a Sigmoid; the op type of the producing node tells which). From those:

* **dead** neurons: after a ReLU-like op (Relu, LeakyRelu, Elu, Gelu ...), never active; elsewhere,
  constant over every observation (min == max), so they carry no information — except a Tanh or
  Sigmoid unit stuck in saturation, which is listed as always-saturated instead;
* **always-saturated** neurons (Tanh/Sigmoid): saturated on every observation.

The figures of a layer pool all its neurons. Blocks are read and reduced one at a time
(:class:`~policyport.analysis.moments.Moments`), so a recording of any size takes one block of memory;
with the ``ray`` engine each Ray worker reduces its blocks and the driver merges the moments.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import InputMismatchError, require
from ..io.limits import check_array_bytes, limits
from ..runtime.base import nonfinite_rows  # noqa: F401  (re-exported: analysis counts them too)
from .moments import BLOCK_BYTES, MERGE_BYTES, SATURATION, STATE_BYTES, Moments
from .recording import Recording, TensorInfo, open_recording

FORMAT = "policyport.stats/1"
#: Ops whose unit is "on" when its output is > 0: dead = never on.
RELU_LIKE = frozenset({"Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Celu", "ThresholdedRelu", "Gelu", "HardSwish",
                       "Softplus", "Mish"})
DEFAULT_BLOCK = 16384


@dataclass
class TensorStats:
    """The statistics of one recorded tensor (see the module docstring)."""

    name: str
    op_type: str | None
    shape: tuple[int, ...]
    moments: Moments

    @property
    def neurons(self) -> int:
        return len(self.moments.count)

    @property
    def dead(self) -> list[int]:
        """Neuron numbers (C order over the row) that are dead."""
        m = self.moments
        if self.op_type in RELU_LIKE:
            flags = (m.count > 0) & (m.active == 0)
        else:
            flags = (m.count > 1) & (m.minimum == m.maximum)
            if m.saturation is not None:
                flags &= m.saturated != m.count
        return np.flatnonzero(flags).tolist()

    @property
    def always_saturated(self) -> list[int]:
        """Neuron numbers saturated on every observation (Tanh and Sigmoid outputs only)."""
        m = self.moments
        if m.saturation is None:
            return []
        return np.flatnonzero((m.count > 0) & (m.saturated == m.count)).tolist()

    def layer(self) -> dict:
        """The layer's figures: every neuron pooled."""
        p = self.moments.pooled()
        n = int(p.count[0])
        return {
            "values": n, "mean": _num(p.mean[0]) if n else None, "std": _num(p.std[0]), "min": _num(p.minimum[0]),
            "max": _num(p.maximum[0]), "nan": int(p.nan[0]), "inf": int(p.inf[0]),
            "active_fraction": p.active[0] / n if n else None,
            "saturated_fraction": (p.saturated[0] / n if n else None) if p.saturation else None,
            "dead": len(self.dead), "always_saturated": len(self.always_saturated) if p.saturation else None,
        }

    def to_dict(self, neurons: bool = True) -> dict:
        """JSON-ready: name, op type, row shape, saturation rule, the layer's figures, the dead and
        always-saturated neuron numbers and (``neurons``) every per-neuron array."""
        m = self.moments
        doc = {"name": self.name, "op_type": self.op_type, "shape": list(self.shape), "neurons": self.neurons,
               "saturation": SATURATION.get(m.saturation), "layer": self.layer(), "dead": self.dead,
               "always_saturated": self.always_saturated if m.saturation else None}
        if neurons:
            with np.errstate(invalid="ignore", divide="ignore"):
                count = np.maximum(m.count, 1)
                doc["per_neuron"] = {
                    "count": m.count.tolist(), "mean": _nums(np.where(m.count > 0, m.mean, np.nan)), "std": _nums(m.std),
                    "min": _nums(m.minimum), "max": _nums(m.maximum), "nan": m.nan.tolist(), "inf": m.inf.tolist(),
                    "active_fraction": _nums(np.where(m.count > 0, m.active / count, np.nan)),
                    "saturated_fraction": _nums(np.where(m.count > 0, m.saturated / count, np.nan)) if m.saturation else None,
                }
        return doc


def _num(v) -> float | None:
    v = float(v)
    return v if math.isfinite(v) else None


def _nums(a: np.ndarray) -> list[float | None]:
    return [v if math.isfinite(v) else None for v in np.asarray(a, np.float64).tolist()]


@dataclass
class Statistics:
    """Statistics of every tensor of a recording; ``left_out``: the recording's arrays without a
    row per observation (name -> shape), which have none."""

    source: str
    rows: int
    tensors: list[TensorStats]
    left_out: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def __getitem__(self, name: str) -> TensorStats:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    def to_dict(self, neurons: bool = True) -> dict:
        """JSON-ready (no NaN: a figure that does not exist, such as the mean of a neuron that was
        NaN on every row, is ``null``)."""
        return {"format": FORMAT, "recording": self.source, "rows": self.rows,
                "tensors": [t.to_dict(neurons) for t in self.tensors],
                "left_out": [{"name": n, "shape": list(shape)} for n, shape in self.left_out.items()]}


def statistics(recording, tensors: str | list[str] | None = None, *, batch_size: int = DEFAULT_BLOCK,
               engine: str = "local", progress: Callable[[int, int], None] | None = None) -> Statistics:
    """Per-neuron and per-layer statistics of a recording, in one pass.

    Args:
        recording: a path (``.npz``, ``.parquet``, a folder of ``.parquet``) or a :class:`Recording`.
        tensors: ``fnmatch`` globs over the recorded tensor names (default: all).
        batch_size: rows read per block (default 16384): the memory the pass takes; fewer where the
            block would take the statistics' memory above the array limit (:func:`block_rows`).
        engine: ``"local"`` (default) or ``"ray"`` (parquet recordings; each worker reduces its
            blocks, the driver merges the moments).
        progress: called as ``progress(rows_done, rows_total)`` after each block (local engine).

    Returns:
        :class:`Statistics`, tensors in the recording's order; the arrays ``tensors`` selects that
        have no row per observation (see :class:`Recording`) are named in its ``left_out``.

    Raises:
        UnreadableFileError: the recording cannot be read.
        InputMismatchError: a pattern matches no tensor (or only arrays left out), or an unknown engine.
        LimitExceededError: the per-neuron statistics its header sizes would take more than the
            array limit (:func:`block_rows`).
    """
    rec = recording if isinstance(recording, Recording) else open_recording(recording)
    names = rec.select(tensors)
    chosen = [t for t in rec.tensors if t.name in names]
    if engine not in ("local", "ray"):
        raise InputMismatchError(f"unknown engine {engine!r}; choose local or ray")
    batch_size = block_rows(rec, chosen, batch_size)
    if engine == "ray":
        moments = _moments_ray(rec, chosen, batch_size)
    else:
        moments = {t.name: Moments.empty(int(np.prod(t.shape, dtype=np.int64)), t.op_type) for t in chosen}
        done = 0
        for block in rec.iter_batches(batch_size, names):
            for name, values in block.items():
                moments[name].update(values)
            done += len(next(iter(block.values()))) if block else 0
            if progress is not None:
                progress(done, rec.rows)
    return Statistics(str(rec.path), rec.rows, [TensorStats(t.name, t.op_type, t.shape, moments[t.name]) for t in chosen],
                      rec.left_out_among(tensors))


def block_rows(rec: Recording, tensors: list[TensorInfo], batch_size: int) -> int:
    """The rows per block of a pass computing the statistics of ``tensors``: ``batch_size``, or fewer
    where the pass would otherwise hold more than the array limit (:attr:`policyport.io.limits.Limits.array_bytes`):
    the running statistics of every neuron, the merge of one tensor's block, and the blocks' values
    (:data:`~policyport.analysis.moments.STATE_BYTES` and the figures beside it), every size taken
    from the recording's header before anything of it is allocated.

    Raises:
        LimitExceededError: the statistics and a block of one row alone would take more than the
            limit (a header declaring rows of billions of values).
    """
    if not tensors:
        return batch_size
    neurons = [int(np.prod(t.shape, dtype=np.int64)) for t in tensors]
    fixed = STATE_BYTES * sum(neurons) + MERGE_BYTES * max(neurons)
    per_row = sum(t.row_bytes for t in tensors) + BLOCK_BYTES * max(neurons)
    limit = limits().array_bytes
    counted = f"{len(tensors):,} tensor{'' if len(tensors) == 1 else 's'}"
    check_array_bytes(fixed + per_row, f"{rec.path}: the per-neuron statistics of {counted} ({sum(neurons):,} "
                      "neurons, as its header says) and a block of one row",
                      purpose="the statistics of a recording")
    return max(1, min(batch_size, (limit - fixed) // per_row))


def _moments_ray(rec: Recording, tensors: list[TensorInfo], batch_size: int) -> dict[str, Moments]:
    """Each Ray worker turns its blocks into moments; the driver merges them (same update as locally)."""
    ray = require("ray", "ray", "statistics with --engine ray")
    from .tables import FolderTable, ParquetTable

    parts = rec.table.parts if isinstance(rec.table, FolderTable) else [rec.table]
    if not all(isinstance(p, ParquetTable) for p in parts):
        raise InputMismatchError("the ray engine reads .parquet recordings; this one is not")
    from .engines import start_ray

    ray_data = start_ray(ray)
    ds = ray_data.read_parquet([str(p.path) for p in parts]).select_columns([t.name for t in tensors])
    reduced = ds.map_batches(BlockMoments, fn_constructor_kwargs={"tensors": tensors}, batch_size=batch_size,
                             batch_format="pyarrow", compute=ray_data.ActorPoolStrategy(min_size=1))
    total = {t.name: Moments.empty(int(np.prod(t.shape, dtype=np.int64)), t.op_type) for t in tensors}
    for row in reduced.iter_rows():
        for i, t in enumerate(tensors):
            total[t.name].merge(Moments.from_state({k.split("/", 1)[1]: v for k, v in row.items() if k.startswith(f"{i}/")}))
    return total


class BlockMoments:
    """Ray Data map: a block of a parquet recording -> one row holding each tensor's moments."""

    def __init__(self, tensors: list[TensorInfo]):
        self.tensors = tensors

    def __call__(self, table) -> dict[str, np.ndarray]:
        from .tables import Column, _to_numpy

        row = {}
        for i, t in enumerate(self.tensors):
            values = _to_numpy(table.column(t.name).combine_chunks(), Column(t.name, np.dtype(t.dtype), t.shape), t.name)
            for key, value in Moments.of_block(values, t.op_type).to_state().items():
                row[f"{i}/{key}"] = np.asarray(value)[None]
        return row


def write_json(path: str | os.PathLike, stats: Statistics, force: bool = False) -> None:
    """Write ``stats.to_dict()`` as JSON, atomically."""
    import json

    from ..io.outputs import write_atomic

    text = json.dumps(stats.to_dict(), indent=1)

    def write(file) -> None:  # the temporary file, open for binary writing
        file.write(text.encode("utf-8"))

    write_atomic(path, write, force)
