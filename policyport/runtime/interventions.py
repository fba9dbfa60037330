"""Intervention files: named sets of overrides, ablations, steering directions and patches, in JSON or YAML.

The file extends the ``--overrides`` file of named override sets (which it still reads unchanged): each
set maps a tensor to ``{INDEX: value}`` (or is a list of text specs, see
:mod:`policyport.runtime.overrides`), and a value may also name the files an intervention takes its
arrays from::

    brake:                                   # the override forms: set, scale, clip
      fc_2/tanh: {"17": 1.0, "0:8": {clip: [-0.5, 0.5]}, "*": {scale: 0.5}}
    left:                                    # add alpha * v, v from a .npy (policyport direction writes one)
      fc_2/tanh: {"*": {add: left.npy, alpha: 2.0}}
    knockout:
      fc_1/tanh:
        "0:16": {ablate: zero}
        "16:32": {ablate: mean, recording: acts.npz}          # each neuron's mean over a recording
        "32:48": {ablate: mean, dataset: obs.npy}             # ... over the model's run on a dataset
        "48:64": {ablate: resample, recording: acts.npz, seed: 0, rows: 4096}
    swap:
      fc_2/tanh: {"*": {patch: clean.npy}}   # the tensor's activations on the observations of clean.npy

A file is YAML when its name ends in ``.yaml`` or ``.yml`` (read with PyYAML's safe loader: the ``cli``
extra), JSON otherwise. Paths are relative to the file's folder, so a file travels with its arrays.
``add`` also takes a list of numbers. ``mean``/``resample`` take their statistics from a ``recording``
(a tensor of one row per observation: ``policyport run --record`` or ``policyport record``) or a
``dataset`` of observations the model is run on, in blocks of ``batch_size`` rows; ``resample`` keeps
``rows`` rows (default 4,096) drawn uniformly without replacement (each row given a random key from
``numpy.random.default_rng(seed)``, the smallest keys kept), so memory stays bounded. ``patch``
runs the model on its observations once and puts the tensor's values into every run: one
observation goes into every row, else the run must have as many rows.

Only the chosen set is resolved: the files of the other sets are not read.
Needs numpy (and PyYAML for a YAML file).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterable, Mapping

import numpy as np

from ..errors import InputMismatchError, UnreadableFileError, listing, require
from .overrides import Edit, parse_overrides

#: Rows a resample-ablation keeps from its recording or dataset, unless the file says ``rows``.
RESAMPLE_ROWS = 4096
#: Rows per block when a dataset is run for statistics.
STATISTICS_BATCH = 4096

#: (recording path, tensor name) -> blocks of the tensor's rows, each ``(rows_in_block, *row)``.
RecordingBlocks = Callable[[Path, str], Iterable[np.ndarray]]

_KEYS = {"add": {"add", "alpha"}, "patch": {"patch"},
         "ablate": {"ablate", "recording", "dataset", "seed", "rows"}}


def read_document(path: str | os.PathLike) -> dict:
    """The named sets of an intervention file, as written (nothing resolved).

    Raises:
        UnreadableFileError: missing, unreadable, not JSON / YAML.
        InputMismatchError: not an object of named sets.
        MissingDependencyError: a YAML file without PyYAML (the ``cli`` extra).
    """
    path = Path(path)
    if path.suffix.lower() in (".yaml", ".yml"):
        yaml = require("yaml", "cli", f"reading the YAML intervention file {path}")
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise UnreadableFileError(f"{path}: no such file") from None
        except (OSError, UnicodeDecodeError) as e:
            raise UnreadableFileError(f"{path} is not a readable YAML file: {e}") from e
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise UnreadableFileError(f"{path} is not YAML that the safe loader reads: {e}") from None
    else:
        from ..io.kinds import read_json

        doc = read_json(path)
    if not isinstance(doc, dict) or not doc or not all(isinstance(k, str) for k in doc):
        raise InputMismatchError(f"{path} must hold an object of named intervention sets, e.g. "
                                 '{"brake": {"fc_2/tanh": {"17": 1.0}}}')
    return doc


def read_interventions(path: str | os.PathLike, name: str, session=None, *,
                       recording_blocks: RecordingBlocks | None = None,
                       batch_size: int = STATISTICS_BATCH) -> list[Edit]:
    """The edits of the set ``name`` of an intervention file, with every array it names read.

    Args:
        path: the JSON or YAML file (see the module docstring).
        name: the set to apply.
        session: the :class:`~policyport.runtime.Session` of the model, needed by ``dataset``
            statistics and ``patch`` (which run it), or a function that returns it (called once, when
            first needed); ``None`` refuses those.
        recording_blocks: reads a recorded tensor block by block; default :func:`npz_blocks` (an
            ``.npz`` or a folder of ``.npy`` files; ``policyport`` passes a reader of every format).
        batch_size: rows per block when a dataset is run (default 4,096).

    Returns:
        The edits, in the file's order.

    Raises:
        InputMismatchError: no set ``name`` (the message lists the sets); a malformed set; an
            intervention that needs the model without ``session``; arrays of the wrong kind.
        UnreadableFileError: the file or a file it names cannot be read, or a recording lacks the tensor.
    """
    path = Path(path)
    doc = read_document(path)
    if name not in doc:
        raise InputMismatchError(f"{path} has no set {name!r}; it has: {listing(doc, show=str)}")
    chosen = doc[name]
    reader = _Reader(path.parent, session, recording_blocks or npz_blocks, batch_size)
    try:
        if not isinstance(chosen, Mapping):
            return parse_overrides(chosen)
        resolved = {}
        for tensor, neurons in chosen.items():
            if not isinstance(tensor, str) or not isinstance(neurons, Mapping):
                raise InputMismatchError(
                    f"a set maps a tensor name to {{neuron index: value}}; got {tensor!r}: {neurons!r}")
            resolved[tensor] = {index: reader.resolve(tensor, index, value) for index, value in neurons.items()}
        return parse_overrides(resolved)
    except InputMismatchError as e:
        raise InputMismatchError(f"{path}, set {name!r}: {e}") from e


class _Reader:
    """Reads the arrays an intervention value names, relative to the file's folder."""

    def __init__(self, folder: Path, session, recording_blocks: RecordingBlocks, batch_size: int):
        self.folder, self._session, self.recording_blocks, self.batch_size = folder, session, recording_blocks, batch_size

    @property
    def session(self):
        if callable(self._session) and not hasattr(self._session, "record"):
            self._session = self._session()
        return self._session

    def resolve(self, tensor: str, index: object, value: object) -> object:
        """``value`` with its file names replaced by arrays (other values unchanged)."""
        if isinstance(index, bool):
            return value  # parse_overrides names the bad index
        if not isinstance(value, Mapping) or not {"add", "ablate", "patch"} & set(value):
            return value
        where = f"{tensor}[{index}]"
        kind = next(k for k in ("add", "ablate", "patch") if k in value)
        extra = set(value) - _KEYS[kind]
        if extra:
            raise InputMismatchError(f"{where}: {kind} takes {sorted(_KEYS[kind])}, not {sorted(extra)}")
        if kind == "add":
            given = value["add"]
            if isinstance(given, str):
                return {"add": self.array(given, "direction"), "alpha": value.get("alpha", 1.0), "source": given}
            return {"add": given, "alpha": value.get("alpha", 1.0)}
        if kind == "patch":
            obs = value["patch"]
            if not isinstance(obs, str):
                raise InputMismatchError(f"{where}: patch names a file of observations (.npy or .npz), got {obs!r}")
            activations = self.run(where, obs, tensor, self.feeds(obs))
            return {"patch": activations, "source": obs}
        return self.ablation(tensor, where, value)

    def ablation(self, tensor: str, where: str, value: Mapping) -> dict:
        method = value["ablate"]
        if method == "zero" or method not in ("mean", "resample"):
            stray = sorted(set(value) & {"recording", "dataset", "rows", "seed"})
            if method == "zero" and stray:
                raise InputMismatchError(f"{where}: zero-ablation takes no {' or '.join(stray)}")
            return {"ablate": method}
        sources = [k for k in ("recording", "dataset") if k in value]
        if len(sources) != 1 or not isinstance(value[sources[0]], str):
            raise InputMismatchError(f"{where}: {method}-ablation takes its statistics from a recording "
                                     "(recording: FILE) or a dataset the model runs on (dataset: FILE): give one")
        stray = sorted(set(value) & {"rows", "seed"}) if method == "mean" else []
        if stray:
            raise InputMismatchError(f"{where}: mean-ablation takes no {' or '.join(stray)}")
        seed, rows = value.get("seed", 0), value.get("rows", RESAMPLE_ROWS)
        for key, number, low in (("seed", seed, 0), ("rows", rows, 1)):
            if isinstance(number, bool) or not isinstance(number, int) or number < low:
                raise InputMismatchError(f"{where}: {key} must be a whole number >= {low}, got {number!r}")
        given = value[sources[0]]
        if sources[0] == "recording":
            blocks = self.recording_blocks(self.folder / given, tensor)
        else:
            feeds = self.feeds(given)
            blocks = (self.run(where, given, tensor, part) for part in _slices(feeds, self.batch_size))
        if method == "mean":
            return {"ablate": "mean", "mean": block_mean(blocks, f"{given} ({tensor})"), "source": given}
        return {"ablate": "resample", "samples": reservoir(blocks, rows, seed, f"{given} ({tensor})"),
                "seed": seed, "source": given}

    def array(self, name: str, what: str) -> np.ndarray:
        from ..io.arrays import load_arrays

        arrays = load_arrays(self.folder / name)
        if len(arrays) != 1:
            raise InputMismatchError(f"the {what} file {name} holds {len(arrays)} arrays ({listing(arrays, show=str)}); "
                                     "give an .npy or an .npz of one array")
        return next(iter(arrays.values()))

    def feeds(self, name: str) -> dict[str, np.ndarray]:
        from ..io.arrays import load_arrays
        from .base import feeds_from_arrays

        if self.session is None:
            raise InputMismatchError(f"running the model on {name} needs the model; load the intervention "
                                     "set with a session")
        return feeds_from_arrays(load_arrays(self.folder / name), [v.name for v in self.session.inputs],
                                 self.folder / name)

    def run(self, where: str, name: str, tensor: str, feeds: Mapping[str, np.ndarray]) -> np.ndarray:
        if tensor not in self.session.tensor_names:
            raise InputMismatchError(f"{where}: no node of the model produces {tensor!r}")
        return self.session.record(dict(feeds), [tensor])[tensor]


def _slices(feeds: Mapping[str, np.ndarray], batch_size: int) -> Iterable[dict[str, np.ndarray]]:
    rows = max(len(a) for a in feeds.values())
    for start in range(0, rows, batch_size):
        yield {k: a[start:start + batch_size] for k, a in feeds.items()}


def block_mean(blocks: Iterable[np.ndarray], what: str) -> np.ndarray:
    """Each element's mean over the rows of ``blocks``, summed in float64.

    Args:
        blocks: arrays ``(rows_in_block, *row)`` of one row shape.
        what: the source, for the messages.

    Returns:
        float64 array, shape ``row``.

    Raises:
        InputMismatchError: no rows, rows of different shapes, or non-finite values.
    """
    total, count = None, 0
    for block in blocks:
        block = np.asarray(block)
        if total is None:
            total = np.zeros(block.shape[1:], np.float64)
        elif block.shape[1:] != total.shape:
            raise InputMismatchError(f"{what}: rows of shape {block.shape[1:]} after rows of shape {total.shape}")
        total += block.sum(axis=0, dtype=np.float64)
        count += len(block)
    if not count:
        raise InputMismatchError(f"{what} holds no rows to take a mean over")
    mean = total / count
    if not np.isfinite(mean).all():
        raise InputMismatchError(f"{what}: the mean holds NaN or infinity (so do some of its rows)")
    return mean


def reservoir(blocks: Iterable[np.ndarray], rows: int, seed: int, what: str) -> np.ndarray:
    """At most ``rows`` rows of ``blocks`` drawn uniformly without replacement, in one pass: each row
    gets a key from ``numpy.random.default_rng(seed)`` and the rows of the smallest keys are kept.

    Returns:
        array ``(min(rows, total), *row)``, the kept rows in the order they came.

    Raises:
        InputMismatchError: no rows.
    """
    rng = np.random.default_rng(seed)
    kept, keys = None, np.empty(0)
    for block in blocks:
        block = np.asarray(block)
        kept = block.copy() if kept is None else np.concatenate([kept, block])
        keys = np.concatenate([keys, rng.random(len(block))])
        if len(kept) > rows:
            keep = np.sort(np.argpartition(keys, rows - 1)[:rows])
            kept, keys = kept[keep], keys[keep]
    if kept is None or not len(kept):
        raise InputMismatchError(f"{what} holds no rows to draw from")
    return kept


def npz_blocks(path: Path, tensor: str, batch_size: int = 65536) -> Iterable[np.ndarray]:
    """A recorded tensor's rows, with numpy alone: from an ``.npz`` (the member named ``tensor``) or a
    folder of ``.npy`` files with its ``policyport.recording.json`` (mapped, read block by block).

    Raises:
        UnreadableFileError: neither, or no such tensor.
    """
    import json

    path = Path(path)
    if path.is_dir():
        meta = path / "policyport.recording.json"  # policyport.analysis.tables.META_FILE
        try:
            files = json.loads(meta.read_text(encoding="utf-8")).get("files", {})
        except (OSError, ValueError, AttributeError) as e:
            raise UnreadableFileError(f"{path} is not a recording folder ({meta.name}: {e})") from None
        if tensor not in files:
            raise UnreadableFileError(f"{path} holds no tensor {tensor!r}; it has {listing(files, show=str)}")
        values = np.load(path / files[tensor], mmap_mode="r", allow_pickle=False)
        for start in range(0, len(values), batch_size):
            yield np.array(values[start:start + batch_size])
        return
    from ..io.arrays import load_arrays

    arrays = load_arrays(path)
    if tensor not in arrays:
        raise UnreadableFileError(f"{path} holds no tensor {tensor!r}; it has {listing(arrays, show=str)}")
    yield arrays[tensor]
