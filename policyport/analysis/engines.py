"""Recording a whole dataset: read it block by block, run every block, stream the activations to disk.

Two engines run the same recording:

* ``local`` (:func:`record_local`): one process; blocks of ``batch_size`` rows go through
  :meth:`Session.record_iter <policyport.runtime.Session.record_iter>` and into a streaming writer,
  so at most one block of observations and of activations is held at a time;
* ``ray`` (:func:`record_ray`): a Ray dataset of row blocks, ``map_batches`` with a callable class
  that builds the numpy session once per worker, reads its block, records it and writes it as one
  ``.parquet`` file named by its first row: a folder of files in row order, for datasets beyond one
  machine.

Either way the output appears all at once (written under a temporary name and renamed) or not at
all, also when the run is interrupted.
"""

from __future__ import annotations

import collections
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ..errors import BadModelError, InputMismatchError, OptionError, check_argument, require
from ..io.outputs import check_distinct, check_writable, write_atomic
from ..runtime.base import check_feeds
from ..io.limits import check_free_space
from ..runtime.base import nonfinite_rows
from ..runtime.numpy.rows import ResultPool, reusing
from .folders import building, check_out_folder, commit_folder
from .recording import FORMATS, WRITERS, TensorInfo, describe, tensor_infos
from .tables import Table, open_table

#: Engines of :func:`record_dataset`.
ENGINES = ("local", "ray")
DEFAULT_BATCH = 4096

Progress = Callable[[int, int], None]  # (rows done, rows in total)


@dataclass
class RecordSummary:
    """What :func:`record_dataset` wrote.

    Attributes:
        path: the output (a file; a folder for ``npy`` and for the ray engine's ``.parquet`` files).
        format: ``"npz"``, ``"parquet"`` or ``"npy"``.
        rows: observations recorded.
        tensors: the recorded tensors (name, op type, dtype, row shape).
        skipped: selected tensors left out because they have no batch axis (a constant, a shape).
        nonfinite_rows: observations holding a NaN or an infinite value in some input (local engine).
        seconds: wall time of the recording.
        bytes: size of the output on disk.
    """

    path: Path
    format: str
    rows: int
    tensors: list[TensorInfo]
    skipped: list[str] = field(default_factory=list)
    nonfinite_rows: int = 0
    seconds: float = 0.0
    bytes: int = 0


#: The files of an ``npy`` recording's folder (``--force`` replaces only such a folder).
NPY_SUFFIXES = (".npy", ".json")
#: Suffixes that name a single file: the ray engine's output, a folder, is refused under them.
FILE_SUFFIXES = (".npz", ".npy", ".json", ".csv")


def choose_format(out: Path, fmt: str | None, engine: str) -> str:
    """The output format: ``fmt`` if given, else from ``out``'s suffix (``.npz``/``.parquet``; none:
    ``npy``, a folder); the ray engine writes parquet, into a folder.

    Raises:
        OptionError: an unknown format, one that contradicts the suffix or the engine, or a file's
            suffix for the ray engine's folder (exit 2). Messages name the command-line option and
            the keyword argument of :func:`record_dataset`.
    """
    by_suffix = {".npz": "npz", ".parquet": "parquet"}.get(out.suffix)
    if fmt is not None and fmt not in FORMATS:
        raise OptionError(f"unknown recording format {fmt!r} (--format, format=); choose one of {', '.join(FORMATS)}")
    if engine == "ray":
        if fmt not in (None, "parquet"):
            raise OptionError(f"--engine ray (engine='ray') writes a folder of .parquet files, but --format (format=) "
                              f"asks for {fmt}; drop --format, or use --engine local")
        if out.suffix.lower() in FILE_SUFFIXES:
            raise OptionError(f"--engine ray (engine='ray') writes a folder of .parquet files, but -o (out=) "
                              f"{out.name!r} ends in {out.suffix}, a file's suffix; give a folder name such as "
                              f"{out.with_suffix('').name!r}, or use --engine local to write {out.name!r}")
        return "parquet"
    chosen = fmt or by_suffix or ("npy" if not out.suffix else None)
    if chosen is None:
        raise OptionError(f"cannot tell the recording format from -o (out=) {out.name!r}; name it .npz or .parquet, "
                          f"or {out.with_suffix('').name!r} (no suffix) for a folder of .npy files, or give --format "
                          "(format=)")
    if chosen == "npy":
        if out.suffix.lower() in FILE_SUFFIXES + (".parquet",):
            raise OptionError(f"--format npy (format='npy') writes a folder of .npy files, but -o (out=) {out.name!r} "
                              f"ends in {out.suffix}, a file's suffix; give a folder name such as "
                              f"{out.with_suffix('').name!r}")
        return chosen
    if by_suffix is not None and by_suffix != chosen:
        raise OptionError(f"-o (out=) {out.name!r} ends in {out.suffix} but --format (format=) asks for {chosen}; "
                          f"name the output {out.with_suffix('.' + chosen).name!r}, or drop --format")
    return chosen


def feed_columns(table: Table, inputs: list[str]) -> dict[str, str]:
    """Graph input -> the table column that feeds it: the only column for a single-input model,
    else the column named like the input (other columns are ignored).

    Raises:
        InputMismatchError: an input has no column.
    """
    columns = list(table.columns)
    if len(inputs) == 1 and len(columns) == 1:
        return {inputs[0]: columns[0]}
    missing = [n for n in inputs if n not in table.columns]
    if missing:
        raise InputMismatchError(f"{table.path} has columns {columns} but the model's inputs are {inputs}; "
                                 f"no column for {missing}")
    return {n: n for n in inputs}


def record_dataset(model, data, out, *, tensors="*", batch_size: int = DEFAULT_BATCH, format: str | None = None,
                   engine: str = "local", backend: str = "numpy", overrides=None, force: bool = False,
                   progress: Progress | None = None, threads: int = 0) -> RecordSummary:
    """Record the activations of every observation of a dataset into one file (or folder).

    Args:
        model: an ``onnx.ModelProto``, a path to an ``.onnx`` file or a packed folder, or a loaded
            :class:`~policyport.runtime.Session` (local engine only).
        data: an ``.npy``, ``.npz`` or ``.parquet`` file, or a folder of them, of any size (see
            :mod:`policyport.analysis.tables`); a single-input model takes the only column, else
            columns are matched to inputs by name. The dtype must be the input's (no silent casts).
        out: the output: an ``.npz`` or ``.parquet`` file, or a folder of ``.npy`` files (local, a
            name without a suffix); a folder of ``.parquet`` files (ray).
        tensors: ``fnmatch`` globs over node-output names (default every tensor); graph outputs are
            always recorded.
        batch_size: rows per block (default 4096); memory is bounded by one block.
        format: ``"npz"``, ``"parquet"`` or ``"npy"``; default from ``out``'s suffix (none: ``"npy"``).
        engine: ``"local"`` (default) or ``"ray"`` (needs the ``ray`` extra; numpy backend).
        backend: the local engine's backend, ``"numpy"`` (default) or ``"onnxruntime"``.
        overrides: neuron overrides applied while recording (any form
            :meth:`Session.run <policyport.runtime.Session.run>` takes); the steered activations are recorded.
        force: replace an existing output file (a folder only if it holds a previous recording).
        progress: called as ``progress(rows_done, rows_total)`` after each block.
        threads: threads of the local engine's session (see :func:`policyport.load`); 0 (default)
            one per core. The ray engine's workers run on one thread each.

    Returns:
        A :class:`RecordSummary`.

    Raises:
        OptionError: a format that contradicts ``out``'s suffix or the engine; a file's suffix for a
            folder (``npy``, the ray engine) (exit 2).
        InputMismatchError: bad tensors, overrides, batch size, or data that does not fit the model.
        UnreadableFileError: unreadable data.
        OutputExistsError: ``out`` exists (without ``force``) or is one of the inputs.
        MissingDependencyError: pyarrow (parquet) or ray missing.
    """
    if engine not in ENGINES:
        raise InputMismatchError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    check_argument(batch_size, "batch_size (rows per block)", "int")
    check_argument(threads, "threads (0: one per core)", "int")
    if batch_size < 1:
        raise InputMismatchError(f"the batch size must be at least 1, got {batch_size}")
    out = Path(out)
    fmt = choose_format(out, format, engine)
    check_distinct(out, data, model if isinstance(model, (str, os.PathLike)) else None)
    if engine == "ray":
        return record_ray(model, data, out, tensors=tensors, batch_size=batch_size, overrides=overrides,
                          force=force, progress=progress)
    return record_local(model, data, out, fmt, tensors=tensors, batch_size=batch_size, backend=backend,
                        overrides=overrides, force=force, progress=progress, threads=threads)


def record_local(model, data, out: Path, fmt: str, *, tensors="*", batch_size: int = DEFAULT_BATCH,
                 backend: str = "numpy", overrides=None, force: bool = False,
                 progress: Progress | None = None, threads: int = 0) -> RecordSummary:
    """The ``local`` engine of :func:`record_dataset` (arguments as there)."""
    from ..runtime import Session, load

    if fmt == "npy":
        check_out_folder(out, force, NPY_SUFFIXES)
    else:
        check_writable(out, force)
    session = model if isinstance(model, Session) else load(model, backend=backend, threads=threads)
    table = open_table(data)
    columns = feed_columns(table, [v.name for v in session.inputs])
    names = session.selection(tensors)
    steering = None if overrides is None else session.steering(overrides)
    made = {"data": str(data), "model": str(model) if isinstance(model, (str, os.PathLike)) else None,
            "backend": session.backend.name, "batch_size": batch_size,
            "overrides": [] if steering is None else steering.specs}
    summary = RecordSummary(out, fmt, table.rows, *batched_tensors(session, table, columns, names, steering))
    if fmt != "parquet":  # uncompressed: its size is known from the start
        row_bytes = sum(t.row_bytes for t in summary.tensors)
        check_free_space(out, table.rows * row_bytes, f"the recording ({table.rows:,} rows of {row_bytes:,} bytes, "
                         f"{len(summary.tensors)} tensors)")
    started = time.perf_counter()

    sizes: collections.deque[int] = collections.deque()  # rows of each block read and not yet recorded

    def blocks():
        for block in table.iter_batches(batch_size, list(dict.fromkeys(columns.values()))):
            sizes.append(len(next(iter(block.values()))))
            if len(block) == 1:
                summary.nonfinite_rows += nonfinite_rows(next(iter(block.values())))
            else:  # a row counts once, whichever inputs hold the NaN
                flags = [~np.isfinite(a.reshape(len(a), -1)).all(axis=1) for a in block.values() if a.dtype.kind in "fc"]
                summary.nonfinite_rows += int(np.logical_or.reduce(flags).sum()) if flags else 0
            yield {i: block[c] for i, c in columns.items()}

    def write(file) -> None:  # the output's temporary file, open for writing (npy: its temporary folder)
        pool = ResultPool()  # each block's arrays, once written, hold a later block's results
        writer, done = Background(WRITERS[fmt](file, table.rows, summary.tensors,
                                               describe(table.rows, summary.tensors, **made), scratch=out.parent),
                                  written=pool.give_back), 0
        try:
            for values in _reusing(session.record_iter(read_ahead(blocks()), names, steering), pool):
                rows = sizes.popleft()
                _check_block(values, rows, summary.tensors)
                writer.append({t.name: values[t.name] for t in summary.tensors})
                del values  # the writer gives the arrays back to the pool
                done += rows
                if progress is not None:
                    progress(done, table.rows)
            writer.close()
        except BaseException:
            writer.abort()
            raise

    if fmt == "npy":
        with building(out, "recording") as build:
            write(build)
            summary.bytes = build.nbytes()
            commit_folder(build, out, force, NPY_SUFFIXES)
    else:
        write_atomic(out, write, force)
        summary.bytes = out.stat().st_size
    summary.seconds = time.perf_counter() - started
    return summary


def read_ahead(items: Iterator, depth: int = 1) -> Iterator:
    """``items``, produced on a thread of their own up to ``depth`` items ahead of the consumer: the
    next block of observations is read (and checked) while this one is computed.

    An exception of ``items`` is raised in the consumer at the item it replaced. When the consumer
    stops early (an error, Ctrl-C), the thread stops at its next item and ``items`` is closed.
    """
    import queue
    import threading

    handoff: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    end = object()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        handoff.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            handoff.put((end, None))
        except BaseException as e:  # re-raised in the consumer
            handoff.put((end, e))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, name="policyport-reader", daemon=True)
    thread.start()
    try:
        while True:
            item, error = handoff.get()
            if item is end:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # let a producer blocked on a full queue see the stop
            try:
                handoff.get(timeout=0.1)
            except queue.Empty:
                pass
        thread.join()


def _reusing(results, pool):
    """``results`` (a generator of record results) run with its row-block results taken from ``pool``
    (:func:`policyport.runtime.numpy.rows.reusing`): the context is entered around each step only,
    so it never leaks into the consumer's code between steps."""
    while True:
        with reusing(pool):
            try:
                values = next(results)
            except StopIteration:
                return
        yield values


class Background:
    """A writer whose ``append`` runs on a thread, so that computing the next block overlaps writing
    this one (numpy's BLAS calls and the file writes both release the GIL).

    At most ``depth`` blocks wait in the queue: with the block being written and the one being
    computed, ``depth + 2`` blocks of activations are alive at the most. ``written(arrays)``, if
    given, is called on the writer's thread with each block's arrays once they are written.
    """

    def __init__(self, writer, depth: int = 1, written: Callable | None = None):
        import queue
        import threading

        self.writer = writer
        self._written = written
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._drain, name="policyport-writer", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while True:
            block = self._queue.get()
            if block is None:
                return
            if self._error is None:
                try:
                    self.writer.append(block)
                    if self._written is not None:
                        self._written(block.values())
                except BaseException as e:  # re-raised in the caller's thread
                    self._error = e

    def append(self, block: dict[str, np.ndarray]) -> None:
        self._raise()
        self._queue.put(block)

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Wait for every block to be written, then close the writer."""
        self._queue.put(None)
        self._thread.join()
        self._raise()
        self.writer.close()

    def abort(self) -> None:
        """Drop what is queued, stop the thread and remove what the writer made."""
        self._error = self._error or InterruptedError("aborted")
        while self._thread.is_alive():
            try:
                self._queue.put(None, timeout=0.1)
            except Exception:  # queue.Full: the thread is busy writing; try again
                continue
            self._thread.join(0.1)
        self.writer.abort()


def batched_tensors(session, table: Table, columns: dict[str, str], names: list[str],
                    steering=None) -> tuple[list[TensorInfo], list[str]]:
    """Which of the tensors ``names`` have the batch axis first (one row per observation), found on
    the first row of ``table`` (:meth:`Session.per_observation <policyport.runtime.Session.per_observation>`).

    Args:
        session: the model, loaded.
        table: the dataset; ``columns``: graph input -> its column (:func:`feed_columns`).
        names: the tensors to record; ``steering``: overrides applied while recording, or None.

    Returns:
        (the tensors with rows, as :class:`TensorInfo` in ``names``' order with graph outputs after,
        as :meth:`Session.record` returns them; the names of the others).

    Raises:
        InputMismatchError: the model has no input with a batch axis (each of its runs is one observation).
    """
    import contextlib

    wanted = list(dict.fromkeys(columns.values()))
    with contextlib.closing(table.iter_batches(1, wanted)) as blocks:
        first = next(blocks, None)
    if first is None:  # no rows: zeros of each column's row shape
        first = {c: np.zeros((1, *table.columns[c].shape), table.columns[c].dtype) for c in wanted}
    # the whole table's shapes checked first (zero-stride views: nothing is read or copied), so that a
    # mismatch names the file's rows, not the one probed
    batched = {v.name for v in [*session.inputs, *session.optional_inputs] if v.has_batch_axis}
    check_feeds({i: np.broadcast_to(first[c][:1], (max(table.rows, 1) if i in batched else len(first[c]),
                                                   *first[c].shape[1:]))
                 for i, c in columns.items()}, session.inputs, session.optional_inputs)
    found = session.per_observation({i: first[c] for i, c in columns.items()}, names, overrides=steering)
    if found is None:
        raise InputMismatchError(f"the model's inputs [{', '.join(repr(v.name) for v in session.inputs)}] have no "
                                 "batch axis (a fixed axis 0): each run of it is one observation, and a recording "
                                 "needs one row per observation; run it with policyport run --record instead")
    rows, skipped = found
    return tensor_infos(session, rows), skipped


def _check_block(values: dict[str, np.ndarray], rows: int, tensors: list[TensorInfo]) -> None:
    for t in tensors:
        v = values[t.name]
        if v.shape != (rows, *t.shape) or v.dtype.name != t.dtype:
            raise BadModelError(f"tensor {t.name!r} is {v.dtype.name}{tuple(v.shape)} in a block of {rows} rows; "
                                f"the first block gave {t.dtype}(rows, {', '.join(map(str, t.shape))}): "
                                "a recording needs the same row shape in every block")


# ------------------------------------------------------------------------------------------------ ray


def record_ray(model, data, out: Path, *, tensors="*", batch_size: int = DEFAULT_BATCH, overrides=None,
               force: bool = False, progress: Progress | None = None) -> RecordSummary:
    """The ``ray`` engine of :func:`record_dataset`: Ray Data, the numpy backend on every worker.

    The dataset is split into blocks of ``batch_size`` rows of one file each, a Ray dataset of
    ``(file, first row, last row, global first row)``; ``map_batches`` runs :class:`RecordBatch`, a
    callable class that builds the numpy session once per worker, reads its block, records it and
    writes it as ``part-<global first row>.parquet`` with the recording's schema. The workers write
    the files themselves rather than through ``Dataset.write_parquet``, which hands the blocks of a
    write task to ``pyarrow.dataset.write_dataset`` with ``use_threads=True`` and may change their
    row order; named by first row, the files list in row order. The data files and the output folder
    must be reachable from every worker (a shared filesystem).

    Uses the running Ray instance if there is one, else ``ray.init()`` (which joins the cluster that
    ``RAY_ADDRESS`` names, or starts a local one). ``data`` is ``.npy`` or ``.parquet`` files, or a
    folder of them.
    """
    ray = require("ray", "ray", "recording with --engine ray")
    from ..runtime import load
    from .tables import FolderTable

    table = open_table(data)
    parts = table.parts if isinstance(table, FolderTable) else [table]
    kinds = {p.path.suffix for p in parts}
    if not kinds <= {".npy", ".parquet"}:
        raise InputMismatchError(f"the ray engine reads .npy and .parquet files; {data} holds {sorted(kinds)}")
    model_bytes = _model_bytes(model)
    session = load(_proto(model_bytes), backend="numpy")  # checks tensors and overrides before Ray starts
    columns = feed_columns(table, [v.name for v in session.inputs])
    names = session.selection(tensors)
    steering = None if overrides is None else session.steering(overrides)
    specs = [] if steering is None else steering.specs
    edits = [] if steering is None else [e for t in steering.tensors for e in steering.edits[t]]  # arrays and all
    infos, skipped = batched_tensors(session, table, columns, names, edits or None)
    metadata = describe(table.rows, infos, data=str(data), model=str(model) if isinstance(model, (str, os.PathLike)) else None,
                        backend="numpy", batch_size=batch_size, overrides=specs, engine="ray")
    check_out_folder(out, force, (".parquet",))
    started = time.perf_counter()
    blocks, first = [], 0
    for part in parts:
        blocks += [{"path": str(part.path), "start": s, "stop": min(s + batch_size, part.rows), "row": first + s}
                   for s in range(0, part.rows, batch_size)]
        first += part.rows
    with building(out, "recording") as build:  # Ray's workers write in it by path, from other processes
        ray_data = start_ray(ray)
        recorded = ray_data.from_items(blocks).map_batches(RecordBatch, fn_constructor_kwargs={
            "model": model_bytes, "names": names, "overrides": edits, "columns": columns, "tensors": infos,
            "metadata": metadata, "folder": str(build.path)}, batch_size=1, batch_format="numpy",
            compute=ray_data.ActorPoolStrategy(min_size=1))
        done = 0
        for written in recorded.iter_rows():
            done += int(written["rows"])
            if progress is not None:
                progress(done, table.rows)
        if done != table.rows:
            raise BadModelError(f"the Ray workers recorded {done} rows of {table.rows}; nothing was written")
        size = build.nbytes()
        commit_folder(build, out, force, (".parquet",))
    seconds = time.perf_counter() - started
    return RecordSummary(out, "parquet", table.rows, infos, skipped, seconds=seconds, bytes=size)


def start_ray(ray):
    """``ray.data``, after joining the running Ray instance, or ``ray.init()`` (the cluster that
    ``RAY_ADDRESS`` names, else a local one) with Ray's own logging kept to warnings."""
    import logging

    if not ray.is_initialized():
        ray.init(logging_level="ERROR", log_to_driver=False, include_dashboard=False)
    import ray.data

    logging.getLogger("ray").setLevel(logging.WARNING)
    logging.getLogger("ray.data").setLevel(logging.ERROR)  # its notes on progress bars and deprecations
    ray.data.DataContext.get_current().enable_progress_bars = False
    return ray.data


class RecordBatch:
    """The Ray Data map of :func:`record_ray`: one numpy session per worker, built once; each call
    records one block of rows and writes it as one ``.parquet`` file of the recording's schema."""

    def __init__(self, model: bytes, names: list[str], overrides: list, columns: dict[str, str],
                 tensors: list[TensorInfo], metadata: dict, folder: str):
        from ..runtime import load

        self.session = load(_proto(model), backend="numpy", threads=1)  # one worker per core already
        self.names, self.columns, self.tensors, self.metadata = names, columns, tensors, metadata
        self.steering = self.session.steering(overrides) if overrides else None
        self.folder = Path(folder)
        self._tables: dict[str, Table] = {}

    def __call__(self, item: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from .recording import ParquetWriter

        path, start, stop, row = (item[k][0] for k in ("path", "start", "stop", "row"))
        table = self._tables.get(path) or self._tables.setdefault(path, open_table(path))
        block = table.read_rows(int(start), int(stop), list(dict.fromkeys(self.columns.values())))
        feeds = {i: block[c] for i, c in self.columns.items()}
        values = self.session.record(feeds, self.names, overrides=self.steering)
        name = self.folder / f"part-{int(row):012d}.parquet"
        writer = ParquetWriter(name, int(stop - start), self.tensors, self.metadata)
        try:
            writer.append(values)
        finally:
            writer.close()
        return {"row": np.array([row]), "rows": np.array([stop - start])}


def _model_bytes(model) -> bytes:
    from ..graph.onnx_files import ensure_model, load_onnx

    if isinstance(model, (str, os.PathLike)) and Path(model).is_dir():
        return load_onnx(model).SerializeToString()
    return ensure_model(model).SerializeToString()


def _proto(data: bytes):
    onnx = require("onnx", "onnx", "loading a model")
    return onnx.load_from_string(data)
