"""Flax's MessagePack state files (``flax.serialization.to_bytes``) read without JAX or msgpack.

``to_bytes(target)`` writes ``msgpack.packb(to_state_dict(target), default=_msgpack_ext_pack,
strict_types=True)`` (``flax/serialization.py``): maps of plain values, a list or tuple becoming a
map keyed ``"0"``, ``"1"`` ...; each array an *extension* value whose payload is itself a
MessagePack array ``[shape, dtype name, C-order bytes]``: type 1 an ``ndarray``, type 3 a numpy
scalar (a 0-d array), type 2 a Python complex ``[real, imag]``. An array larger than 2**30 bytes
is split into a map ``{"__msgpack_chunked_array__": True, "shape": {"0": ...}, "chunks": {"0": ...}}``.

Nothing here runs code from the file: the MessagePack values are rebuilt by
:mod:`~policyport.converter.readers.msgpack_decode`, and arrays only of plain numeric dtypes (and
bfloat16, through ``ml_dtypes``).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ...errors import UnreadableFileError
from . import msgpack_decode

#: Flax's extension type codes (``_MsgpackExtType`` in ``flax/serialization.py``).
EXT_NDARRAY, EXT_COMPLEX, EXT_SCALAR = 1, 2, 3
CHUNKED = "__msgpack_chunked_array__"


def looks_like_msgpack_map(head: bytes) -> bool:
    """Whether ``head`` (a file's first bytes) starts a MessagePack map (fixmap, map 16 or map 32),
    as every ``to_bytes`` of a state dict does; a torch zip starts ``PK``, a pickle ``0x80``."""
    return bool(head) and (0x80 <= head[0] <= 0x8F or head[0] in (0xDE, 0xDF))


def _array(payload: bytes, what: str) -> np.ndarray:
    from .torch_files import _numpy_dtype

    value = msgpack_decode.load(payload, what=f"an array in {what}")
    if not (isinstance(value, list) and len(value) == 3 and isinstance(value[0], list) and isinstance(value[2], bytes)):
        raise UnreadableFileError(f"{what} holds an array extension that is not [shape, dtype, bytes]: {value!r:.80}")
    shape, name, data = value
    name = name.decode() if isinstance(name, bytes) else str(name)
    try:
        dtype = _numpy_dtype(name, what)
    except TypeError as e:
        raise UnreadableFileError(f"{what} holds an array of unknown dtype {name!r}") from e
    if dtype.name != "bfloat16" and dtype.kind not in msgpack_decode.NUMERIC_KINDS:
        raise UnreadableFileError(f"{what} holds an array of dtype {dtype}; only numeric arrays are read")
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape) or len(data) != dtype.itemsize * int(np.prod(shape, dtype=np.int64)):
        raise UnreadableFileError(f"{what} holds an array whose {len(data)} bytes do not fit its shape {shape} and dtype {dtype}")
    return np.frombuffer(data, dtype=dtype).reshape(shape).copy()


def _rebuild(value: Any, what: str) -> Any:
    if isinstance(value, tuple) and len(value) == 3 and value[0] == "ext":
        _, code, payload = value
        if code in (EXT_NDARRAY, EXT_SCALAR):
            return _array(payload, what)
        if code == EXT_COMPLEX:
            real, imag = msgpack_decode.load(payload, what=f"a complex number in {what}")
            return complex(real, imag)
        raise UnreadableFileError(f"{what} holds a MessagePack extension of type {code}, which Flax does not write")
    if isinstance(value, dict):
        rebuilt = {k.decode() if isinstance(k, bytes) else k: _rebuild(v, what) for k, v in value.items()}
        if rebuilt.get(CHUNKED) is True:
            shape = tuple(int(rebuilt["shape"][k]) for k in sorted(rebuilt["shape"], key=int))
            chunks = [rebuilt["chunks"][k] for k in sorted(rebuilt["chunks"], key=int)]
            return np.concatenate(chunks).reshape(shape)
        return rebuilt
    if isinstance(value, list):
        return [_rebuild(v, what) for v in value]
    return value


def load(source: bytes | str | os.PathLike, what: str | None = None) -> Any:
    """The state dict a ``flax.serialization.to_bytes`` file holds.

    Args:
        source: the bytes, or a path to the file.
        what: how to name the file in messages (default: its path).

    Returns:
        Nested dicts (keys ``str``) of numpy arrays and plain values: ``{"params": {"Dense_0":
        {"kernel": float32 (in, out), "bias": (out,)}, ...}}`` for a Flax ``linen`` module's variables.

    Raises:
        UnreadableFileError: the file is not MessagePack, is truncated, or holds an array that does
            not fit its shape and dtype.
    """
    what = what or (str(source) if isinstance(source, (str, os.PathLike)) else "the Flax state")
    return _rebuild(msgpack_decode.load(source, what=what), what)
