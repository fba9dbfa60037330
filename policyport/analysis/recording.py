"""Recordings on disk: one array (``.npz``) or column (``.parquet``) per tensor, one row per observation.

A recording carries a JSON description under the key ``policyport.recording`` (a 0-d string member of
the ``.npz``; the schema metadata of each ``.parquet`` file): the format tag, the row count, each
tensor's name, producing op type, dtype and per-row shape, and how it was made (model, data,
backend, overrides). The writers stream: each block of rows goes to disk as it comes, so memory is
bounded by the block.

* ``npz``: each tensor is first written to its own ``.npy`` file (``numpy.lib.format`` header with the
  final shape, then the rows appended block by block), in a hidden folder beside the output; at the
  end the ``.npy`` files are stored (uncompressed) into the ``.npz`` and the folder removed.
  ``numpy.load(path)[name]`` reads a tensor back;
* ``parquet``: pyarrow's ``ParquetWriter``, one row group per block, one column per tensor: a
  ``fixed_size_list`` of the row's elements (C order), the row shape in the metadata; a tensor with
  scalar rows is a plain column.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from ..errors import BadModelError, UnreadableFileError, require
from .tables import META_KEY, Table, open_table

FORMAT = "policyport.recording/1"
#: Output formats of :func:`policyport.analysis.record_dataset`.
FORMATS = ("npz", "parquet")
_COPY_BLOCK = 1 << 20  # bytes per read when storing the .npy parts into the .npz


@dataclass(frozen=True)
class TensorInfo:
    """A recorded tensor: ``name``, the ``op_type`` of the node that made it (None if unknown),
    ``dtype`` name and the ``shape`` of one row (``(256,)`` for a ``(batch, 256)`` activation)."""

    name: str
    op_type: str | None
    dtype: str
    shape: tuple[int, ...]

    @property
    def row_bytes(self) -> int:
        return np.dtype(self.dtype).itemsize * int(np.prod(self.shape, dtype=np.int64))


class Recording:
    """A recording read back: its tensors and rows, streamed block by block.

    Also reads an ``.npz`` or ``.parquet`` without the description (``policyport run --record``
    writes one): every array with rows is a tensor of unknown op type.

    Args:
        path: an ``.npz`` or ``.parquet`` file, or a folder of ``.parquet`` files.

    Raises:
        UnreadableFileError: not a readable table, or arrays with different row counts.
    """

    def __init__(self, path: str | os.PathLike):
        self.table: Table = open_table(path)
        self.path = Path(path)
        self.metadata = dict(self.table.metadata or {})
        described = {t["name"]: t for t in self.metadata.get("tensors", [])}
        self.tensors: list[TensorInfo] = []
        for col in self.table.columns.values():
            if col.shape is None:
                raise UnreadableFileError(f"{self.path}: column {col.name!r} has no fixed row shape")
            spec = described.get(col.name, {})
            self.tensors.append(TensorInfo(col.name or "array", spec.get("op_type"), col.dtype.name, tuple(col.shape)))
        self._column = {t.name: c for t, c in zip(self.tensors, self.table.columns)}

    @property
    def rows(self) -> int:
        return self.table.rows

    def iter_batches(self, batch_size: int = 65536, names: list[str] | None = None) -> Iterator[dict[str, np.ndarray]]:
        """Blocks of at most ``batch_size`` rows: tensor name -> array ``(rows_in_block, *shape)``."""
        names = [t.name for t in self.tensors] if names is None else names
        unknown = [n for n in names if n not in self._column]
        if unknown:
            raise UnreadableFileError(f"{self.path} holds no tensor {unknown}; it has {', '.join(self._column)}")
        for block in self.table.iter_batches(batch_size, [self._column[n] for n in names]):
            yield {n: block[self._column[n]] for n in names}

    def head(self, rows: int, names: list[str] | None = None) -> dict[str, np.ndarray]:
        """The first ``rows`` rows (fewer if the recording is shorter) of each tensor."""
        parts: dict[str, list[np.ndarray]] = {}
        got = 0
        for block in self.iter_batches(min(rows, 65536) or 1, names):
            take = min(rows - got, len(next(iter(block.values()))))
            for n, a in block.items():
                parts.setdefault(n, []).append(a[:take])
            got += take
            if got >= rows:
                break
        return {n: np.concatenate(p) for n, p in parts.items()}


def open_recording(path: str | os.PathLike) -> Recording:
    """A :class:`Recording` (see there)."""
    return Recording(path)


def describe(rows: int, tensors: list[TensorInfo], **made) -> dict:
    """The JSON description a recording carries (see the module docstring)."""
    return {"format": FORMAT, "rows": rows, "tensors": [{**asdict(t), "shape": list(t.shape)} for t in tensors], **made}


class NpzWriter:
    """Streams blocks into an ``.npz`` (which the caller replaces atomically).

    Args:
        target: the file to write: a (temporary) path, or a binary file open for writing.
        rows: the total row count (each ``.npy`` header is written with the final shape).
        tensors: what each block holds.
        metadata: the recording's description.
        scratch: the folder for the per-tensor parts streamed before they are stored in the
            archive (default: ``target``'s folder; required when ``target`` is a file object).
    """

    def __init__(self, target, rows: int, tensors: list[TensorInfo], metadata: dict,
                 scratch: str | os.PathLike | None = None):
        self.target, self.rows, self.tensors, self.metadata = target, rows, tensors, metadata
        folder = Path(scratch) if scratch is not None else Path(target).parent
        self._parts = Path(tempfile.mkdtemp(prefix=".policyport-record.", suffix=".parts", dir=folder))
        self._files = []
        self._written = 0
        try:
            for i, t in enumerate(tensors):
                f = open(self._parts / f"{i}.npy", "wb")
                self._files.append(f)
                header = {"descr": np.lib.format.dtype_to_descr(np.dtype(t.dtype)), "fortran_order": False,
                          "shape": (rows, *t.shape)}
                try:
                    np.lib.format.write_array_header_1_0(f, header)
                except ValueError:  # a header longer than format 1.0 allows
                    np.lib.format.write_array_header_2_0(f, header)
        except BaseException:
            self.abort()
            raise

    def append(self, block: dict[str, np.ndarray]) -> None:
        """Write the next rows of every tensor."""
        for f, t in zip(self._files, self.tensors):
            np.ascontiguousarray(block[t.name]).tofile(f)
        self._written += len(block[self.tensors[0].name]) if self.tensors else 0

    def close(self) -> None:
        """Store every part in the ``.npz`` (uncompressed, zip64) and remove the parts."""
        try:
            if self.tensors and self._written != self.rows:
                raise BadModelError(f"the recording got {self._written} rows, not the {self.rows} announced")
            for f in self._files:
                f.close()
            with zipfile.ZipFile(self.target, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
                for i, t in enumerate(self.tensors):
                    with open(self._parts / f"{i}.npy", "rb") as src, zf.open(f"{t.name}.npy", "w", force_zip64=True) as dst:
                        shutil.copyfileobj(src, dst, _COPY_BLOCK)
                with zf.open(f"{META_KEY}.npy", "w") as dst:
                    np.lib.format.write_array(dst, np.array(json.dumps(self.metadata)), allow_pickle=False)
        finally:
            self.abort()

    def abort(self) -> None:
        """Remove the parts (the output file itself belongs to the caller)."""
        for f in self._files:
            f.close()
        shutil.rmtree(self._parts, ignore_errors=True)


#: How recordings are written to parquet: activations barely compress, and dictionaries and
#: statistics of float columns cost time for nothing.
PARQUET_OPTIONS = {"compression": "none", "use_dictionary": False, "write_statistics": False}


class ParquetWriter:
    """Streams blocks into a ``.parquet`` file at ``path``: one row group per block (see the module docstring)."""

    def __init__(self, target, rows: int, tensors: list[TensorInfo], metadata: dict,
                 scratch: str | os.PathLike | None = None):
        self._pa = require("pyarrow", "analysis", "writing .parquet recordings")
        pq = require("pyarrow.parquet", "analysis", "writing .parquet recordings")
        self.tensors = tensors
        self.schema = arrow_schema(tensors, metadata)
        where = str(target) if isinstance(target, (str, os.PathLike)) else target  # a path or a binary file
        self._writer = pq.ParquetWriter(where, self.schema, **PARQUET_OPTIONS)

    def append(self, block: dict[str, np.ndarray]) -> None:
        self._writer.write_table(arrow_table(block, self.tensors, self.schema))

    def close(self) -> None:
        self._writer.close()

    def abort(self) -> None:
        self._writer.close()


def arrow_schema(tensors: list[TensorInfo], metadata: dict | None):
    """The pyarrow schema of a recording: a fixed-size list column per tensor (plain for scalar rows)."""
    pa = require("pyarrow", "analysis", "writing .parquet recordings")
    fields = []
    for t in tensors:
        value = pa.from_numpy_dtype(np.dtype(t.dtype))
        width = int(np.prod(t.shape, dtype=np.int64))
        fields.append(pa.field(t.name, pa.list_(value, width) if t.shape else value, nullable=False))
    return pa.schema(fields, metadata=None if metadata is None else {META_KEY: json.dumps(metadata)})


def arrow_table(block: dict[str, np.ndarray], tensors: list[TensorInfo], schema):
    """One block as a pyarrow table of ``schema`` (the arrays' memory is shared, not copied)."""
    pa = require("pyarrow", "analysis", "writing .parquet recordings")
    columns = []
    for t in tensors:
        a = np.ascontiguousarray(block[t.name])  # from_buffers shares its memory (pa.array would copy)
        flat = pa.Array.from_buffers(pa.from_numpy_dtype(a.dtype), a.size, [None, pa.py_buffer(a)])
        columns.append(pa.FixedSizeListArray.from_arrays(flat, int(np.prod(t.shape, dtype=np.int64))) if t.shape else flat)
    return pa.Table.from_arrays(columns, schema=schema)


WRITERS = {"npz": NpzWriter, "parquet": ParquetWriter}
