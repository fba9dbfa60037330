"""Arrays: ``.npy``/``.npz`` read with their headers checked first (:func:`load_arrays`,
:func:`read_npz`, :func:`read_npy`); pickles, object, structured and wide raw-byte dtypes
refused; and ``.npz`` written (:func:`write_npz`, :func:`npz_writer`)."""

from __future__ import annotations

import io
import math
import os
import zipfile
import zlib
from pathlib import Path
from typing import BinaryIO, Mapping

import numpy as np

from ..errors import ZIP_ERRORS, BadModelError, LimitExceededError, PolicyportError, UnreadableFileError
from .kinds import NPY_MAGIC, _ZIP_MAGICS, _open_regular, _what_it_is
from .limits import ENV_NPZ_ARRAYS, check_array_bytes, format_size, limits
from .outputs import Writer, write_atomic
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
    except ZIP_ERRORS as e:  # damaged, encrypted, unknown compression ...
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


def read_npy_zlib(data: bytes, where: str, *, max_bytes: int | None = None, before: int = 0) -> np.ndarray:
    """The array of an ``.npy`` file compressed with zlib (as RLlib serialises arrays,
    ``ray/rllib/utils/serialization.py``), checked as :func:`load_arrays` checks one.

    Only the header is decompressed first; its dtype and shape are checked against the limit, and
    then the data it describes is decompressed straight into the array, no more than that, so a
    small stream that inflates to gigabytes never does.

    Args:
        data: the zlib stream.
        where: how to name the array in messages.
        max_bytes: the most the array may take; default :func:`limits` ``.array_bytes`` (1 GiB).
        before: the bytes of the arrays read before it from the same file, which it may take
            together with no more than ``max_bytes``.

    Returns:
        The array, in the byte order the file stores.

    Raises:
        UnreadableFileError: not a zlib stream, a damaged or truncated .npy, an object, structured or
            wide raw-byte array.
        LimitExceededError: the header describes an array larger than ``max_bytes``, or one that
            with ``before`` takes more.
    """
    limit = limits().array_bytes if max_bytes is None else max_bytes
    inflate = zlib.decompressobj()
    try:
        head = inflate.decompress(data, _NPY_HEADER_BYTES)
        header = io.BytesIO(head)
        dtype, shape, nbytes, fortran = _check_npy_header(header, where, None, limit)
        if before:
            check_array_bytes(before + nbytes, f"{where} ({dtype.name}, shape {shape}) with the arrays read before it",
                              limit)
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
