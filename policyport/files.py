"""Reading and writing the files policyport handles, safely.

Outputs are written atomically (a temporary file in the same folder, then ``os.replace``) and an
existing file is never overwritten unless asked. Arrays are loaded with ``allow_pickle=False``.
"""

from __future__ import annotations

import os
import tempfile
import zipfile
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from .errors import BadModelError, OutputExistsError, PolicyportError, UnreadableFileError, require


def check_writable(path: str | os.PathLike, force: bool = False) -> Path:
    """Refuse an output path that exists (unless ``force``), is not a regular file, or whose folder
    does not exist.

    Raises:
        OutputExistsError: the path exists and ``force`` is false, or it is a folder, a device, a
            FIFO or anything else that is not a regular file (never replaced, even with ``force``).
        UnreadableFileError: the parent folder does not exist.
    """
    path = Path(path)
    if path.exists() or path.is_symlink():
        if path.is_dir():
            raise OutputExistsError(f"{path} is a folder; give a file name for the output")
        if not path.is_file() or path.is_symlink():
            raise OutputExistsError(f"{path} is not a regular file (a device, FIFO or link); policyport never replaces one")
        if not force:
            raise OutputExistsError(f"{path} exists; overwrite it with --force (force=True in Python)")
    if not path.parent.is_dir():
        raise UnreadableFileError(f"cannot write {path}: folder {path.parent} does not exist")
    return path


def check_distinct(output: str | os.PathLike, *inputs: str | os.PathLike | None) -> None:
    """Refuse an output path that names one of the inputs (even with ``--force``).

    Raises:
        OutputExistsError: ``output`` resolves to the same file as an input.
    """
    out = Path(output).resolve()
    for given in inputs:
        if given is not None and Path(given).resolve() == out:
            raise OutputExistsError(f"the output {output} is also an input of this command; choose another path")


def _file_mode(path: Path) -> int:
    """The mode a new file gets from the umask, or the mode of the file it replaces."""
    if path.is_file():
        return path.stat().st_mode & 0o7777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_atomic(path: str | os.PathLike, write: Callable[[str], None], force: bool = False) -> Path:
    """Call ``write(tmp_path)`` then move the result onto ``path`` in one step.

    Nothing is left at ``path`` (nor a temporary file) if ``write`` raises. The file gets the mode
    of the file it replaces, or the one the umask gives a new file.

    Args:
        path: destination.
        write: writes the whole file at the temporary path it is given.
        force: allow replacing an existing regular file at ``path``.

    Raises:
        OutputExistsError: see :func:`check_writable`.
        UnreadableFileError: the folder does not exist or cannot be written.
    """
    path = check_writable(path, force)
    mode = _file_mode(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise UnreadableFileError(f"cannot write in {path.parent}: {e}") from e
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, mode)
        check_writable(path, force)  # nothing appeared there while we wrote
        os.replace(tmp, path)
    except PolicyportError:
        raise
    except OSError as e:
        raise UnreadableFileError(f"writing {path} failed: {e}; nothing was written") from e
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def write_npz(path: str | os.PathLike, arrays: Mapping[str, np.ndarray]) -> None:
    """An uncompressed ``.npz`` that ``numpy.load`` reads, keeping every key (with ``/``, or ``file``).

    Written entry by entry rather than with ``numpy.savez(**arrays)``, whose own parameter names
    (``file``, ``allow_pickle``) would collide with such keys.

    Raises:
        BadModelError: an object array, which could only be stored as a pickle.
    """
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for key, array in arrays.items():
            array = np.asarray(array)
            if array.dtype.hasobject:
                raise BadModelError(f"{key!r} is an object array ({array.dtype}); only plain numeric arrays are written")
            with zf.open(f"{key}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, array, allow_pickle=False)


def save_npz(path: str | os.PathLike, arrays: Mapping[str, np.ndarray], force: bool = False) -> Path:
    """Write ``arrays`` to an uncompressed ``.npz`` atomically (see :func:`write_npz`)."""
    return write_atomic(path, lambda tmp: write_npz(tmp, arrays), force)


def load_arrays(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Arrays from an ``.npz`` (every key) or a ``.npy`` (under the key ``""``), pickles refused.

    Raises:
        UnreadableFileError: missing file, not an npy/npz, or an object array (which would need pickle).
    """
    path = Path(path)
    if path.is_dir():
        raise UnreadableFileError(f"{path} is a folder; expected an .npy or .npz file")
    if not path.is_file():
        raise UnreadableFileError(f"{path}: no such file")
    try:
        loaded = np.load(path, allow_pickle=False)
        if isinstance(loaded, np.ndarray):
            return {"": loaded}
        with loaded:
            return {k: loaded[k] for k in loaded.files}
    except ValueError as e:
        if "pickle" in str(e).lower():
            raise UnreadableFileError(
                f"{path} holds object arrays, which numpy can only load by unpickling (running code "
                "from the file); policyport refuses that — save plain numeric arrays"
            ) from e
        raise UnreadableFileError(f"{path} is not a readable .npy/.npz file: {e}") from e
    except (OSError, EOFError, zipfile.BadZipFile) as e:
        raise UnreadableFileError(f"{path} is not a readable .npy/.npz file: {e}") from e


def read_json(path: str | os.PathLike):
    """The JSON document in a file.

    Raises:
        UnreadableFileError: missing, unreadable or not JSON.
    """
    import json

    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise UnreadableFileError(f"{path}: no such file") from None
    except (OSError, ValueError) as e:
        raise UnreadableFileError(f"{path} is not a readable JSON file: {e}") from e


def load_onnx(path: str | os.PathLike):
    """An ``onnx.ModelProto`` from an ``.onnx`` file (external data included) or a packed folder.

    Raises:
        UnreadableFileError: missing, unparsable, or without a graph (an empty file parses as one).
        MissingDependencyError: onnx is not installed.
    """
    onnx = require("onnx", "onnx", "reading an .onnx file")
    path = Path(path)
    if path.is_dir():
        if not (path / "model.onnx").is_file():
            raise UnreadableFileError(f"{path} is a folder, not an .onnx file (nor a packed folder with model.onnx)")
        path = path / "model.onnx"
    if not path.is_file():
        raise UnreadableFileError(f"{path}: no such file")
    try:
        model = onnx.load(str(path))
    except Exception as e:  # protobuf DecodeError, onnx ValidationError, OSError ...
        raise UnreadableFileError(f"{path} is not a readable ONNX model: {e}") from e
    if not model.graph.output:
        raise UnreadableFileError(f"{path} is not an ONNX model: it holds no graph with outputs")
    return model


def save_onnx(path: str | os.PathLike, model, force: bool = False) -> Path:
    """Serialize ``model`` to ``path`` atomically."""
    data = model.SerializeToString()

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(data)

    return write_atomic(path, write, force)


def ensure_model(model):
    """An ``onnx.ModelProto`` from a ModelProto or a path to an ``.onnx`` file.

    Raises:
        BadModelError: ``model`` is neither.
    """
    if isinstance(model, (str, os.PathLike)):
        return load_onnx(model)
    if type(model).__name__ == "ModelProto":
        return model
    raise BadModelError(f"expected an onnx.ModelProto or a path to an .onnx file, got {type(model).__name__}")
