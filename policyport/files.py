"""Reading and writing the files policyport handles, safely and within limits.

* **Limits** (:class:`Limits`, :func:`limits`): what one file or model may cost. Every size a file
  declares (an array header, a zip member, an ONNX tensor's dims) is checked against the actual
  bytes and against these limits before anything that large is allocated.
* **Arrays** (:func:`load_arrays`, :func:`read_npz`, :func:`read_npy`): ``.npy``/``.npz`` read with
  their headers checked first; pickles, object, structured and wide raw-byte dtypes refused; an
  unreadable file is told apart from a folder, a FIFO or device, an empty file, a pickle, a text file.
* **Outputs** (:func:`write_outputs`, :func:`write_atomic`): all of a command's files or none. Each is
  written to a temporary file in its folder, which is opened once: creating, writing and renaming
  all happen relative to that one descriptor, so swapping the folder for a symlink meanwhile cannot
  redirect an output, and no temporary file survives a failure (Ctrl-C and SIGTERM included). An
  existing file is never replaced unless asked. What a killed writer (SIGKILL) left behind is
  removed by the next write to the same folder (:func:`remove_stale_temporaries`).
* **Output folders** (:class:`FolderBuild`): a folder of files built under a temporary name beside
  its destination and renamed into place, every step relative to descriptors as for single files.
* **ONNX** (:func:`load_onnx`, :func:`ensure_model`): every initializer and tensor attribute must hold
  exactly the data its dims call for; external data is size-checked before it is read.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import io
import math
import os
import re
import shutil
import stat
import sys
import time
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, Mapping

import numpy as np

from .folder import folder_entries, folder_entries_at
from .errors import (ArgumentTypeError, BadModelError, InputMismatchError, LimitExceededError, NoSpaceError,
                     OptionError, OutputExistsError, PolicyportError, UnreadableFileError, check_argument, require)

# ------------------------------------------------------------------------------------------- limits

KIB, MIB, GIB, TIB = 1 << 10, 1 << 20, 1 << 30, 1 << 40

#: Environment variables that set the limits (a size: ``4G``, ``512M``, ``1.5GiB``, ``1000000``).
ENV_ARRAY_BYTES = "POLICYPORT_MAX_ARRAY_BYTES"
ENV_MEMORY = "POLICYPORT_MAX_MEMORY"
ENV_NODES = "POLICYPORT_MAX_NODES"
ENV_NPZ_ARRAYS = "POLICYPORT_MAX_NPZ_ARRAYS"

DEFAULT_ARRAY_BYTES = 1 * GIB
DEFAULT_NODES = 200_000
DEFAULT_NPZ_ARRAYS = 4096


@dataclass(frozen=True)
class Limits:
    """What policyport lets one file, one model or one command cost.

    Attributes:
        array_bytes: the most bytes the arrays of one file may take once read — an ``.npy``, all
            members of an ``.npz`` together, the external data of an ONNX model together — and the
            most one tensor may take that the numpy backend sizes from a value in the model
            (ConstantOfShape, Expand, Tile, Range). Default 1 GiB; ``POLICYPORT_MAX_ARRAY_BYTES``;
            the CLI's ``--max-bytes``.
        memory_bytes: the most memory a command may be computed to need before it starts (drawn
            observations, recorded activations). ``None`` (default): what this process can still
            get, measured when asked (:func:`available_memory`); ``POLICYPORT_MAX_MEMORY``.
        nodes: the most nodes a graph may have on the numpy backend (compiling its plan takes time
            and memory in proportion). Default 200,000; ``POLICYPORT_MAX_NODES``.
        npz_arrays: the most arrays (zip members) one ``.npz`` may hold: reading, checking and
            reporting each costs time and memory however small it is. Default 4,096;
            ``POLICYPORT_MAX_NPZ_ARRAYS``.
    """

    array_bytes: int = DEFAULT_ARRAY_BYTES
    memory_bytes: int | None = None
    nodes: int = DEFAULT_NODES
    npz_arrays: int = DEFAULT_NPZ_ARRAYS


_SET_LIMITS: contextvars.ContextVar[dict] = contextvars.ContextVar("policyport_limits", default={})


def limits() -> Limits:
    """The limits in force: those set with :func:`using_limits`, else the environment's, else the defaults.

    Raises:
        InputMismatchError: an environment variable that is not a size (or count).
    """
    found: dict[str, int | None] = {}
    for field, env in (("array_bytes", ENV_ARRAY_BYTES), ("memory_bytes", ENV_MEMORY), ("nodes", ENV_NODES),
                       ("npz_arrays", ENV_NPZ_ARRAYS)):
        text = os.environ.get(env)
        if text:
            try:
                found[field] = parse_size(text)
            except ValueError as e:
                raise InputMismatchError(f"environment variable {env}={text!r}: {e}") from None
    found.update(_SET_LIMITS.get())
    return Limits(**found)


@contextlib.contextmanager
def using_limits(**values: int | None) -> Iterator[Limits]:
    """Set limits (fields of :class:`Limits`) for the code run inside the ``with`` block.

    Example: ``with using_limits(array_bytes=8 * GIB): pp.load(...)``.
    """
    unknown = set(values) - {f.name for f in dataclasses.fields(Limits)}
    if unknown:
        raise ArgumentTypeError(f"unknown limit(s) {sorted(unknown)}; the limits are "
                                f"{[f.name for f in dataclasses.fields(Limits)]}")
    for name, value in values.items():
        check_argument(value, f"the limit {name}", "int", 0, none=name == "memory_bytes")
    token = _SET_LIMITS.set({**_SET_LIMITS.get(), **values})
    try:
        yield limits()
    finally:
        _SET_LIMITS.reset(token)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?(?:[eE]\d+)?)\s*(?:([KMGT])(i?)B?|B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """A size in bytes from text: ``1000000``, ``1e9``, ``512K``, ``4G``, ``1.5GiB`` (binary: K = 1024),
    ``4GB`` (decimal: 10**9).

    Raises:
        ValueError: not a non-negative size.
    """
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"{text!r} is not a size; write e.g. 4G, 512M, 1.5GiB or 1000000 (bytes)")
    number, unit, binary = float(m[1]), (m[2] or "").upper(), m[3]
    if unit:
        power = "KMGT".index(unit) + 1
        decimal = text.strip().upper().endswith("B") and not binary
        number *= (1000 if decimal else 1024) ** power
    if not math.isfinite(number):
        raise ValueError(f"{text!r} is not a finite size")
    return int(number)


def format_size(nbytes: int) -> str:
    """``3.64 TiB``, ``512 MiB``, ``72 B``, ``29,104 TiB``: a byte count for people (binary units)."""
    for unit, size in (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if nbytes >= size:
            value = nbytes / size
            return f"{value:,.0f} {unit}" if value >= 1000 else f"{value:.3g} {unit}"
    return f"{nbytes} B"


def check_free_space(path: str | os.PathLike, nbytes: int, what: str) -> None:
    """Refuse an output of ``nbytes`` bytes that the file system of ``path``'s folder has no room for.

    Args:
        path: the output.
        nbytes: the bytes it will take.
        what: the subject of the message, e.g. ``"the recording (100,000 rows of 61,440 bytes)"``.

    Raises:
        NoSpaceError: naming both sizes; nothing has been written.
    """
    import shutil

    folder = Path(path).parent
    try:
        free = shutil.disk_usage(folder).free
    except OSError:  # no answer: writing will tell
        return
    if nbytes > free:
        raise NoSpaceError(
            f"{what} would take {format_size(nbytes)} ({nbytes:,} bytes), but the file system of {folder} has "
            f"{format_size(free)} ({free:,} bytes) free; nothing was written — free some space, write it elsewhere, "
            "or record fewer tensors (--tensors) or rows"
        )


def physical_memory() -> int:
    """The machine's physical memory in bytes (a very large number where it cannot be told)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def _suggest(nbytes: int) -> str:
    """A round size at or above ``nbytes`` to suggest as a new limit: ``4G``, ``300M``."""
    if nbytes >= GIB:
        return f"{math.ceil(nbytes / GIB)}G"
    return f"{max(1, math.ceil(nbytes / MIB))}M"


def check_array_bytes(nbytes: int, what: str, limit: int | None = None, *,
                      purpose: str = "arrays read from a file") -> None:
    """Refuse ``nbytes`` of arrays above the array limit.

    Args:
        nbytes: the bytes the arrays would take.
        what: the subject of the message, e.g. ``"obs.npz: array 'obs' (float32, shape (10, 4))"``.
        limit: the limit; default ``limits().array_bytes``.
        purpose: what the limit is for, in the message.

    Raises:
        LimitExceededError: naming the size, the limit and how to raise it.
    """
    limit = limits().array_bytes if limit is None else limit
    if nbytes > limit:
        physical = physical_memory()
        if nbytes > physical:
            advice = f"more than this machine's {format_size(physical)} of memory, too"
        else:
            advice = (f"if you trust it and have the memory, raise the limit with --max-bytes {_suggest(nbytes)} "
                      f"(or {ENV_ARRAY_BYTES}={_suggest(nbytes)})")
        raise LimitExceededError(
            f"{what} would take {format_size(nbytes)} ({nbytes:,} bytes), above the limit of {format_size(limit)} "
            f"for {purpose}; {advice}"
        )


#: The most memory ``json.loads`` takes per byte of the text it parses: 25 (measured on
#: ``[[],[],...]``, the text densest in objects: 64 MiB of it take 1.6 GB parsed).
JSON_BYTES = 25


def check_json_bytes(nbytes: int, what: str) -> None:
    """Refuse a JSON document of ``nbytes`` bytes (a config, a description) that, parsed, could take
    more than the array limit (:data:`JSON_BYTES` per byte of text), before it is read.

    Raises:
        LimitExceededError: naming the document, what parsing it could take and the limit.
    """
    check_array_bytes(nbytes * JSON_BYTES, f"{what} ({nbytes:,} bytes of JSON, parsed)",
                      purpose="a document parsed from a file")


def check_tensor_shape(shape, dtype) -> tuple[int, ...]:
    """``shape`` as a tuple of ints, checked before an array of it is allocated.

    For ops whose output size is not bounded by their inputs' sizes but comes from a value, an
    attribute or an equation in the model (ConstantOfShape, Expand, Tile, Range, RandomNormal,
    Multinomial, Gather, Einsum, padded Conv and pooling): the size is computed with Python
    integers, so no product can overflow.

    Raises:
        ValueError: a negative dimension.
        LimitExceededError: the array would take more than ``limits().array_bytes``.
    """
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"negative dimension in the output shape {dims}")
    dtype = np.dtype(dtype)
    check_array_bytes(math.prod(dims) * dtype.itemsize, f"its output ({dtype.name}, shape {dims})",
                      purpose="one tensor sized from a value in the model")
    return dims


def available_memory() -> int:
    """Bytes this process can still allocate, roughly: the system's available memory (Linux
    ``MemAvailable``; elsewhere the physical memory), and no more than the address-space limit
    (``RLIMIT_AS``) less what the process has mapped already."""
    available = None
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    available = int(line.split()[1]) * KIB
                    break
    except (OSError, ValueError, IndexError):
        pass
    if available is None:
        available = physical_memory()
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            with open("/proc/self/statm", "rb") as f:
                mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            available = min(available, max(soft - mapped, 0))
    except (ImportError, OSError, ValueError, IndexError):
        pass
    return available


def memory_limit() -> int:
    """The most memory a command may be computed to need: the limit set (:class:`Limits`
    ``.memory_bytes``), else what this process can still get (:func:`available_memory`)."""
    set_limit = limits().memory_bytes
    return available_memory() if set_limit is None else set_limit


def check_memory(nbytes: int, what: str, advice: str | None = None) -> None:
    """Refuse to start work that is computed to need ``nbytes`` when the memory limit is lower.

    Args:
        nbytes: the bytes the work needs.
        what: what needs it, e.g. ``"verifying 100,000,000 samples (1 input, 7 tensors, 2 backends)"``.
        advice: what to do instead; default: use fewer samples or a smaller input, or a machine
            with more memory.

    Raises:
        LimitExceededError: naming the size needed and the memory there is.
    """
    set_limit = limits().memory_bytes
    limit = memory_limit()
    if nbytes > limit:
        source = (f"the limit {ENV_MEMORY} sets" if set_limit is not None
                  else "the memory this process can get")
        advice = advice or "use fewer samples or a smaller input, or a machine with more memory"
        raise LimitExceededError(
            f"{what} needs about {format_size(nbytes)}, more than {format_size(limit)} ({source}); "
            f"{advice} (or set {ENV_MEMORY})"
        )


# ------------------------------------------------------------------------------------------- arrays

NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
#: Raw-byte elements numpy writes for the ml_dtypes types (bfloat16 is ``|V2``); wider ones are refused.
MAX_RAW_ITEMSIZE = 2


def load_arrays(path: str | os.PathLike, *, max_bytes: int | None = None) -> dict[str, np.ndarray]:
    """Arrays from an ``.npz`` (every key) or an ``.npy`` (under the key ``""``), checked before reading.

    The file's kind is told from its first bytes, not its name. Every array header is read first:
    its dtype must be a plain one (numbers, bools, strings, or raw 1- or 2-byte elements, as numpy
    stores bfloat16); its shape times the item size must fit in the bytes the file (or zip member)
    actually holds; and the arrays together must fit in ``max_bytes`` — for an ``.npz`` the sum of
    the members' uncompressed sizes is checked before anything is decompressed.

    Args:
        path: the file.
        max_bytes: the most the arrays may take; default :func:`limits` ``.array_bytes`` (1 GiB).

    Returns:
        key -> array, in the file's order.

    Raises:
        UnreadableFileError: missing; a folder, FIFO, device or socket; empty; a pickle, a text
            (CSV) file or anything else that is not an npy/npz; damaged or truncated; an object,
            structured or wide raw-byte array.
        LimitExceededError: the arrays would take more than ``max_bytes``.
    """
    path = Path(path)
    with _open_regular(path) as f:
        head = f.read(len(NPY_MAGIC))
        f.seek(0)
        if head == NPY_MAGIC:
            size = os.fstat(f.fileno()).st_size
            return {"": read_npy(f, str(path), size, max_bytes=max_bytes)}
        if head[:4] in _ZIP_MAGICS:
            return read_npz(f, str(path), max_bytes=max_bytes)
        raise UnreadableFileError(f"{path} {_what_it_is(f.read(4096), path)}")


def read_npz(file: BinaryIO, where: str, *, max_bytes: int | None = None,
             max_arrays: int | None = None) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` open as a seekable binary file, with the checks of :func:`load_arrays`.

    Args:
        file: the archive (a file, or ``io.BytesIO`` of its bytes).
        where: how to name the file in messages (its path).
        max_bytes: as for :func:`load_arrays`.
        max_arrays: the most arrays it may hold; default :func:`limits` ``.npz_arrays`` (4,096).

    Raises:
        As :func:`load_arrays`; also for a member that is not an ``.npy`` or a name held twice.
    """
    limit = limits().array_bytes if max_bytes is None else max_bytes
    try:
        with zipfile.ZipFile(file) as zf:
            members = zf.infolist()
            check_npz_arrays(len(members), where, max_arrays)
            total = sum(m.file_size for m in members)
            check_array_bytes(total, f"the arrays of {where}", limit)
            arrays: dict[str, np.ndarray] = {}
            for m in members:
                key = m.filename[:-4] if m.filename.endswith(".npy") else None
                if key is None or m.is_dir():
                    raise UnreadableFileError(
                        f"{where} holds {m.filename!r}, which is not an .npy array; an .npz holds arrays only")
                if key in arrays:
                    raise UnreadableFileError(f"{where} holds two arrays named {key!r}")
                label = f"{where}: array {key!r}"
                with zf.open(m) as member:
                    _check_npy_header(member, label, m.file_size, limit)
                with zf.open(m) as member:
                    arrays[key] = np.lib.format.read_array(member, allow_pickle=False)
            return arrays
    except PolicyportError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, OSError, EOFError, RuntimeError,
            NotImplementedError, ValueError) as e:  # damaged, encrypted, unknown compression ...
        raise UnreadableFileError(f"{where} is a damaged .npz file: {e}") from e


def check_npz_arrays(count: int, where: str, limit: int | None = None) -> None:
    """Refuse an ``.npz`` of more than ``limit`` (default ``limits().npz_arrays``) arrays, before any is read.

    Raises:
        LimitExceededError: naming the count, the limit and how to raise it.
    """
    limit = limits().npz_arrays if limit is None else limit
    if count > limit:
        raise LimitExceededError(
            f"{where} holds {count:,} arrays, more than the limit of {limit:,} arrays in one .npz; if you trust it, "
            f"raise the limit with {ENV_NPZ_ARRAYS}={count}"
        )


def read_npy(file: BinaryIO, where: str, size: int, *, max_bytes: int | None = None) -> np.ndarray:
    """The array of an ``.npy`` open as a seekable binary file of ``size`` bytes (read from its
    current position), checked as :func:`load_arrays` checks one.

    Raises:
        As :func:`load_arrays`.
    """
    start = file.tell()
    _check_npy_header(file, where, size - start, limits().array_bytes if max_bytes is None else max_bytes)
    file.seek(start)
    try:
        return np.lib.format.read_array(file, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise UnreadableFileError(f"{where} is a damaged .npy file: {e}") from e


def _check_npy_header(file: BinaryIO, where: str, size: int | None,
                      limit: int) -> tuple[np.dtype, tuple, int, bool]:
    """Parse an npy header at the file's position (nothing more is read) and check it against the
    ``size`` bytes there (``None``: not known yet) and the limit.

    Returns:
        dtype, shape, the bytes of data the header describes, and whether it is in Fortran order.
    """
    fmt = np.lib.format
    start = file.tell()
    try:
        version = fmt.read_magic(file)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(file)
        elif version == (2, 0):
            shape, fortran, dtype = fmt.read_array_header_2_0(file)
        else:  # 3.0 (a UTF-8 header) has no public reader
            shape, fortran, dtype = fmt._read_array_header(file, version)
        header = file.tell() - start
    except Exception as e:  # noqa: BLE001 - numpy's parser raises ValueError, SyntaxError, TypeError ... on hostile bytes
        raise UnreadableFileError(f"{where} has a damaged .npy header: {type(e).__name__}: {e}") from e
    if dtype.hasobject:
        raise UnreadableFileError(
            f"{where} is an object array ({dtype}), which numpy can only load by unpickling it (running code "
            "from the file); policyport refuses that — save plain numeric arrays"
        )
    if dtype.names is not None or dtype.subdtype is not None:
        raise UnreadableFileError(f"{where} is a structured array (dtype {dtype}); policyport reads plain arrays only")
    if dtype.kind == "V" and dtype.itemsize > MAX_RAW_ITEMSIZE:
        raise UnreadableFileError(
            f"{where} has elements of {dtype.itemsize:,} raw bytes (dtype {dtype.str}); policyport reads plain "
            f"arrays only (raw elements of at most {MAX_RAW_ITEMSIZE} bytes, as numpy stores bfloat16)"
        )
    if any(d < 0 for d in shape):
        raise UnreadableFileError(f"{where} has a damaged .npy header: shape {shape}")
    nbytes = math.prod(shape) * dtype.itemsize
    held = None if size is None else max(size - header, 0)
    if held is not None and nbytes > held:
        raise UnreadableFileError(
            f"{where} is truncated or damaged: its header describes {dtype.name} {shape} "
            f"({format_size(nbytes)}), but it holds {format_size(held)} of data"
        )
    check_array_bytes(nbytes, f"{where} ({dtype.name}, shape {shape})", limit)
    return dtype, shape, nbytes, bool(fortran)


#: The most bytes of an .npy header decompressed before it is parsed: numpy reads headers of at most
#: 10,000 bytes (``max_header_size`` of ``numpy.lib.format``) after a 12-byte preamble.
_NPY_HEADER_BYTES = 1 << 16


def read_npy_zlib(data: bytes, where: str, *, max_bytes: int | None = None) -> np.ndarray:
    """The array of an ``.npy`` file compressed with zlib (as RLlib serialises arrays,
    ``ray/rllib/utils/serialization.py``), checked as :func:`load_arrays` checks one.

    Only the header is decompressed first; its dtype and shape are checked against the limit, and
    then the data it describes is decompressed straight into the array, no more than that, so a
    small stream that inflates to gigabytes never does.

    Args:
        data: the zlib stream.
        where: how to name the array in messages.
        max_bytes: the most the array may take; default :func:`limits` ``.array_bytes`` (1 GiB).

    Returns:
        The array, in the byte order the file stores.

    Raises:
        UnreadableFileError: not a zlib stream, a damaged or truncated .npy, an object, structured or
            wide raw-byte array.
        LimitExceededError: the header describes an array larger than ``max_bytes``.
    """
    limit = limits().array_bytes if max_bytes is None else max_bytes
    inflate = zlib.decompressobj()
    try:
        head = inflate.decompress(data, _NPY_HEADER_BYTES)
        header = io.BytesIO(head)
        dtype, shape, nbytes, fortran = _check_npy_header(header, where, None, limit)
        raw = np.empty(nbytes, np.uint8)
        got = head[header.tell():header.tell() + nbytes]
        raw[:len(got)] = np.frombuffer(got, np.uint8)
        filled = len(got)
        while filled < nbytes:
            chunk = inflate.decompress(inflate.unconsumed_tail, min(nbytes - filled, _INFLATE_CHUNK))
            if not chunk:
                break
            raw[filled:filled + len(chunk)] = np.frombuffer(chunk, np.uint8)
            filled += len(chunk)
    except zlib.error as e:
        raise UnreadableFileError(f"{where} is not a zlib-compressed .npy file: {e}") from e
    if filled < nbytes:
        raise UnreadableFileError(f"{where} is truncated or damaged: its header describes {dtype.name} {shape} "
                                  f"({format_size(nbytes)}), but it holds {format_size(filled)} of data")
    if dtype.itemsize == 0:
        return np.empty(shape, dtype)
    return raw.view(dtype).reshape(shape, order="F" if fortran else "C")


#: Bytes decompressed at a time into an array (:func:`read_npy_zlib`).
_INFLATE_CHUNK = 1 << 20


def read_zip_member(zf: zipfile.ZipFile, name: str, where: str, *, max_bytes: int | None = None) -> bytes:
    """The bytes of member ``name`` of an open zip archive, the size the archive declares for it
    checked against the limit before anything is decompressed (:mod:`zipfile` returns no more
    than that size, whatever the compressed data inflates to).

    Args:
        zf: the archive.
        name: the member.
        where: how to name the archive in messages (its path).
        max_bytes: the most the member may take; default :func:`limits` ``.array_bytes`` (1 GiB).

    Returns:
        The member's bytes.

    Raises:
        UnreadableFileError: no such member.
        LimitExceededError: the member declares more than ``max_bytes``.
    """
    try:
        info = zf.getinfo(name)
    except KeyError:
        raise UnreadableFileError(f"{where} lacks the member {name}") from None
    check_array_bytes(info.file_size, f"{where}: its member {name}", max_bytes, purpose="data read from a file")
    return zf.read(info)


def check_zip_members(zf: zipfile.ZipFile, where: str, *, max_bytes: int | None = None) -> None:
    """Refuse an archive whose members together declare more than the limit, before any is read
    (for readers that hand the archive to a library that reads its members whole: ``torch.load``).

    Args:
        zf: the archive.
        where: how to name it in messages (its path).
        max_bytes: the most the members may take together; default :func:`limits` ``.array_bytes``.

    Raises:
        LimitExceededError: naming the total, the limit and how to raise it.
    """
    total = sum(info.file_size for info in zf.infolist())
    check_array_bytes(total, f"the members of {where}", max_bytes, purpose="data read from a file")


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
    except (zipfile.BadZipFile, OSError, ValueError):
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


def check_model_folder(path: str | os.PathLike) -> None:
    """Refuse a folder given where a model goes unless ``policyport pack`` wrote it (it holds
    ``policy.json``): a source's folder (a SavedModel, an RLlib checkpoint) is named as what it is,
    with how to convert it (:func:`check_not_a_source`); any other folder is said to be neither an
    ``.onnx`` model nor a packed folder, naming the ``.onnx`` files it holds. Anything else passes.

    Raises:
        UnreadableFileError: such a folder (exit 3).
    """
    from .folder import POLICY_FILE, not_packed

    path = Path(path)
    if path.is_dir() and not (path / POLICY_FILE).exists() and not (path / POLICY_FILE).is_symlink():
        check_not_a_source(path)
        raise UnreadableFileError(not_packed(path))


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


def check_writable(path: str | os.PathLike, force: bool = False) -> Path:
    """Refuse an output path that exists (unless ``force``), is not a regular file, or whose folder
    does not exist.

    Raises:
        OptionError: a device, FIFO or socket (:func:`check_not_a_stream`).
        OutputExistsError: the path exists and ``force`` is false, or it is a folder, a link or
            anything else that is not a regular file (never replaced, even with ``force``).
        UnreadableFileError: the parent folder does not exist or is a file; a name the file system
            refuses (too long).
    """
    path = Path(path)
    try:
        exists = path.exists() or path.is_symlink()
    except OSError as e:  # a name too long for the file system, a loop of links ...
        raise UnreadableFileError(f"cannot write {path}: {e.strerror or e}") from None
    check_not_a_stream(path)
    if exists:
        if path.is_dir():
            raise OutputExistsError(f"{path} is a folder; give a file name for the output")
        if not path.is_file() or path.is_symlink():
            raise OutputExistsError(f"{path} is not a regular file (a device, FIFO or link); policyport never replaces one")
        if not force:
            raise OutputExistsError(f"{path} exists; overwrite it with --force (force=True in Python)")
    check_parent(path)
    return path


def check_parent(path: Path) -> None:
    """Refuse an output whose parent is not an existing folder, saying which it is.

    Raises:
        UnreadableFileError: the parent does not exist, or is a file.
    """
    if not path.parent.is_dir():
        there = "is not a folder" if path.parent.exists() else "does not exist"
        raise UnreadableFileError(f"cannot write {path}: {path.parent} {there}")


def check_distinct(output: str | os.PathLike, *inputs: str | os.PathLike | None) -> None:
    """Refuse an output path that names one of the inputs (even with ``--force``).

    Raises:
        OutputExistsError: ``output`` resolves to the same file as an input.
    """
    out = Path(output).resolve()
    for given in inputs:
        if given is not None and Path(given).resolve() == out:
            raise OutputExistsError(f"the output {output} is also an input of this command; choose another path")


Writer = Callable[[BinaryIO], None]

#: The outputs moved into place since the innermost :func:`noting_placed` began (None outside one).
_placed: list[Path] | None = None


@contextlib.contextmanager
def noting_placed() -> Iterator[list[Path]]:
    """Within the block, every output moved into place, complete (a file of :func:`write_outputs`,
    a folder its writer notes with :func:`note_placed`), is appended to the list it yields, so that
    a command that ends early afterwards (a signal, an error) can say what it wrote: see
    :func:`written` and :func:`ended_after`. A block within another notes into both."""
    global _placed
    outer, _placed = _placed, []
    try:
        yield _placed
    finally:
        placed, _placed = _placed, outer
        if outer is not None:
            outer.extend(placed)


def note_placed(*paths: str | os.PathLike) -> None:
    """Note ``paths`` as moved into place, complete (see :func:`noting_placed`; nothing outside one)."""
    if _placed is not None:
        _placed.extend(Path(p) for p in paths)


def unnote_placed(paths: list[Path]) -> None:
    """Take back the last :func:`note_placed` of ``paths``, when it was their last (their placing
    was undone)."""
    if paths and _placed is not None and _placed[-len(paths):] == paths:
        del _placed[-len(paths):]


def _paths_text(placed: list[Path]) -> str:
    names = [str(p) for p in placed]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def written(placed: list[Path]) -> str:
    """What a command that failed had written, for its message: ``"nothing was written"``, or
    ``"out.npz had been written and is complete"`` (``placed`` from :func:`noting_placed`)."""
    if not placed:
        return "nothing was written"
    return f"{_paths_text(placed)} had been written and {'is' if len(placed) == 1 else 'are'} complete"


def written_sentence(placed: list[Path]) -> str:
    """:func:`written` as a sentence after an error's own: ``"Nothing was written."``, or ``"It came
    after writing out.npz, which is complete."``."""
    return f"{ended_after('It came', placed)}." if placed else "Nothing was written."


def ended_after(word: str, placed: list[Path]) -> str:
    """The message of a command ended by a signal (``word``: ``"terminated"``, ``"interrupted"``):
    ``"terminated; nothing was written"`` (every output in progress removed), or
    ``"terminated after writing out.npz, which is complete"`` when outputs were already in place."""
    if not placed:
        return f"{word}; nothing was written"
    return f"{word} after writing {_paths_text(placed)}, which {'is' if len(placed) == 1 else 'are'} complete"


#: Whether this platform can create, rename and remove files relative to a folder's descriptor
#: (POSIX); elsewhere (Windows) outputs are written by path, with the same all-or-none rule.
_AT_FOLDER = all(f in os.supports_dir_fd for f in (os.open, os.stat, os.rename, os.unlink))


@dataclass
class _Output:
    """One file of :func:`write_outputs` on its way: its folder (opened once) and the names in it.

    Every file operation goes through a method that works relative to the folder's descriptor.
    """

    path: Path
    folder: int | None  # the descriptor; None where the platform has none (paths are used)
    tmp: str | None = None
    backup: str | None = None
    placed: bool = False
    lock: int | None = None  # a descriptor of the temporary file, holding its lock until the end

    @property
    def name(self) -> str:
        return self.path.name

    def at(self, name: str) -> str:
        return name if self.folder is not None else str(self.path.parent / name)

    def stat(self) -> os.stat_result | None:
        """The output's own entry in the folder (a symlink itself, not what it points to), if any."""
        try:
            return os.stat(self.at(self.name), dir_fd=self.folder, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def create(self, name: str, flags: int) -> int:
        return os.open(self.at(name), flags, 0o600, dir_fd=self.folder)

    def link(self, src: str, dst: str) -> None:
        os.link(self.at(src), self.at(dst), src_dir_fd=self.folder, dst_dir_fd=self.folder, follow_symlinks=False)

    def rename(self, src: str, dst: str) -> None:
        os.replace(self.at(src), self.at(dst), src_dir_fd=self.folder, dst_dir_fd=self.folder)

    def unlink(self, name: str) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.at(name), dir_fd=self.folder)

    def close(self) -> None:
        for fd in (self.lock, self.folder):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.lock = self.folder = None


def write_outputs(outputs: Mapping[str | os.PathLike, Writer], force: bool = False) -> list[Path]:
    """Write several files together: every one of them, or none.

    Each ``write(file)`` writes one whole file into the binary file object it is given (a temporary
    file in the output's folder). Only when every file is complete are they renamed into place; if a
    rename fails, those already renamed are undone (a file replaced with ``force`` is restored). Each
    output's folder is opened once, and the temporary file is created, written, checked and renamed
    relative to that descriptor, so a folder swapped for a symlink meanwhile cannot redirect it. On
    any failure — an exception in a writer, a full disk, Ctrl-C or SIGTERM — no temporary file is
    left and every output path is as it was. A new file gets the mode the umask gives; a replaced
    one keeps its mode. Once every file is in place, they are noted (:func:`noting_placed`).

    Args:
        outputs: destination -> writer, in the order they are renamed into place.
        force: allow replacing existing regular files.

    Returns:
        The destinations.

    Raises:
        OutputExistsError: see :func:`check_writable`; an output named twice; or an output that
            appeared while the files were written.
        UnreadableFileError: a folder that does not exist or cannot be written.
    """
    paths = [check_writable(p, force) for p in outputs]
    try:
        resolved = {p.resolve() for p in paths}
    except OSError as e:  # a folder on the way swapped or removed while it is read
        raise UnreadableFileError(f"cannot write {e.filename or paths[0]}: {e.strerror or e}") from None
    if len(resolved) != len(paths):
        raise OutputExistsError(f"the outputs {[str(p) for p in paths]} name one file twice; give each its own path")
    pending: list[_Output] = []
    try:
        for path in paths:  # every folder opened before anything is written
            pending.append(_Output(path, _open_folder(path.parent)))
        cleaned: set[tuple[int, int]] = set()
        for out in pending:  # what killed writers left in each folder, once per folder
            if out.folder is not None and (key := _identity(os.fstat(out.folder))) not in cleaned:
                cleaned.add(key)
                remove_stale_temporaries(out.folder)
        for out, write in zip(pending, outputs.values()):
            _write_temp(out, write)
        for out in pending:
            _check_target(out, force)  # nothing appeared there while we wrote
        for out in pending:
            _place(out)
        note_placed(*paths)
    except BaseException as e:
        _undo(pending)
        unnote_placed(paths)
        for out in pending:
            out.close()
        if isinstance(e, OSError) and not isinstance(e, PolicyportError):
            raise UnreadableFileError(f"writing {', '.join(map(str, paths))} failed: {e}; nothing was written") from e
        raise
    for out in pending:
        if out.backup is not None:
            out.unlink(out.backup)
        out.close()
    return paths


def write_atomic(path: str | os.PathLike, write: Writer, force: bool = False) -> Path:
    """Write one file through ``write(file)`` atomically: see :func:`write_outputs`."""
    return write_outputs({path: write}, force)[0]


def _open_folder(folder: Path) -> int | None:
    if not _AT_FOLDER:
        return None
    try:
        return os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise UnreadableFileError(f"cannot write in {folder}: {e.strerror or e}") from e


def _new_mode(out: _Output) -> int:
    """The mode of the file being replaced, or the one the umask gives a new file."""
    found = out.stat()
    if found is not None and stat.S_ISREG(found.st_mode):
        return found.st_mode & 0o7777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _random_hex() -> str:
    """Eight random hex digits for a temporary name (``os.urandom``, as ``secrets.token_hex(4)``
    draws them, without importing ``secrets`` and the hashing modules it brings)."""
    return os.urandom(4).hex()


def _fresh(path: Path, suffix: str, make: Callable[[str], Any], claim: Callable[[str | None], None]) -> Any:
    """``make(name)`` of a new name ``.<name of path>.<8 hex digits>.<suffix>`` beside ``path``, tried
    afresh while the name is taken (100 times). ``claim`` is told each name before it is made (a
    signal that moment still has it removed), and None when the name turned out to be another's
    (never to be removed).

    Returns:
        What ``make`` returned.

    Raises:
        OutputExistsError: no free name after 100 tries.
    """
    for _ in range(100):
        name = f".{path.name}.{_random_hex()}.{suffix}"
        claim(name)
        try:
            return make(name)
        except FileExistsError:
            claim(None)
    raise OutputExistsError(f"cannot find a free temporary name beside {path}")


def _write_temp(out: _Output, write: Writer) -> None:
    mode = _new_mode(out)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = _fresh(out.path, "tmp", lambda name: out.create(name, flags), lambda name: setattr(out, "tmp", name))
    try:
        out.lock = os.dup(fd)  # the lock lives as long as a descriptor of the file is open
        hold_lock(out.lock)
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "w+b") as f:
        write(f)
        f.flush()
        os.fchmod(f.fileno(), mode)
        os.fsync(f.fileno())


def _check_target(out: _Output, force: bool) -> None:
    found = out.stat()
    if found is None:
        return
    if not stat.S_ISREG(found.st_mode):
        raise OutputExistsError(f"{out.path} appeared while writing and is not a regular file; nothing was written")
    if not force:
        raise OutputExistsError(f"{out.path} appeared while writing; nothing was written (overwrite it with --force)")


def _place(out: _Output) -> None:
    """Rename the finished temporary file onto the output, keeping a hard link to a replaced file."""
    if out.stat() is not None:
        for _ in range(100):
            backup = f".{out.name}.{_random_hex()}.old"
            try:
                out.link(out.name, backup)
            except FileExistsError:
                continue
            except (OSError, NotImplementedError):  # no hard links here: move the old file aside instead
                out.rename(out.name, backup)
            out.backup = backup
            break
    out.rename(out.tmp, out.name)
    out.tmp, out.placed = None, True


def _undo(pending: list[_Output]) -> None:
    """Put every output back as it was and remove every temporary file (best effort, never raises)."""
    for out in reversed(pending):
        if out.tmp is not None:
            out.unlink(out.tmp)
        with contextlib.suppress(OSError):
            if out.backup is not None:  # restore the replaced file (or drop a link to it, if still in place)
                out.rename(out.backup, out.name)
            elif out.placed:
                out.unlink(out.name)


# --------------------------------------------------------------------- what killed writers left

#: A temporary file of :func:`write_outputs`: ``.<output name>.<8 hex digits>.tmp``.
_TEMP_FILE = re.compile(r"\..+\.[0-9a-f]{8}\.tmp", re.DOTALL)
#: A temporary folder of :class:`FolderBuild`: ``.<output name>.<8 hex digits>.<purpose>``.
_TEMP_FOLDER = re.compile(r"\..+\.[0-9a-f]{8}\.(?:packing|recording|plots|replaced)", re.DOTALL)
#: How long (seconds) a temporary file or folder must have gone unchanged before it may be taken
#: for one a killed writer left: far more than a writer takes between creating it and locking it.
STALE_AFTER = 10 * 60
#: How deep a stale temporary folder is removed: policyport builds none deeper.
_TREE_DEPTH = 16

try:
    import fcntl
except ImportError:  # Windows: no advisory locks, so nothing is ever taken for stale
    fcntl = None


def hold_lock(fd: int) -> None:
    """Lock the file (or folder) open as ``fd`` exclusively (``flock``), as every writer of a
    temporary file or folder does from creating it until it is renamed or removed: the lock lasts
    as long as a descriptor of that open file does, and the kernel drops it when the process dies
    (SIGKILL included), which is how :func:`remove_stale_temporaries` tells a dead writer's file
    from a live one's. Nothing where the platform has no ``flock``."""
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX)


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def remove_stale_temporaries(folder: int) -> list[str]:
    """Remove the temporary files and folders that policyport writers killed before they finished
    (SIGKILL, a power cut) left in a folder, and nothing else.

    An entry is removed only when all of these hold: its name is exactly policyport's temporary
    naming (``.<name>.<8 hex digits>.tmp`` for a file; ``.<name>.<8 hex digits>.<purpose>`` for a
    folder, purpose ``packing``, ``recording``, ``plots`` or ``replaced``); it is a regular file or
    a folder (not a link); it has not changed for :data:`STALE_AFTER` seconds; and its lock can be
    taken, so no process holds it: every writer holds one on its temporary file or folder
    (:func:`hold_lock`) for as long as it exists. A concurrent writer's file is never touched, and
    neither is anything where the platform has no ``flock`` (nothing is removed there).

    Args:
        folder: a descriptor of the folder (every step is relative to it; links are never followed).

    Returns:
        The names removed.
    """
    if fcntl is None:
        return []
    try:
        names = [entry.name for entry in os.scandir(folder)]
    except OSError:
        return []
    removed = []
    for name in names:
        is_file = _TEMP_FILE.fullmatch(name) is not None
        if not is_file and _TEMP_FOLDER.fullmatch(name) is None:
            continue
        flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) \
            | getattr(os, "O_NOCTTY", 0) | (0 if is_file else getattr(os, "O_DIRECTORY", 0))
        try:
            fd = os.open(name, flags, dir_fd=folder)
        except OSError:  # a link, gone meanwhile, not ours to read
            continue
        try:
            found = os.fstat(fd)
            kind = stat.S_ISREG if is_file else stat.S_ISDIR
            if not kind(found.st_mode) or time.time() - found.st_mtime < STALE_AFTER:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # a live writer holds it
                continue
            try:  # still the same entry under that name
                if _identity(os.stat(name, dir_fd=folder, follow_symlinks=False)) != _identity(found):
                    continue
            except OSError:
                continue
            if is_file:
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=folder)
            else:
                _remove_tree(folder, name)
            removed.append(name)
        finally:
            os.close(fd)
    return removed


def _open_subfolder(folder: int, name: str) -> int:
    """The folder ``name`` in ``folder`` (a descriptor), opened without following a link."""
    return os.open(name, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
                   | getattr(os, "O_CLOEXEC", 0), dir_fd=folder)


def _descend(folder: int, parts: list[str], make: bool = False) -> int:
    """A new descriptor of the folder ``parts`` below ``folder`` (made on the way if ``make``),
    never through a link; the caller closes it."""
    fd = os.dup(folder)
    try:
        for part in parts:
            if make:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o777, dir_fd=fd)
            inner = _open_subfolder(fd, part)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def _remove_tree(folder: int, name: str, depth: int = 0) -> None:
    """Remove the folder ``name`` in ``folder`` (a descriptor) and all it holds, every step relative
    to descriptors, never following a link (best effort, never raises; stops :data:`_TREE_DEPTH` deep)."""
    if depth > _TREE_DEPTH:
        return
    try:
        fd = _open_subfolder(folder, name)
    except OSError:
        return
    try:
        for entry in list(os.scandir(fd)):
            if entry.is_dir(follow_symlinks=False):
                _remove_tree(fd, entry.name, depth + 1)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(entry.name, dir_fd=fd)
    except OSError:
        pass
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(name, dir_fd=folder)


@dataclass(frozen=True)
class FolderContents:
    """What an existing output folder holds, read through a descriptor of it where the platform
    has them (:meth:`FolderBuild.commit`).

    Attributes:
        files, folders, others: ``/``-separated relative names (see :func:`files_at`).
        fd: the descriptor it is open as (valid during the call it is given to); None where the
            platform has none (its path is used).
    """

    files: list[str]
    folders: list[str]
    others: list[str]
    fd: int | None

    @classmethod
    def of(cls, fd: int | None, path: Path) -> FolderContents:
        """The contents of the folder open as ``fd`` (None: the folder at ``path``).

        Raises:
            OutputExistsError: it cannot be read.
        """
        try:
            if fd is None:
                return cls(*folder_entries(path), fd=None)
            return cls(*folder_entries_at(fd), fd=fd)
        except OSError as e:
            raise OutputExistsError(f"{path} cannot be read ({e.strerror or e}); nothing was written") from e


class FolderBuild:
    """An output folder built under a hidden temporary name beside it, then renamed into place
    (:meth:`commit`): all of its files or none.

    The destination's parent folder is opened once, and the temporary folder once it is made; every
    file and subfolder is created relative to those descriptors (exclusively, never following a
    link), and the renames into place happen relative to the parent's, so swapping either folder
    for a symlink meanwhile cannot redirect a file or the folder. The temporary folder is
    ``.<name>.<8 hex digits>.<purpose>``, mode 0700, locked while it exists (see
    :func:`remove_stale_temporaries`), and removed with whatever it holds unless committed, however
    the ``with`` block ends (Ctrl-C and SIGTERM included). Where the platform has no descriptor-
    relative calls (Windows), paths are used, with the same all-or-none rule.

    Args:
        out: the destination folder.
        purpose: the end of the temporary name: ``"packing"``, ``"recording"`` or ``"plots"``.

    Attributes:
        path: the temporary folder's path, to read it back or to hand to other processes that write
            by path (not for writing from this one: use :meth:`open`, :meth:`create`).

    Raises:
        UnreadableFileError: the parent folder cannot be opened or written in.
        OutputExistsError: no free temporary name after 100 tries.
    """

    def __init__(self, out: str | os.PathLike, purpose: str):
        self.out = Path(out)
        self.name: str | None = None
        self.fd: int | None = None
        self.committed = False
        self.parent = _open_folder(self.out.parent)
        try:
            if self.parent is not None:
                remove_stale_temporaries(self.parent)
            _fresh(self.out, purpose, lambda name: os.mkdir(self._at(name), 0o700, dir_fd=self.parent),
                   lambda name: setattr(self, "name", name))
            if self.parent is not None:
                self.fd = _open_subfolder(self.parent, self.name)
                hold_lock(self.fd)
        except OSError as e:
            self.close()
            raise UnreadableFileError(f"cannot write in {self.out.parent}: {e.strerror or e}") from e
        except BaseException:
            self.close()
            raise

    def _at(self, name: str) -> str:
        return name if self.parent is not None else str(self.out.parent / name)

    @property
    def path(self) -> Path:
        return self.out.parent / self.name

    def __enter__(self) -> FolderBuild:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def create(self, name: str) -> int:
        """A new file ``name`` (``/``-separated below the folder; subfolders are made) opened for
        reading and writing as a descriptor, which the caller closes.

        Raises:
            OSError: it exists, a part of the name is a link, or it cannot be created.
        """
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) \
            | getattr(os, "O_BINARY", 0)
        *folders, leaf = name.split("/")
        if self.fd is None:
            path = self.path
            for part in folders:
                path = path / part
                with contextlib.suppress(FileExistsError):
                    os.mkdir(path)
            return os.open(path / leaf, flags, 0o666)
        fd = _descend(self.fd, folders, make=True)
        try:
            return os.open(leaf, flags, 0o666, dir_fd=fd)
        finally:
            os.close(fd)

    def open(self, name: str) -> BinaryIO:
        """A new file ``name`` (as for :meth:`create`) open for binary writing."""
        return os.fdopen(self.create(name), "wb")

    def write_bytes(self, name: str, data: bytes) -> None:
        """Write ``data`` to the new file ``name`` (as for :meth:`create`)."""
        with self.open(name) as f:
            f.write(data)

    def nbytes(self) -> int:
        """The bytes of the files in the folder (read through its descriptor)."""
        if self.fd is None:
            return sum(p.stat().st_size for p in self.path.rglob("*") if p.is_file() and not p.is_symlink())
        total = 0
        for name in folder_entries_at(self.fd)[0]:
            *up, leaf = name.split("/")
            fd = _descend(self.fd, up)
            try:
                total += os.stat(leaf, dir_fd=fd, follow_symlinks=False).st_size
            finally:
                os.close(fd)
        return total

    def commit(self, replaceable: Callable[[FolderContents], list[str]] | None = None) -> None:
        """Rename the finished folder onto the destination.

        Args:
            replaceable: when the destination exists: called with what it holds
                (:class:`FolderContents`, read through a descriptor of it opened relative to the
                parent, not through a link); returns the files that may be deleted once it is moved
                aside, or raises :class:`~policyport.errors.OutputExistsError` if it may not be
                replaced. None (default): an existing destination is refused. The old folder is
                moved aside under a temporary name, the new one renamed into place, then the listed
                files and the folders left empty are deleted; anything else in it keeps the old
                folder under that name.

        The destination is noted as placed once it is (:func:`noting_placed`).

        Raises:
            OutputExistsError: the destination exists and may not be replaced, is not a folder, or
                the folder cannot be renamed into place (the old one is then put back).
        """
        found = self._entry(self.out.name)
        if found is None:
            self._rename(self.name, self.out.name)
            self.committed = True
            note_placed(self.out)
            return
        if not stat.S_ISDIR(found.st_mode) or replaceable is None:
            raise OutputExistsError(f"{self.out} exists and is not a folder this command replaces; nothing was written")
        old = self._open_existing()
        try:
            listed = replaceable(FolderContents.of(old, self.out))
            if old is not None and fcntl is not None:
                with contextlib.suppress(OSError):  # kept from stale-folder removal while it is aside
                    fcntl.flock(old, fcntl.LOCK_EX | fcntl.LOCK_NB)
            aside = self._aside()
            self._rename(self.out.name, aside)
            try:
                self._rename(self.name, self.out.name)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.rename(self._at(aside), self._at(self.out.name), src_dir_fd=self.parent,
                              dst_dir_fd=self.parent)
                raise
            self.committed = True
            note_placed(self.out)
            self._remove_listed(old, aside, listed)
        finally:
            if old is not None:
                os.close(old)

    def _entry(self, name: str) -> os.stat_result | None:
        try:
            return os.stat(self._at(name), dir_fd=self.parent, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def _open_existing(self) -> int | None:
        if self.parent is None:
            return None
        try:
            return _open_subfolder(self.parent, self.out.name)
        except OSError as e:
            raise OutputExistsError(f"{self.out} cannot be opened as a folder ({e.strerror or e}); nothing was written") from e

    def _aside(self) -> str:
        for _ in range(100):
            name = f".{self.out.name}.{_random_hex()}.replaced"
            if self._entry(name) is None:
                return name
        raise OutputExistsError(f"cannot find a free temporary name beside {self.out}")

    def _rename(self, src: str, dst: str) -> None:
        try:
            os.rename(self._at(src), self._at(dst), src_dir_fd=self.parent, dst_dir_fd=self.parent)
        except OSError as e:
            raise OutputExistsError(f"cannot move the new folder to {self.out}: {e.strerror or e}; nothing was "
                                    "written") from e

    def _remove_listed(self, old: int | None, aside: str, listed: list[str]) -> None:
        """Delete ``listed`` from the replaced folder moved ``aside``, then its folders left empty,
        then itself if empty (best effort, never raises)."""
        if old is None:  # no descriptors: by path
            base = self.out.parent / aside
            for name in listed:
                with contextlib.suppress(OSError):
                    os.unlink(base / name)
            for folder, _, _ in sorted(os.walk(base), key=lambda entry: -len(entry[0])):
                with contextlib.suppress(OSError):
                    os.rmdir(folder)
            return
        for name in listed:
            *up, leaf = name.split("/")
            with contextlib.suppress(OSError):
                fd = _descend(old, up)
                try:
                    os.unlink(leaf, dir_fd=fd)
                finally:
                    os.close(fd)
        with contextlib.suppress(OSError):
            for name in sorted(folder_entries_at(old)[1], key=lambda n: -n.count("/")):
                *up, leaf = name.split("/")
                fd = _descend(old, up)
                try:
                    with contextlib.suppress(OSError):
                        os.rmdir(leaf, dir_fd=fd)
                finally:
                    os.close(fd)
        with contextlib.suppress(OSError):
            os.rmdir(aside, dir_fd=self.parent)

    def close(self) -> None:
        """Remove the temporary folder with all it holds unless committed, and close the descriptors."""
        if not self.committed and self.name is not None:
            if self.parent is not None:
                _remove_tree(self.parent, self.name)
            else:
                shutil.rmtree(self.path, ignore_errors=True)
        self.name = None if not self.committed else self.name
        for fd in (self.fd, self.parent):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.fd = self.parent = None


class _ReaderMayLeave:
    """A text stream in front of ``sys.stdout`` that, once the reader has gone (a broken pipe), sends
    the rest of the output to ``os.devnull`` instead of raising (see :func:`stdout_reader_may_leave`)."""

    def __init__(self, stream):
        self._stream = stream
        self.cut_off = False

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._to_devnull()
            return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._to_devnull()

    def _to_devnull(self) -> None:
        """Point the stream's descriptor at ``os.devnull``, so that what it still buffers (flushed
        again at exit) goes nowhere instead of raising once more."""
        self.cut_off = True
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, self._stream.fileno())
            finally:
                os.close(devnull)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@contextlib.contextmanager
def stdout_reader_may_leave() -> Iterator[None]:
    """Within the block, output the reader no longer takes is not an error: once writing to
    ``sys.stdout`` fails with a broken pipe (``policyport inspect m.onnx | head -1``), the rest goes
    to ``os.devnull``, as the Python documentation's "Note on SIGPIPE" recommends (``signal``
    module), and the command ends as it would have (its own exit code, no traceback).
    ``sys.stdout`` is flushed and restored on leaving.
    """
    stream = sys.stdout
    if stream is None or isinstance(stream, _ReaderMayLeave):
        yield
        return
    guarded = sys.stdout = _ReaderMayLeave(stream)
    try:
        yield
    finally:
        guarded.flush()
        if sys.stdout is guarded:
            sys.stdout = stream


#: How the archive comment of an ``.npz`` of a model's parameters begins (``policyport extract``,
#: ``export-numpy``'s weights): readers of recordings refuse such a file by it. numpy ignores the
#: comment, so the arrays read back as they were written.
WEIGHTS_COMMENT = b"policyport.weights"


def weights_comment(writer: str) -> bytes:
    """The archive comment of an ``.npz`` of parameters that ``writer`` (``"policyport extract"``) wrote."""
    return WEIGHTS_COMMENT + f": written by {writer}".encode()


def write_npz(file: str | os.PathLike | BinaryIO, arrays: Mapping[str, np.ndarray], comment: bytes = b"") -> None:
    """An uncompressed ``.npz`` that ``numpy.load`` reads, keeping every key (with ``/``, or ``file``).

    Written entry by entry rather than with ``numpy.savez(**arrays)``, whose own parameter names
    (``file``, ``allow_pickle``) would collide with such keys.

    Args:
        file: a path, or a seekable binary file object open for writing.
        comment: the zip archive's comment (:func:`weights_comment` for parameters); none by default.

    Raises:
        BadModelError: an object array, which could only be stored as a pickle; a key with a NUL
            character, where a zip archive's member names end (it would be read back cut short).
    """
    for key in arrays:
        if "\0" in key:
            raise BadModelError(f"{key!r} holds a NUL character (\\x00), which the member names of an .npz (a zip "
                                "archive) cannot hold; rename the tensor or parameter")
    with zipfile.ZipFile(file, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        zf.comment = comment
        for key, array in arrays.items():
            array = np.asarray(array)
            if array.dtype.hasobject:
                raise BadModelError(f"{key!r} is an object array ({array.dtype}); only plain numeric arrays are written")
            with zf.open(f"{key}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, array, allow_pickle=False)


def npz_writer(arrays: Mapping[str, np.ndarray], comment: bytes = b"") -> Writer:
    """A writer of ``arrays`` as an ``.npz`` for :func:`write_outputs` (see :func:`write_npz`)."""
    return lambda f: write_npz(f, arrays, comment)


def save_npz(path: str | os.PathLike, arrays: Mapping[str, np.ndarray], force: bool = False,
             comment: bytes = b"") -> Path:
    """Write ``arrays`` to an uncompressed ``.npz`` atomically (see :func:`write_npz`)."""
    return write_atomic(path, npz_writer(arrays, comment), force)


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
    import json

    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise UnreadableFileError(f"{path}: no such file") from None
    except (OSError, ValueError) as e:
        raise UnreadableFileError(f"{path} is not a readable JSON file: {e}") from e


def load_onnx(path: str | os.PathLike):
    """An ``onnx.ModelProto`` from an ``.onnx`` file (external data included) or a packed folder
    (checked first by :func:`policyport.folder.read_bundle`, as every reader of a folder is).

    Every initializer and tensor attribute is checked against its dims (:func:`check_model_tensors`);
    external data, which onnx reads only from the model's folder, is size-checked before it is read.

    Raises:
        BadModelError: a packed folder that fails its check (a changed, missing or refused file); a
            tensor whose data does not match its dims, or external data that does.
        UnreadableFileError: missing, unparsable, or without a graph (an empty file parses as one).
        LimitExceededError: external data larger than the array limit.
        MissingDependencyError: onnx is not installed.
    """
    onnx = require("onnx", "onnx", "reading an .onnx file")
    path = Path(path)
    if path.is_dir():  # a packed folder: its model.onnx, after the check every reader of a folder makes
        from .folder import MODEL_FILE, read_bundle

        check_model_folder(path)
        data = read_bundle(path, (MODEL_FILE,))[1][MODEL_FILE]
        path = path / MODEL_FILE
    elif not path.is_file():
        raise UnreadableFileError(f"{path}: no such file")
    else:
        data = None
    try:
        model = onnx.load(str(path), load_external_data=False) if data is None else onnx.load_model_from_string(data)
    except Exception as e:  # protobuf DecodeError, onnx ValidationError, OSError ...
        check_not_a_source(path)
        raise UnreadableFileError(f"{path} is not a readable ONNX model: {e}") from e
    if not model.graph.output:
        check_not_a_source(path)
        raise UnreadableFileError(f"{path} is not an ONNX model: it holds no graph with outputs")
    external = check_model_tensors(model)
    if external:
        check_array_bytes(external, f"{path}: its external data", None)
        try:
            onnx.external_data_helper.load_external_data_for_model(model, str(path.parent))
        except Exception as e:  # onnx refuses paths outside the folder, links, short files ...
            raise UnreadableFileError(f"{path}: cannot read its external data: {e}") from e
        check_model_tensors(model)
    return model


def check_model_tensors(model) -> int:
    """Check every initializer and tensor attribute of the main graph against its dims.

    Returns:
        The bytes the tensors stored in external files take (0 when there are none).

    Raises:
        BadModelError: a tensor whose data does not match its dims (see
            :func:`policyport.graph.check_tensor`), naming it.
    """
    from .graph import EXTERNAL, check_tensor

    AttributeProto = require("onnx", "onnx", "checking an ONNX model").AttributeProto  # noqa: N806

    external = 0
    for t in model.graph.initializer:
        nbytes = check_tensor(t, "initializer")
        external += nbytes if t.data_location == EXTERNAL else 0
    for n in model.graph.node:
        for a in n.attribute:
            tensors = [a.t] if a.type == AttributeProto.TENSOR else list(a.tensors) if a.type == AttributeProto.TENSORS else []
            for t in tensors:
                nbytes = check_tensor(t, f'{n.op_type} node "{n.name}" attribute {a.name!r}: tensor')
                external += nbytes if t.data_location == EXTERNAL else 0
    return external


def save_onnx(path: str | os.PathLike, model, force: bool = False) -> Path:
    """Serialize ``model`` to ``path`` atomically."""
    data = model.SerializeToString()
    return write_atomic(path, lambda f: f.write(data), force)


def ensure_model(model):
    """An ``onnx.ModelProto`` from a ModelProto or a path to an ``.onnx`` file, its tensors checked.

    Raises:
        BadModelError: ``model`` is neither, or a tensor's data does not match its dims.
    """
    if isinstance(model, (str, os.PathLike)):
        return load_onnx(model)
    if type(model).__name__ == "ModelProto":
        check_model_tensors(model)
        return model
    raise BadModelError(f"expected an onnx.ModelProto or a path to an .onnx file, got {type(model).__name__}")
