"""What a file is: regular files opened without following a FIFO or device, an unreadable
file told apart from a folder, an empty file, a pickle, a text file (:func:`file_kind`);
JSON documents and sha256 digests read within the limits."""

from __future__ import annotations

import os
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO


from ..errors import ZIP_ERRORS, OptionError, UnreadableFileError


# ------------------------------------------------------------------------------------------- arrays

NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")


_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
_NOT_FILES = ((stat.S_ISDIR, "is a folder"), (stat.S_ISFIFO, "is a FIFO (named pipe)"),
              (stat.S_ISCHR, "is a character device"), (stat.S_ISBLK, "is a block device"),
              (stat.S_ISSOCK, "is a socket"))


def not_a_file(path: str | os.PathLike) -> str | None:
    """What ``path`` is when it exists but is not a regular file (``"is a character device"`` ...),
    or None: a regular file or nothing at all."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return next((what for test, what in _NOT_FILES if test(mode)), None)


def _open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading, refused unless it is a non-empty regular file.

    Opened without blocking (a FIFO with no writer would wait forever) and never as a controlling
    terminal; what it is is read from the open descriptor, so it cannot change in between.
    """
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        raise UnreadableFileError(f"{path}: no such file") from None
    except PermissionError:
        raise UnreadableFileError(f"{path}: permission denied") from None
    except OSError as e:
        raise UnreadableFileError(f"cannot open {path}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        for test, what in _NOT_FILES:
            if test(st.st_mode):
                raise UnreadableFileError(f"{path} {what}, not a file; expected an .npy or .npz file")
        if st.st_size == 0:
            raise UnreadableFileError(f"{path} is empty (0 bytes); expected an .npy or .npz file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _what_it_is(head: bytes, path: Path) -> str:
    """The rest of the message "PATH ..." for a file that is neither an npy nor an npz."""
    hint = "save arrays with numpy.save (.npy) or numpy.savez (.npz)"
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return (f"is a Python pickle, which can only be loaded by running code from it; policyport never "
                f"unpickles an input — {hint}")
    for magic, kind in _MAGICS:
        if head.startswith(magic):
            return f"is {kind}, not an .npy or .npz file; {hint}"
    text = _as_text(head)
    if text is not None:
        first = text.splitlines()[0] if text.strip() else ""
        kind = "a text file of comma-separated values (CSV)" if "," in first else "a text file"
        delimiter = ", delimiter=','" if "," in first else ""
        return (f"is {kind}, not an .npy or .npz file; convert it first, e.g. with numpy.save("
                f"{str(path.with_suffix('.npy'))!r}, numpy.loadtxt({str(path)!r}{delimiter}, dtype=numpy.float32, ndmin=2))")
    return (f"is not an .npy or .npz file: it starts with {head[:8]!r} (an .npy starts with "
            f"{NPY_MAGIC!r}, an .npz with b'PK'); {hint}")


def _as_text(head: bytes) -> str | None:
    """``head`` as text if it decodes as UTF-8 (a character cut at the end allowed) and holds no
    control characters besides whitespace."""
    for cut in range(4):
        try:
            text = head[: len(head) - cut].decode("utf-8")
            break
        except UnicodeDecodeError:
            continue
    else:
        return None
    return text if all(c.isprintable() or c in "\t\r\n\f" for c in text) else None


# ------------------------------------------------------------------------------------ what a file is

#: First bytes of formats told by their magic alone, and what each is.
_MAGICS = ((b"\x1f\x8b", "a gzip file"), (b"\x89HDF", "an HDF5 file"), (b"PAR1", "a Parquet file"))
#: How ``torch.save``'s legacy (non-zip) format starts: its magic number, pickled.
_TORCH_LEGACY = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19."
#: The names ``policyport convert`` tells each source kind of file by; another name needs ``--from``
#: (folders are told by what they hold).
_SOURCE_SUFFIXES = {"npz": (".npz",), "sb3": (".zip",), "torchscript": (".pt", ".pth"),
                    "state-dict": (".pt", ".pth", ".safetensors"), "keras": (".keras", ".h5", ".hdf5")}


@dataclass(frozen=True)
class FileKind:
    """What a file or folder is, for a message: ``what`` (``"a Stable-Baselines3 save"``),
    ``source``, the kind ``policyport convert --from`` reads it as, when a converter does, and
    ``runs_code``: loading it runs code it holds (a TorchScript file, a SavedModel), so converting
    it needs ``--trust``."""

    what: str
    source: str | None = None
    runs_code: bool = False


def file_kind(path: str | os.PathLike) -> FileKind | None:
    """What ``path`` is, told without loading it: from its first bytes, the member names of a zip
    archive (its central directory), or the files a folder holds. None for what none of them tells
    (an ONNX model among them, or a file that cannot be opened).

    Told apart: a Stable-Baselines3 save, a TorchScript file, a ``torch.save`` file (zip or legacy),
    a safetensors file, a Keras file (``.keras``, or HDF5 as ``.h5`` models are saved), an ``.npz``
    of arrays, a SavedModel folder, an RLlib checkpoint (folder, or legacy ``checkpoint-N`` pickle),
    an ``.npy`` array, a pickle, a gzip or Parquet file, another zip archive, a text file.
    """
    path = Path(path)
    if path.is_dir():
        if (path / "saved_model.pb").is_file():
            return FileKind("a TensorFlow SavedModel folder", "savedmodel", runs_code=True)
        if (path / "rllib_checkpoint.json").is_file() or any(path.glob("checkpoint-*")):
            return FileKind("an RLlib checkpoint folder", "rllib")
        return None
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        return None
    if head.startswith(_ZIP_MAGICS):
        return _zip_kind(path)
    if head.startswith(NPY_MAGIC):
        return FileKind("a NumPy array (.npy)")
    if head.startswith(_TORCH_LEGACY):
        return FileKind("a PyTorch file (torch.save's legacy format)", "state-dict")
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        name = path.name.lower()
        if name.startswith("checkpoint-") and name.split("-", 1)[1].isdigit():
            return FileKind("an RLlib checkpoint (a pickle)", "rllib")
        return FileKind("a Python pickle")
    if len(head) > 8 and head[8:9] == b"{" and 0 < int.from_bytes(head[:8], "little") < os.path.getsize(path):
        return FileKind("a safetensors file", "state-dict")
    if head.startswith(b"\x89HDF"):
        return FileKind("an HDF5 file (as Keras saves .h5 models)", "keras")
    for magic, what in _MAGICS:
        if head.startswith(magic):
            return FileKind(what)
    if head and _as_text(head) is not None:
        return FileKind("a text file")
    return None


def _zip_kind(path: Path) -> FileKind:
    """What a zip archive is, from its member names."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
    except ZIP_ERRORS:
        return FileKind("a damaged zip archive")
    base = {n.rsplit("/", 1)[-1] for n in names}
    if {"policy.pth", "data"} <= base:
        return FileKind("a Stable-Baselines3 save", "sb3")
    if {"data.pkl", "constants.pkl"} <= base:
        return FileKind("a TorchScript file", "torchscript", runs_code=True)
    if "data.pkl" in base:
        return FileKind("a PyTorch file (torch.save)", "state-dict")
    if "config.json" in base and any(n.endswith(".weights.h5") for n in base):
        return FileKind("a Keras file (.keras)", "keras")
    if names and all(n.endswith(".npy") for n in names):
        return FileKind("an .npz archive of arrays", "npz")
    return FileKind("a zip archive")


def check_not_a_source(path: str | os.PathLike) -> None:
    """Refuse ``path``, given where an ONNX model goes, when :func:`file_kind` tells what else it is,
    saying what it is and how to convert it (:func:`not_an_onnx_model`).

    Raises:
        UnreadableFileError: ``path`` is a file or folder of a kind :func:`file_kind` tells.
    """
    kind = file_kind(path)
    if kind is not None:
        raise UnreadableFileError(not_an_onnx_model(path, kind))




def not_an_onnx_model(path: str | os.PathLike, kind: FileKind) -> str:
    """The message for ``path``, a ``kind`` given where an ONNX model goes: what it is, and how to
    convert it when a converter reads it."""
    path = Path(path)
    if kind.source is None:
        return (f"{path} is {kind.what}, not an ONNX model; give an .onnx model or a folder written by "
                f"'policyport pack'")
    named = path.is_dir() or path.suffix.lower() in _SOURCE_SUFFIXES.get(kind.source, ()) or kind.source == "rllib"
    kind_flag = "" if named else f" --from {kind.source}"
    output = path.with_suffix(".onnx") if not path.is_dir() else path.parent / f"{path.name}.onnx"
    if kind.runs_code:
        return (f"{path} is {kind.what}, not an ONNX model, and loading it runs code it holds: if you trust it, "
                f"convert it first with policyport convert {path}{kind_flag} -o {output} --trust "
                "(pp.convert(..., trust=True) in Python)")
    return (f"{path} is {kind.what}, not an ONNX model: convert it first with "
            f"policyport convert {path}{kind_flag} -o {output} (pp.convert in Python)")



# ------------------------------------------------------------------------------------------ outputs


def check_not_a_stream(path: str | os.PathLike) -> None:
    """Refuse an output path that is a device, a FIFO or a socket (``/dev/null``, a named pipe), or
    a link to one: every output is written whole to a temporary file beside its path and then
    renamed into place, all of a command's outputs or none, which such a path cannot take (a rename
    would replace the device's entry itself). Writing to ``/dev/null`` to discard an output is
    refused like the rest rather than made a special case: write into a temporary folder instead.

    Raises:
        OptionError: such a path (exit 2, a value policyport refuses), saying what it is and what
            to give instead.
    """
    what = not_a_file(path)
    if what is None or what == "is a folder":
        return
    pipe = "FIFO" in what or "socket" in what
    instead = ("write to a path in a folder and read the output from there" if pipe else
               "write to a path in a folder instead (to discard the output, in a temporary folder you remove after)")
    raise OptionError(f"{path} {what}: policyport writes each output whole to a temporary file beside it and then "
                      f"renames it into place (all of a command's outputs or none), which a "
                      f"{'pipe' if pipe else 'device'} cannot take; {instead}")


def sha256_file(path: str | os.PathLike) -> str:
    """The sha256 hex digest of a source file, read in 1 MiB chunks (provenance for model metadata).

    Raises:
        UnreadableFileError: the file cannot be read.
    """
    import hashlib

    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    except OSError as e:
        raise UnreadableFileError(f"cannot read {path}: {e}") from e
    return digest.hexdigest()


# --------------------------------------------------------------------------------------------- onnx


def read_json(path: str | os.PathLike):
    """The JSON document in a file.

    Raises:
        UnreadableFileError: missing, unreadable or not JSON.
    """
    from .schema import load_json

    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise UnreadableFileError(f"{path}: no such file") from None
    except OSError as e:
        raise UnreadableFileError(f"{path} is not a readable JSON file: {e}") from e
    return load_json(data, str(path), error=UnreadableFileError)
