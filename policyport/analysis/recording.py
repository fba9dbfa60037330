"""Recordings on disk: one array (``.npz``) or column (``.parquet``) per tensor, one row per observation.

A recording carries a JSON description under the key ``policyport.recording`` (a 0-d string member of
the ``.npz``; the schema metadata of each ``.parquet`` file): the format tag, the row count, each
tensor's name, producing op type, dtype and per-row shape, and how it was made (model, data,
backend, overrides). The writers stream: each block of rows goes to disk as it comes, so memory is
bounded by the block.

* ``npz``: one uncompressed member per tensor (``numpy.lib.format`` header with the final shape,
  then the rows), each given its place in the file up front and filled block by block in place
  (:class:`NpzWriter`); ``numpy.load(path)[name]`` reads a tensor back;
* ``parquet``: pyarrow's ``ParquetWriter``, one row group per block, one column per tensor: a
  ``fixed_size_list`` of the row's elements (C order), the row shape in the metadata; a tensor with
  scalar rows is a plain column;
* ``npy``: a folder of ``.npy`` files, one per tensor (``numpy.lib.format`` header with the final
  shape, then the rows, written in place block by block as for ``npz``, without a checksum to
  compute), and the description as ``policyport.recording.json``, which also maps each tensor to
  its file (:class:`NpyFolderWriter`). ``numpy.load(file, mmap_mode="r")`` maps a tensor without
  reading it.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from ..errors import BadModelError, InputMismatchError, UnreadableFileError, listing, require
from .tables import META_FILE, META_KEY, Table, described_tensors, open_table

FORMAT = "policyport.recording/1"
#: Output formats of :func:`policyport.analysis.record_dataset`.
FORMATS = ("npz", "parquet", "npy")


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

    An ``.npz`` of ``policyport run --record`` holds every tensor the model computes: the arrays its
    description does not list (constants and shapes, such as an SB3 policy's ``vec_normalize/std``
    and ``action_net/mean_shape``) are :attr:`left_out`. Also reads an ``.npz`` or ``.parquet``
    without the description: every array with one row per observation is a tensor of unknown op
    type, and the others are :attr:`left_out` (see :func:`~policyport.analysis.tables.recording_rows`).

    Args:
        path: an ``.npz`` or ``.parquet`` file, an ``npy`` recording's folder, or a folder of ``.parquet`` files.

    Attributes:
        tensors: the recorded tensors with one row per observation, in the file's order.
        left_out: the file's other arrays, name -> shape.

    Raises:
        UnreadableFileError: not a readable table, or an ``.npz`` of which it cannot be told which
            arrays have one row per observation (the message lists the arrays by row count).
    """

    def __init__(self, path: str | os.PathLike):
        self.table: Table = open_table(path, per_observation=True)
        self.path = Path(path)
        self.left_out: dict[str, tuple[int, ...]] = dict(self.table.left_out)
        self.metadata = dict(self.table.metadata or {})
        described = described_tensors(self.metadata, self.path)
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

    def select(self, tensors: str | list[str] | None = None) -> list[str]:
        """The recorded tensors that ``fnmatch`` globs select (default all), in the recording's order.

        Raises:
            InputMismatchError: a pattern matches no tensor; one that matches only arrays left out
                (:attr:`left_out`) is said to, with their shapes.
        """
        from ..runtime.base import select_tensors

        names = [t.name for t in self.tensors]
        try:
            return select_tensors(names, tensors, where="the recording")
        except InputMismatchError as e:
            unmatched = [p for p in _patterns(tensors) if not _matching([p], names)]
            if not all(_matching([p], self.left_out) for p in unmatched):
                raise
            hit = self.left_out_among(unmatched)
            raise InputMismatchError(
                f"{self.path}: {listing(hit, show=lambda n: f'{n!r} (shape {hit[n]})')} "
                f"{'has' if len(hit) == 1 else 'have'} no row for each of the {self.rows:,} observations (a constant "
                f"or a shape the model computes), so no per-neuron figures; the recording's tensors: "
                f"{listing(names, show=str)}") from e

    def left_out_among(self, tensors: str | list[str] | None = None) -> dict[str, tuple[int, ...]]:
        """The arrays :attr:`left_out` that ``fnmatch`` globs select (default all): name -> shape."""
        chosen = set(self.left_out) if tensors is None else set(_matching(_patterns(tensors), self.left_out))
        return {n: s for n, s in self.left_out.items() if n in chosen}

    def iter_batches(self, batch_size: int = 65536, names: list[str] | None = None) -> Iterator[dict[str, np.ndarray]]:
        """Blocks of at most ``batch_size`` rows: tensor name -> array ``(rows_in_block, *shape)``."""
        names = [t.name for t in self.tensors] if names is None else names
        unknown = [n for n in names if n not in self._column]
        if unknown:
            raise UnreadableFileError(f"{self.path} holds no tensor [{listing(unknown)}]; it has {listing(self._column, show=str)}")
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


def _patterns(tensors: str | list[str] | None) -> list[str]:
    """Names or globs, from a comma-separated string or a list (``None``: every name)."""
    if tensors is None:
        return ["*"]
    return [p.strip() for p in tensors.split(",") if p.strip()] if isinstance(tensors, str) else list(tensors)


def _matching(patterns: list[str], names) -> list[str]:
    """The ``names`` that one of ``patterns`` selects: the exact name, or an ``fnmatch`` glob."""
    return [n for n in names if any(n == p or fnmatch.fnmatchcase(n, p) for p in patterns)]


def open_recording(path: str | os.PathLike) -> Recording:
    """A :class:`Recording` (see there)."""
    return Recording(path)


def describe(rows: int, tensors: list[TensorInfo], **made) -> dict:
    """The JSON description a recording carries (see the module docstring)."""
    return {"format": FORMAT, "rows": rows, "tensors": [{**asdict(t), "shape": list(t.shape)} for t in tensors], **made}


def producers(session) -> dict[str, str]:
    """Tensor name -> op type of the node that produces it."""
    return {o: n.op_type for n in session.backend.graph.nodes for o in n.outputs if o}


def tensor_infos(session, rows: dict[str, tuple[np.dtype, tuple[int, ...]]]) -> list[TensorInfo]:
    """The tensors with rows that :meth:`Session.per_observation
    <policyport.runtime.Session.per_observation>` found, as :class:`TensorInfo` with their op types."""
    ops = producers(session)
    return [TensorInfo(name, ops.get(name), np.dtype(dtype).name, tuple(shape)) for name, (dtype, shape) in rows.items()]


def described_run(session, feeds: dict[str, np.ndarray], values: dict[str, np.ndarray], tensors="*", steering=None,
                  **made) -> dict[str, np.ndarray]:
    """What ``policyport run --record`` writes: ``values`` (a :meth:`Session.record
    <policyport.runtime.Session.record>` of ``tensors`` on ``feeds``, with the overrides ``steering``), every
    tensor, and the recording's description under :data:`~.tables.META_KEY`, which says which of
    them have one row per observation, found as ``record`` finds them
    (:meth:`Session.per_observation <policyport.runtime.Session.per_observation>`); readers leave
    the others out (a constant, a shape) even where their length happens to be the row count.

    Written without a description (readers then tell the rows by the length most arrays share,
    :func:`~.tables.recording_rows`): a model without an input with a batch axis (each run is one
    observation), one that does not run on two and three copies of the first observation, and one
    with a tensor named like the description's key.

    Args:
        session: the model, loaded.
        feeds: input name -> array, what it ran on.
        values: tensor name -> array, as the record returned them.
        tensors: the record's ``tensors`` (globs).
        steering: the record's ``overrides``.
        made: how it was made (``model``, ``data``, ``backend``, ``overrides``), into the description.

    Returns:
        ``values``, followed by the description (a 0-d string array) under :data:`~.tables.META_KEY`
        when there is one.
    """
    from ..errors import PolicyportError
    from ..runtime.base import count_observations

    if META_KEY in values:
        return values
    try:
        found = session.per_observation(feeds, tensors, overrides=steering)
    except PolicyportError:  # it ran on the feeds only: the readers' own rule tells the rows
        return values
    if found is None:
        return values
    rows, _ = found
    infos = tensor_infos(session, {name: rows[name] for name in values if name in rows})
    description = describe(count_observations(session.inputs, feeds), infos, **made)
    return {**values, META_KEY: np.array(json.dumps(description))}


def npy_header(dtype: str, shape: tuple[int, ...]) -> bytes:
    """The ``.npy`` header (format 1.0, or 2.0 when 1.0 cannot hold it) of a C-order array."""
    import io

    fields = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": shape}
    header = io.BytesIO()
    try:
        np.lib.format.write_array_header_1_0(header, fields)
    except ValueError:  # a header longer than format 1.0 allows
        header = io.BytesIO()
        np.lib.format.write_array_header_2_0(header, fields)
    return header.getvalue()


def write_at(fd: int, offset: int, data) -> None:
    """Write all of ``data`` (bytes or a C-contiguous array) at ``offset`` of the open file ``fd``."""
    view = memoryview(data).cast("B")
    if not hasattr(os, "pwrite"):  # Windows: no positioned writes
        os.lseek(fd, offset, os.SEEK_SET)
        while len(view):
            view = view[os.write(fd, view):]
        return
    while len(view):
        done = os.pwrite(fd, view, offset)
        view, offset = view[done:], offset + done


class _InPlaceWriter:
    """What the ``npz`` and ``npy`` writers share: each tensor's rows go to the next offset of its
    own place (:meth:`_put`), and the row count is checked at the end."""

    rows: int
    tensors: list[TensorInfo]
    _written: int
    _next: list[int]  # where each tensor's next rows go

    def _put(self, i: int, rows: np.ndarray) -> None:
        raise NotImplementedError

    def append(self, block: dict[str, np.ndarray]) -> None:
        """Write the next rows of every tensor in its place."""
        for i, t in enumerate(self.tensors):
            rows = np.ascontiguousarray(block[t.name])
            if rows.size:
                self._put(i, rows)
                self._next[i] += rows.nbytes
        self._written += len(block[self.tensors[0].name]) if self.tensors else 0

    def _check_rows(self) -> None:
        if self.tensors and self._written != self.rows:
            raise BadModelError(f"the recording got {self._written} rows, not the {self.rows} announced")


class NpzWriter(_InPlaceWriter):
    """Streams blocks into an ``.npz`` (which the caller replaces atomically), written in place.

    Every member's size is known from the start (its ``.npy`` header with the final shape, then
    ``rows`` rows), so each tensor gets its place in the file up front and each block's rows are
    written straight there (``os.pwrite``), tensor after tensor, with a running CRC-32 per member:
    no part files, and no second copy into the archive. At the end the local headers (with the
    CRCs), the description member and the central directory (``zipfile``'s own writer, zip64) are
    added. The result is an ordinary uncompressed ``.npz`` (``numpy.load`` checks the CRCs).

    Args:
        target: a binary file open for writing and seeking, positioned at its start, or a path.
        rows: the total row count.
        tensors: what each block holds.
        metadata: the recording's description.
        scratch: unused (the parquet writer's signature).
    """

    def __init__(self, target, rows: int, tensors: list[TensorInfo], metadata: dict,
                 scratch: str | os.PathLike | None = None):
        import time
        import zlib

        self.rows, self.tensors, self.metadata = rows, tensors, metadata
        self._crc32 = zlib.crc32
        self._own = isinstance(target, (str, os.PathLike))
        self._file = open(target, "w+b") if self._own else target
        self._written = 0
        self._infos: list[zipfile.ZipInfo] = []
        self._next: list[int] = []  # where each member's next rows go
        self._crcs: list[int] = []
        offset = self._file.tell()
        when = time.localtime()[:6]
        for t in tensors:
            header = npy_header(t.dtype, (rows, *t.shape))
            info = zipfile.ZipInfo(f"{t.name}.npy", date_time=when)
            info.compress_type = zipfile.ZIP_STORED
            info.file_size = info.compress_size = len(header) + rows * t.row_bytes
            info.CRC = 0  # known once the rows are written
            info.header_offset = offset
            data = offset + len(info.FileHeader(zip64=True))
            self._write_at(data, header)
            self._infos.append(info)
            self._crcs.append(self._crc32(header))
            self._next.append(data + len(header))
            offset = data + info.file_size
        self._end = offset

    def _write_at(self, offset: int, data) -> None:
        self._file.flush()  # nothing buffered may land after (or over) what is written beside it
        write_at(self._file.fileno(), offset, data)

    def _put(self, i: int, rows: np.ndarray) -> None:
        self._write_at(self._next[i], rows)
        self._crcs[i] = self._crc32(rows, self._crcs[i])

    def close(self) -> None:
        """Add the local headers, the description and the central directory."""
        try:
            self._check_rows()
            for info, crc in zip(self._infos, self._crcs):
                info.CRC = crc
                self._write_at(info.header_offset, info.FileHeader(zip64=True))
            self._file.seek(self._end)
            with zipfile.ZipFile(self._file, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
                for info in self._infos:  # the members written above, listed in the central directory
                    zf.filelist.append(info)
                    zf.NameToInfo[info.filename] = info
                with zf.open(f"{META_KEY}.npy", "w") as dst:
                    np.lib.format.write_array(dst, np.array(json.dumps(self.metadata)), allow_pickle=False)
        finally:
            if self._own:
                self._file.close()

    def abort(self) -> None:
        """Nothing to remove but the output itself, which belongs to the caller."""
        if self._own:
            self._file.close()


class NpyFolderWriter(_InPlaceWriter):
    """Streams blocks into a folder of ``.npy`` files, one per tensor, written in place (see the
    module docstring); the caller builds the folder under a temporary name and renames it.

    Each file is created with its final header (``rows`` in its shape) and every block's rows are
    written at their place with ``os.pwrite``, as :class:`NpzWriter` does, but with no checksum to
    compute: the cheapest format to write, and the only one whose tensors ``numpy.load`` can map
    without reading them. :data:`~policyport.analysis.tables.META_FILE`, written last, holds the
    description and ``files``, each tensor's file name (:func:`npy_file_name`).

    Args:
        target: the (empty) folder to write in: a :class:`~policyport.io.outputs.FolderBuild` (its files
            are created relative to its descriptor), or a path.
        rows: the total row count.
        tensors: what each block holds.
        metadata: the recording's description.
        scratch: unused (the parquet writer's signature).
    """

    def __init__(self, target, rows: int, tensors: list[TensorInfo], metadata: dict,
                 scratch: str | os.PathLike | None = None):
        self.folder, self.rows, self.tensors = target, rows, tensors
        self.metadata = {**metadata, "files": {t.name: npy_file_name(i, t.name) for i, t in enumerate(tensors)}}
        self._written = 0
        self._fds: list[int] = []
        self._next: list[int] = []
        try:
            for t in tensors:
                self._fds.append(self._create(self.metadata["files"][t.name]))
                fd = self._fds[-1]
                header = npy_header(t.dtype, (rows, *t.shape))
                write_at(fd, 0, header)
                self._next.append(len(header))
        except BaseException:
            self.abort()
            raise

    def _put(self, i: int, rows: np.ndarray) -> None:
        write_at(self._fds[i], self._next[i], rows)

    def close(self) -> None:
        """Check the row count, close the files and write the description."""
        try:
            self._check_rows()
        finally:
            self.abort()
        with os.fdopen(self._create(META_FILE), "w", encoding="utf-8") as f:
            json.dump(self.metadata, f, indent=1)

    def _create(self, name: str) -> int:
        """A new file in the folder, open for writing (never an existing one, never through a link)."""
        if hasattr(self.folder, "create"):
            return self.folder.create(name)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0) \
            | getattr(os, "O_CLOEXEC", 0)
        return os.open(Path(self.folder) / name, flags, 0o666)

    def abort(self) -> None:
        """Close the files; the caller removes the folder."""
        while self._fds:
            os.close(self._fds.pop())


def npy_file_name(index: int, tensor: str) -> str:
    """The file of the ``index``-th tensor of an ``npy`` recording: ``0003-fc_2.tanh.npy`` for
    ``fc_2/tanh``: the index keeps names unique and in order; the tensor name follows with every
    character but letters, digits, ``.``, ``_`` and ``-`` replaced by ``.``, cut to 60 characters."""
    return f"{index:04d}-{re.sub(r'[^A-Za-z0-9_.-]', '.', tensor)[:60]}.npy"


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


WRITERS = {"npz": NpzWriter, "parquet": ParquetWriter, "npy": NpyFolderWriter}
