"""A small pure-Python MessagePack decoder for RLlib's ``*.msgpack`` checkpoint states.

RLlib (``use_msgpack=True``) writes its state files with ``msgpack`` + ``msgpack_numpy``: plain
maps, arrays, strings, numbers, and numpy arrays as maps ``{b"nd": True, b"type": "<f4",
b"shape": [...], b"data": raw bytes}``. Decoding needs neither package and runs nothing from the
file: only the MessagePack types (https://github.com/msgpack/msgpack/blob/master/spec.md) are
rebuilt, and a msgpack-numpy map becomes a numpy array of a plain numeric dtype.
"""

from __future__ import annotations

import math
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import UnreadableFileError

#: How deep arrays and maps may nest (RLlib's states nest a few levels); each level takes two Python
#: frames, so this stays well inside the interpreter's recursion limit.
_MAX_DEPTH = 200


class _Reader:
    def __init__(self, data: bytes, what: str):
        self.data, self.pos, self.what = data, 0, what

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise UnreadableFileError(f"{self.what} is truncated: a MessagePack value runs past the end of the file")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def uint(self, n: int) -> int:
        return int.from_bytes(self.take(n), "big")  # pragma: no mutate (3.11+ defaults to big; 3.10 needs it)

    def value(self, depth: int = 0) -> Any:
        if depth > _MAX_DEPTH:
            raise UnreadableFileError(f"{self.what} nests MessagePack values deeper than {_MAX_DEPTH}")
        b = self.take(1)[0]
        if b <= 0x7F:
            return b
        if b >= 0xE0:
            return b - 0x100
        if 0x80 <= b <= 0x8F:
            return self.map(b & 0x0F, depth)
        if 0x90 <= b <= 0x9F:
            return [self.value(depth + 1) for _ in range(b & 0x0F)]
        if 0xA0 <= b <= 0xBF:
            return self.text(b & 0x1F)
        simple = {0xC0: None, 0xC2: False, 0xC3: True}
        if b in simple:
            return simple[b]
        if b in (0xC4, 0xC5, 0xC6):
            return self.take(self.uint(1 << (b - 0xC4)))
        if b in (0xC7, 0xC8, 0xC9):  # ext: code and payload, kept as a pair
            n = self.uint(1 << (b - 0xC7))
            return ("ext", self.take(1)[0], self.take(n))
        if b == 0xCA:
            return struct.unpack(">f", self.take(4))[0]
        if b == 0xCB:
            return struct.unpack(">d", self.take(8))[0]
        if 0xCC <= b <= 0xCF:
            return self.uint(1 << (b - 0xCC))
        if 0xD0 <= b <= 0xD3:
            n = 1 << (b - 0xD0)
            return int.from_bytes(self.take(n), "big", signed=True)  # pragma: no mutate (as in uint)
        if 0xD4 <= b <= 0xD8:  # fixext 1, 2, 4, 8, 16
            code = self.take(1)[0]
            return ("ext", code, self.take(1 << (b - 0xD4)))
        if b in (0xD9, 0xDA, 0xDB):
            return self.text(self.uint(1 << (b - 0xD9)))
        if b in (0xDC, 0xDD):
            return [self.value(depth + 1) for _ in range(self.uint(2 if b == 0xDC else 4))]
        if b in (0xDE, 0xDF):
            return self.map(self.uint(2 if b == 0xDE else 4), depth)
        raise UnreadableFileError(f"{self.what} holds byte 0x{b:02x} at offset {self.pos - 1}, which starts no MessagePack value")

    def text(self, n: int) -> str:
        try:
            return self.take(n).decode("utf-8")  # pragma: no mutate (codec names ignore case)
        except UnicodeDecodeError as e:
            raise UnreadableFileError(f"{self.what} holds a MessagePack string that is not UTF-8: {e}") from e

    def map(self, n: int, depth: int) -> Any:
        out = {}
        for _ in range(n):
            key = self.value(depth + 1)
            if isinstance(key, list):
                key = tuple(key)
            try:
                out[key] = self.value(depth + 1)
            except TypeError as e:
                raise UnreadableFileError(f"{self.what} holds a MessagePack map key that cannot be a key: {e}") from e
        return _numpy_array(out, self.what)  # the map itself unless it is a msgpack-numpy array


#: The dtype kinds read as arrays: bool, signed and unsigned integers, floats, complex.
NUMERIC_KINDS = "biufc"  # pragma: no mutate (mutmut's "XX" padding is no dtype kind)


def _numpy_array(m: dict, what: str) -> Any:
    """A msgpack-numpy map ``{nd, type, shape, data}`` as an array (plain numeric dtypes only)."""
    get = lambda k: m.get(k.encode(), m.get(k))  # noqa: E731 — keys are bytes or str by writer version
    if get("nd") is not True:
        return m
    type_ = get("type")
    try:
        type_ = type_.decode() if isinstance(type_, bytes) else type_
        dtype = np.dtype(type_)
    except (TypeError, ValueError) as e:  # not text, not a dtype numpy knows, not UTF-8
        raise UnreadableFileError(f"{what} holds an array of unknown dtype {type_!r:.60}") from e
    if dtype.kind not in NUMERIC_KINDS:
        raise UnreadableFileError(f"{what} holds an array of dtype {dtype}; only numeric arrays are read")
    shape = get("shape")
    if not isinstance(shape, (list, tuple)) or not all(type(d) is int and d >= 0 for d in shape):
        raise UnreadableFileError(f"{what} holds an array whose shape {shape!r:.60} is not a list of whole numbers")
    shape = tuple(shape)
    data = get("data")
    size = math.prod(shape)  # exact: no int64 that wraps around to match the data's length
    if not isinstance(data, bytes) or len(data) != dtype.itemsize * size:
        raise UnreadableFileError(f"{what} holds an array whose data does not fit its shape {shape} and dtype {dtype}")
    return np.frombuffer(data, dtype=dtype).reshape(shape).copy()


def load(source: bytes | str | os.PathLike, what: str | None = None) -> Any:
    """Decode one MessagePack document (RLlib's ``*.msgpack`` state files).

    Args:
        source: the bytes, or a path to the file.
        what: how to name the file in messages (default: its path).

    Returns:
        dicts, lists, str/bytes, numbers, ``None``/bools, and numpy arrays for msgpack-numpy maps.

    Raises:
        UnreadableFileError: the file cannot be read, is empty or truncated, or is not MessagePack.
    """
    if isinstance(source, (str, os.PathLike)):
        what = what or str(source)
        try:
            source = Path(source).read_bytes()
        except OSError as e:
            raise UnreadableFileError(f"cannot read {what}: {e}") from e
    reader = _Reader(bytes(source), what or "the MessagePack data")
    if not reader.data:
        raise UnreadableFileError(f"{reader.what} is empty: it holds no MessagePack value")
    value = reader.value()
    if reader.pos != len(reader.data):
        raise UnreadableFileError(f"{reader.what} has {len(reader.data) - reader.pos} bytes after its MessagePack value")
    return value
