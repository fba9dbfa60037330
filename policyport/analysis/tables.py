"""Reading arrays row block by row block from files of any size: ``.npy``, ``.npz``, ``.parquet``,
and folders of them.

A file is a *table*: named columns of equal row count, each row of a column an array of one dtype and
shape. Rows are read in blocks with plain file reads (never a memory map, whose touched pages would
count against the process), so memory is bounded by the block, not the file. Observation datasets
(``policyport record -i``) and recordings are both read through here.

* ``.npy``: one column named ``""``; read with the header's offset and ``readinto`` (C order only);
* ``.npz``: one column per member (``numpy.lib.format`` header, then the member's rows streamed from
  the zip, stored or deflated); read as a recording (``per_observation``), members without the
  recording's rows (a constant, a shape, a scalar) are left out rather than refused;
* ``.parquet``: one column per field (pyarrow ``ParquetFile.iter_batches``); a fixed-size list column
  is a ``(rows, width)`` array, reshaped to the row shape that the file's ``policyport.recording``
  metadata gives, if any;
* a folder: its ``.npy``/``.npz``/``.parquet`` files in name order, concatenated; they must agree on
  the columns;
* a folder with a :data:`META_FILE` (an ``npy`` recording): one column per ``.npy`` file, as that
  description maps tensors to files.
"""

from __future__ import annotations

import os
import re
import reprlib
import zipfile
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Iterator, Mapping

import numpy as np

from ..errors import ZIP_ERRORS, PolicyportError, UnreadableFileError, listing, require
from ..io.outputs import WEIGHTS_COMMENT
from ..io.limits import check_array_bytes
from ..io.arrays import check_npz_arrays
from ..io.kinds import not_a_file
from ..io.schema import load_json

#: Key of the JSON document a recording carries (a 0-d string member of an .npz, parquet schema metadata).
META_KEY = "policyport.recording"
#: The description file of an ``npy`` recording (a folder of one ``.npy`` per tensor).
META_FILE = META_KEY + ".json"
#: The largest description file read (a recording of 100,000 tensors' descriptions is some 20 MB).
META_FILE_BYTES = 64 << 20
SUFFIXES = (".npy", ".npz", ".parquet")


@dataclass(frozen=True)
class Column:
    """One column: every row is an array of ``dtype`` and ``shape``."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]


class Table:
    """Rows of named columns in one file; subclasses read one format."""

    path: Path
    rows: int
    columns: dict[str, Column]
    metadata: dict | None = None
    #: Arrays of the file that are not columns because they have no row per observation: name -> shape.
    left_out: Mapping[str, tuple[int, ...]] = MappingProxyType({})

    def iter_batches(self, batch_size: int, names: list[str] | None = None) -> Iterator[dict[str, np.ndarray]]:
        """Blocks of ``batch_size`` rows (the last may be shorter): column name -> array
        ``(rows_in_block, *shape)``, C-contiguous and owned by the caller."""
        raise NotImplementedError

    def read_rows(self, start: int, stop: int, names: list[str] | None = None) -> dict[str, np.ndarray]:
        """Rows ``start`` to ``stop`` (excluded) of each column, read without the rows before them.

        Raises:
            UnreadableFileError: the format cannot seek to a row (``.npz`` members are streams).
        """
        raise UnreadableFileError(f"{self.path}: rows cannot be read from the middle of this kind of file")


def _read_exactly(f, buf: np.ndarray, path: Path) -> None:
    view = memoryview(buf).cast("B")
    done = 0
    while done < len(view):
        n = f.readinto(view[done:])
        if not n:
            raise UnreadableFileError(f"{path} ends early: expected {len(view)} more bytes of rows")
        done += n


def _npy_header(f, where: str, scalar: bool = False) -> tuple[np.dtype, tuple[int, ...]]:
    """dtype and shape from an open ``.npy`` stream positioned at its start (format 1.0/2.0)."""
    fmt = np.lib.format
    try:
        version = fmt.read_magic(f)
        reader = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}.get(version)
        if reader is None:
            raise ValueError(f"npy format version {version} is not read here (save it again with numpy.save)")
        shape, fortran, dtype = reader(f)
    except ValueError as e:
        raise UnreadableFileError(f"{where} is not a readable .npy array: {e}") from e
    if dtype.hasobject:
        raise UnreadableFileError(f"{where} holds an object array, which numpy can only read by unpickling "
                                  "(running code from the file); policyport refuses that — save plain numeric arrays")
    if fortran and len(shape) > 1:
        raise UnreadableFileError(f"{where} is stored in Fortran order; rows can be streamed from C order only "
                                  "(save numpy.ascontiguousarray(x))")
    if not shape and not scalar:
        raise UnreadableFileError(f"{where} holds a scalar; expected an array with one row per observation")
    return dtype, tuple(shape)


class NpyTable(Table):
    """An ``.npy`` file: one column named ``""``."""

    def __init__(self, path: Path):
        self.path = path
        with open(path, "rb") as f:
            dtype, shape = _npy_header(f, str(path))
            self._offset = f.tell()
        self.rows = shape[0]
        self.columns = {"": Column("", dtype, shape[1:])}
        expected = self._offset + self.rows * dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))
        if path.stat().st_size < expected:
            raise UnreadableFileError(f"{path} is truncated: its header says {shape}, which needs {expected} bytes")

    def read_rows(self, start, stop, names=None):
        col = self.columns[""]
        with open(self.path, "rb") as f:
            f.seek(self._offset + start * col.dtype.itemsize * int(np.prod(col.shape, dtype=np.int64)))
            buf = np.empty((stop - start, *col.shape), col.dtype)
            _read_exactly(f, buf, self.path)
        return {"": buf}

    def iter_batches(self, batch_size, names=None):
        col = self.columns[""]
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            for start in range(0, self.rows, batch_size):
                buf = np.empty((min(batch_size, self.rows - start), *col.shape), col.dtype)
                _read_exactly(f, buf, self.path)
                yield {"": buf}


class NpzTable(Table):
    """An ``.npz`` file: one column per member; a ``policyport.recording`` member is metadata.

    Args:
        path: the file.
        per_observation: read it as a recording (``policyport run --record`` writes every tensor,
            constants and shapes among them): the members its description does not list as tensors
            with rows (``policyport run --record`` and ``record`` say which have them), or, without
            one, whose axis 0 is not the recording's rows (:func:`recording_rows`) are left out
            (:attr:`left_out`) instead of refused.

    Raises:
        UnreadableFileError: not a readable ``.npz``; members of different row counts (a scalar
            among them) when not ``per_observation``, or whose rows cannot be told when it is; read
            as a recording, a model's weights (:func:`check_not_weights`).
    """

    def __init__(self, path: Path, per_observation: bool = False):
        self.path = path
        self.columns, self._members, self.metadata = {}, {}, None
        shapes: dict[str, tuple[int, ...]] = {}
        try:
            with zipfile.ZipFile(path) as zf:
                comment = zf.comment
                members = zf.infolist()
                check_npz_arrays(len(members), str(path))
                for info in members:
                    name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
                    where = f"{path} member {name!r}"
                    with zf.open(info) as f:
                        dtype, shape = _npy_header(f, where, scalar=per_observation or name == META_KEY)
                        declared = f.tell() + dtype.itemsize * int(np.prod(shape, dtype=object))
                    if declared > info.file_size:
                        raise UnreadableFileError(f"{where} is truncated or damaged: its header says {dtype.name} "
                                                  f"{shape}, which needs {declared:,} bytes; it holds {info.file_size:,}")
                    if name == META_KEY:
                        if declared > META_FILE_BYTES:
                            raise UnreadableFileError(f"{where} declares {declared:,} bytes, more than a recording's "
                                                      f"description ({META_FILE_BYTES:,}); it is not one")
                        with zf.open(info) as f:
                            self.metadata = _metadata(np.lib.format.read_array(f, allow_pickle=False), path)
                        continue
                    self._members[name] = info.filename
                    self.columns[name] = Column(name, dtype, shape[1:])
                    shapes[name] = shape
        except ZIP_ERRORS as e:
            if isinstance(e, PolicyportError):
                raise
            raise UnreadableFileError(f"{path} is not a readable .npz file: {e}") from e
        if per_observation:
            if self.metadata is None:
                check_not_weights(path, comment, shapes)
            described = (self.metadata or {}).get("rows")
            self.rows = described if type(described) is int else recording_rows(path, shapes)
            listed = _described_tensors(self.metadata)
            self.left_out = {n: s for n, s in shapes.items()
                             if s[:1] != (self.rows,) or (listed is not None and n not in listed)}
            for name in self.left_out:
                del self.columns[name], self._members[name]
        else:
            by_rows = _by_rows(shapes)
            if len(by_rows) > 1:
                raise UnreadableFileError(f"{path}: the arrays have different numbers of rows ({_rows_text(by_rows)}); "
                                          "each needs one row per observation")
            self.rows = next(iter(by_rows), 0)

    def iter_batches(self, batch_size, names=None):
        names = list(self.columns) if names is None else names
        with zipfile.ZipFile(self.path) as zf:
            streams = {}
            try:
                for n in names:
                    streams[n] = zf.open(self._members[n])
                    _npy_header(streams[n], str(self.path))
                yield from _blocks(streams, self.columns, self.rows, batch_size, self.path)
            finally:
                for s in streams.values():
                    s.close()


#: The last word of a parameter's name in the sources policyport reads (``fc_1/kernel``,
#: ``mlp_extractor.policy_net.0.weight``, ``dense/kernel:0``, ``obs_rms.mean``, ``log_std``).
PARAMETER_WORDS = frozenset({"kernel", "bias", "weight", "weights", "log_std", "running_mean", "running_var",
                             "num_batches_tracked", "moving_mean", "moving_variance", "gamma", "beta", "mean", "var",
                             "count"})


def check_not_weights(path: Path, comment: bytes, shapes: dict[str, tuple[int, ...]]) -> None:
    """Refuse an ``.npz`` without a recording's description that holds a model's parameters, not
    activations: one whose archive comment says so (``policyport extract`` and ``export-numpy``
    write :data:`policyport.io.outputs.WEIGHTS_COMMENT`), or whose every array is named like a parameter
    (:data:`PARAMETER_WORDS`, a source's weights file such as an RLlib ``.npz``), a matrix among
    them. A recording always holds the model's graph outputs (``action``, ``logits``), which are not.

    Args:
        path: the file, for the message.
        comment: the zip archive's comment.
        shapes: member name -> shape.

    Raises:
        UnreadableFileError: such a file, saying it is not a recording and what makes one.
    """
    if comment.startswith(WEIGHTS_COMMENT):
        made = comment[len(WEIGHTS_COMMENT):].decode("utf-8", "replace").lstrip(": ")[:80]
        what = f"a model's weights{f' ({made})' if made else ''}"
    else:
        words = {name: re.split(r"[/.]", re.sub(r":\d+$", "", name))[-1] for name in shapes}
        if not shapes or not all(w in PARAMETER_WORDS for w in words.values()) or not any(
                words[n] in ("kernel", "weight", "weights") and len(s) == 2 for n, s in shapes.items()):
            return
        what = f"a model's weights ({listing(shapes, 3)}, each named as a parameter)"
    raise UnreadableFileError(
        f"{path} holds {what}, not a recording: statistics and plots need each tensor's values on every "
        "observation; record them with policyport record MODEL -i OBS.npy -o REC.npz (or policyport run MODEL "
        "-i OBS.npy -o OUT.npz --record REC.npz)")


def _described_tensors(metadata: dict | None) -> set[str] | None:
    """The names of the tensors with rows a recording's description lists; None without one."""
    tensors = (metadata or {}).get("tensors")
    if not isinstance(tensors, list):
        return None
    return {t["name"] for t in tensors if isinstance(t, dict) and isinstance(t.get("name"), str)}


def _by_rows(shapes: dict[str, tuple[int, ...]]) -> dict[int | None, list[str]]:
    """Array names grouped by row count (axis 0; ``None`` for a scalar), most arrays first."""
    groups: dict[int | None, list[str]] = {}
    for name, shape in shapes.items():
        groups.setdefault(shape[0] if shape else None, []).append(name)
    return dict(sorted(groups.items(), key=lambda item: -len(item[1])))


def _rows_text(by_rows: dict[int | None, list[str]]) -> str:
    """``'a', 'b': 600 rows; 'c': 2 rows; 'd': a scalar`` for a message."""
    return "; ".join(f"{listing(names)}: {'a scalar' if rows is None else f'{rows:,} rows'}"
                     for rows, names in by_rows.items())


def recording_rows(path: Path, shapes: dict[str, tuple[int, ...]]) -> int:
    """The observations of a recording without a description (an ``.npz`` saved elsewhere, or one
    ``policyport run --record`` wrote for a model it could not describe): the row count (axis 0)
    that most of its arrays share. Arrays of another length have no row per observation (a
    constant, a shape); one whose length happens to equal the row count cannot be told from a
    tensor of one value per observation, and is taken for one.

    Args:
        path: the file, for messages.
        shapes: array name -> shape.

    Returns:
        The row count; 0 for a file without arrays.

    Raises:
        UnreadableFileError: only scalars, or two row counts shared by as many arrays each.
    """
    by_rows = {rows: names for rows, names in _by_rows(shapes).items() if rows is not None}
    if not shapes:
        return 0
    if not by_rows:
        raise UnreadableFileError(f"{path} holds only scalars ({listing(shapes)}); a recording holds arrays with "
                                  "one row per observation")
    counts = [len(names) for names in by_rows.values()]
    if len(counts) > 1 and counts[0] == counts[1]:
        raise UnreadableFileError(f"{path}: cannot tell which arrays hold one row per observation, as many arrays "
                                  f"have each row count ({_rows_text(_by_rows(shapes))}); 'policyport record' "
                                  "writes recordings that say so")
    return next(iter(by_rows))


def _blocks(streams: dict, columns: dict[str, Column], rows: int, batch_size: int, path: Path):
    """Blocks of ``batch_size`` rows read from each column's stream, positioned at its first row."""
    for start in range(0, rows, batch_size):
        count = min(batch_size, rows - start)
        block = {}
        for n, stream in streams.items():
            col = columns[n]
            block[n] = np.empty((count, *col.shape), col.dtype)
            _read_exactly(stream, block[n], path)
        yield block


def _metadata(value, path) -> dict:
    """A recording's description: JSON text (or its UTF-8 bytes, or a 0-d array of the text) holding an object.

    Raises:
        UnreadableFileError: not JSON, not an object, or a ``tensors`` entry that is not a list of
            objects each naming its tensor (:func:`described_tensors`).
    """
    text = value if isinstance(value, (str, bytes)) else str(value.item() if isinstance(value, np.ndarray) else value)
    doc = load_json(text, f"{path}: its {META_KEY} metadata", error=UnreadableFileError)
    if not isinstance(doc, dict):
        raise UnreadableFileError(f"{path}: its {META_KEY} metadata is not a JSON object")
    described_tensors(doc, path)
    return doc


def described_tensors(metadata: Mapping | None, path) -> dict[str, dict]:
    """The ``tensors`` of a recording's description (each ``{"name", "op_type", "dtype", "shape"}``), by name.

    Raises:
        UnreadableFileError: ``tensors`` is not a list of objects with a string ``name``, or a
            ``shape`` that is not a list of whole numbers.
    """
    entries = (metadata or {}).get("tensors", [])
    where = f"{path}: its {META_KEY} metadata's tensors"
    if not isinstance(entries, list):
        raise UnreadableFileError(f"{where} is a {type(entries).__name__}, not a list")
    described = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise UnreadableFileError(f"{where}[{i}] is {reprlib.repr(entry)}, not an object with a name")
        shape = entry.get("shape", [])
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise UnreadableFileError(f"{where}[{i}].shape is {reprlib.repr(shape)}, not a list of whole numbers")
        described[entry["name"]] = entry
    return described


class ParquetTable(Table):
    """A ``.parquet`` file: one column per field."""

    def __init__(self, path: Path):
        pq = require("pyarrow.parquet", "analysis", "reading .parquet files")
        self.path = path
        try:
            self._file = pq.ParquetFile(path)
        except Exception as e:  # ArrowInvalid, OSError ...
            raise UnreadableFileError(f"{path} is not a readable .parquet file: {e}") from e
        schema = self._file.schema_arrow
        raw = (schema.metadata or {}).get(META_KEY.encode())
        self.metadata = _metadata(raw, path) if raw else None
        shapes = {name: tuple(t.get("shape", ())) for name, t in described_tensors(self.metadata, path).items()}
        self.rows = self._file.metadata.num_rows
        self.columns = {f.name: _arrow_column(f, shapes.get(f.name), path) for f in schema}
        _check_list_values(self._file.metadata, schema, self.columns, path)

    def iter_batches(self, batch_size, names=None):
        names = list(self.columns) if names is None else names
        for batch in self._file.iter_batches(batch_size=batch_size, columns=names, use_threads=False):
            yield {n: _to_numpy(batch.column(n), self.columns[n], self.path) for n in names}

    def read_rows(self, start, stop, names=None):
        names = list(self.columns) if names is None else names
        meta, groups, first, at = self._file.metadata, [], None, 0
        for g in range(meta.num_row_groups):  # only the row groups that hold the rows
            rows = meta.row_group(g).num_rows
            if at < stop and at + rows > start:
                groups.append(g)
                first = at if first is None else first
            at += rows
        table = self._file.read_row_groups(groups, columns=names, use_threads=False).slice(start - (first or 0), stop - start)
        return {n: _to_numpy(table.column(n).combine_chunks(), self.columns[n], self.path) for n in names}


def _check_list_values(meta, schema, columns: dict[str, Column], path) -> None:
    """Refuse a ``.parquet`` file whose list columns hold more values than can be read, from its
    metadata alone, before any is decoded.

    A row of a list column is decoded whole, however many values it holds, and the file does not
    say how they are spread over the rows: a row group of a single row can hold billions of values
    in a few hundred bytes (dictionary and run-length encoded). So each row group's values of a list
    column are checked against the array limit (:attr:`policyport.io.limits.Limits.array_bytes`), and
    against the width the column declares (``fixed_size_list``, or the recording's row shape).

    Raises:
        LimitExceededError: a row group of a list column holds values above the array limit.
        UnreadableFileError: more values than its rows times the column's width.
    """
    pa = require("pyarrow", "analysis", "reading .parquet files")
    lists = {f.name for f in schema if pa.types.is_list(f.type) or pa.types.is_large_list(f.type)
             or pa.types.is_fixed_size_list(f.type)}
    if not lists:
        return
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        values: dict[str, int] = {}
        for c in range(group.num_columns):
            chunk = group.column(c)
            name = chunk.path_in_schema.split(".")[0]
            if name in lists:
                values[name] = values.get(name, 0) + chunk.num_values
        for name, count in values.items():
            col = columns[name]
            check_array_bytes(count * col.dtype.itemsize, f"{path}: row group {g} of list column {name!r} "
                              f"({count:,} {col.dtype.name} values, read as whole rows)")
            width = None if col.shape is None else int(np.prod(col.shape, dtype=np.int64))
            if width is not None and count > group.num_rows * max(width, 1):
                rows = f"{group.num_rows:,} row{'' if group.num_rows == 1 else 's'}"
                raise UnreadableFileError(f"{path}: row group {g} of column {name!r} holds {count:,} values in {rows}, "
                                          f"more than rows of {width:,} values hold; the file is damaged or not what "
                                          "its metadata says")


def _arrow_column(field, shape, path) -> Column:
    pa = require("pyarrow", "analysis", "reading .parquet files")
    t = field.type
    if pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t):
        inner = t.value_type
        width = t.list_size if pa.types.is_fixed_size_list(t) else None
        if shape is None:
            shape = (width,) if width is not None else None
    else:
        inner, shape = t, ()
    try:
        dtype = np.dtype(inner.to_pandas_dtype())
    except (NotImplementedError, TypeError):
        dtype = None
    if dtype is None or dtype.kind not in "biuf":
        raise UnreadableFileError(f"{path}: column {field.name!r} has type {t}; expected numbers or lists of numbers")
    return Column(field.name, dtype, shape)  # shape None: a variable-length list, checked per block


def _to_numpy(array, col: Column, path) -> np.ndarray:
    pa = require("pyarrow", "analysis", "reading .parquet files")
    if array.null_count:
        raise UnreadableFileError(f"{path}: column {col.name!r} has {array.null_count} missing values")
    if not pa.types.is_list(array.type) and not pa.types.is_large_list(array.type) and not pa.types.is_fixed_size_list(array.type):
        return array.to_numpy(zero_copy_only=False).astype(col.dtype, copy=False)
    values = array.flatten().to_numpy(zero_copy_only=False)
    rows = len(array)
    width = values.size // rows if rows else 0
    if rows and values.size != rows * width:
        raise UnreadableFileError(f"{path}: column {col.name!r} holds lists of different lengths")
    shape = col.shape if col.shape is not None else (width,)
    return np.ascontiguousarray(values.reshape((rows, *shape)))


class FolderTable(Table):
    """A folder of tables, concatenated in file-name order (hidden files and others ignored);
    ``per_observation`` as for :class:`NpzTable`, for each ``.npz``."""

    def __init__(self, path: Path, per_observation: bool = False):
        self.path = path
        files = sorted(p for p in path.iterdir() if p.suffix in SUFFIXES and not p.name.startswith((".", "_")))
        if not files:
            raise UnreadableFileError(f"{path} holds no .npy, .npz or .parquet file")
        self.parts = [open_table(p, per_observation=per_observation) for p in files]
        self.left_out = {n: s for part in self.parts for n, s in part.left_out.items()}
        first = self.parts[0]
        for part in self.parts[1:]:
            if part.columns != first.columns:
                raise UnreadableFileError(
                    f"{part.path} does not match {first.path}: columns {_describe(part.columns)} vs {_describe(first.columns)}")
        self.columns, self.metadata = first.columns, first.metadata
        self.rows = sum(p.rows for p in self.parts)

    def iter_batches(self, batch_size, names=None):
        for part in self.parts:  # blocks do not span files: the last of each file may be shorter
            yield from part.iter_batches(batch_size, names)


class NpyFolderTable(Table):
    """An ``npy`` recording: a folder of one ``.npy`` file per column, named by :data:`META_FILE`'s
    ``files`` (tensor name -> file name in the folder).

    A file name must name a regular file right in the folder (no path, no link): the description
    never leads a reader elsewhere.
    """

    def __init__(self, path: Path):
        self.path = path
        meta = path / META_FILE
        if meta.stat().st_size > META_FILE_BYTES:
            raise UnreadableFileError(f"{meta} is {meta.stat().st_size:,} bytes, more than a recording's description "
                                      f"({META_FILE_BYTES:,}); it is not one")
        try:
            text = meta.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UnreadableFileError(f"cannot read {meta}: {e}") from e
        self.metadata = _metadata(text, meta)
        files = self.metadata.get("files")
        rows = self.metadata.get("rows")
        if (not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items())
                or type(rows) is not int or rows < 0):
            raise UnreadableFileError(f"{meta} does not describe an npy recording: it needs 'rows' (a count) and "
                                      "'files' (tensor name -> file name)")
        self.rows = rows
        self.columns, self._files, self._offsets = {}, {}, {}
        for name, file in files.items():
            where = path / file
            if (Path(file).name != file or not file.endswith(".npy") or file.startswith(".") or "\0" in file
                    or where.is_symlink() or not where.is_file()):
                raise UnreadableFileError(f"{meta} names {file!r} for tensor {name!r}: not an .npy file in {path}")
            with open(where, "rb") as f:
                dtype, shape = _npy_header(f, str(where))
                offset = f.tell()
            if shape[0] != rows:
                raise UnreadableFileError(f"{where} holds {shape[0]} rows; {meta} says {rows}")
            expected = offset + rows * dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))
            if where.stat().st_size < expected:
                raise UnreadableFileError(f"{where} is truncated: its header says {shape}, which needs {expected} bytes")
            self.columns[name] = Column(name, dtype, shape[1:])
            self._files[name], self._offsets[name] = where, offset

    def _row_bytes(self, name: str) -> int:
        col = self.columns[name]
        return col.dtype.itemsize * int(np.prod(col.shape, dtype=np.int64))

    def read_rows(self, start, stop, names=None):
        block = {}
        for n in list(self.columns) if names is None else names:
            col = self.columns[n]
            with open(self._files[n], "rb") as f:
                f.seek(self._offsets[n] + start * self._row_bytes(n))
                block[n] = np.empty((stop - start, *col.shape), col.dtype)
                _read_exactly(f, block[n], self._files[n])
        return block

    def iter_batches(self, batch_size, names=None):
        names = list(self.columns) if names is None else names
        streams = {}
        try:
            for n in names:
                streams[n] = open(self._files[n], "rb")
                streams[n].seek(self._offsets[n])
            yield from _blocks(streams, self.columns, self.rows, batch_size, self.path)
        finally:
            for f in streams.values():
                f.close()


def _describe(columns: dict[str, Column]) -> str:
    return ", ".join(f"{c.name or '(array)'} {c.dtype.name}{list(c.shape) if c.shape is not None else '[?]'}"
                     for c in columns.values())


def open_table(path: str | os.PathLike, *, per_observation: bool = False) -> Table:
    """The table in ``path``: an ``.npy``, ``.npz`` or ``.parquet`` file, a folder of them, or an
    ``npy`` recording's folder; ``per_observation``: an ``.npz`` is read as a recording (see
    :class:`NpzTable`).

    Raises:
        UnreadableFileError: missing, of another kind, malformed, or an object (pickle) array.
        MissingDependencyError: a ``.parquet`` file without pyarrow installed.
    """
    path = Path(path)
    if path.is_dir():
        return NpyFolderTable(path) if (path / META_FILE).is_file() else FolderTable(path, per_observation)
    if not path.is_file():
        what = not_a_file(path)
        raise UnreadableFileError(f"{path} {what}, not a file; expected an .npy, .npz or .parquet file, or a folder "
                                  "of them" if what else f"{path}: no such file or folder")
    kinds = {".npy": NpyTable, ".npz": NpzTable, ".parquet": ParquetTable}
    if path.suffix not in kinds:
        raise UnreadableFileError(f"{path}: expected an .npy, .npz or .parquet file, or a folder of them")
    return NpzTable(path, per_observation) if path.suffix == ".npz" else kinds[path.suffix](path)
