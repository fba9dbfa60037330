"""Mutations of policy files, the way broken savers, truncated downloads and hostile edits break them.

:func:`mutate_file` changes one file's bytes once, choosing by what the bytes are: a zip archive (an
SB3 save, a torch file, an ``.npz``, a ``.keras`` file) has a member replaced by a mutated copy, removed,
renamed or duplicated; a pickle has opcodes mutated (a value retyped or pushed to an extreme, a global's
name changed, an opcode dropped or repeated); JSON has values retyped, removed, or nested past any
recursion limit (also the base64 pickles SB3 keeps in its JSON, and an HDF5 file's JSON attributes), and
so has a run's YAML configuration; an
``.npy`` member has its header's dtype or shape changed; msgpack has values retyped; an HDF5 file has a
dataset replaced by one of another dtype or shape. Any file may instead have bytes flipped or be
truncated. All randomness comes from the ``random.Random`` passed in, so a mutation is reproduced by
its seed alone.
"""

from __future__ import annotations

import base64
import io
import json
import os
import pickle
import pickletools
import random
import re
import struct
import tempfile
import warnings
import zipfile

#: Values a retyped JSON, pickle or msgpack value becomes; the extremes a reader must refuse.
ODD_VALUES = (None, True, False, 0, -1, 1, 2, 7, 255, 2**31, -(2**31), 2**63, -(2**63) - 1, 2**64, 10**30,
              0.5, -1.5, 1e308, -1e-308, float("nan"), float("inf"), float("-inf"), "", "text", "0", "1e3", "nan",
              "[1 2 3]", "[[0 0 0 ... 0 0 0]]", "float32", "<f4", "|O", "\x00\xff", [], [1, 2, 3], [[1], [2, 3]],
              ["a", None], {}, {"1": 2}, {"dtype": "float32", "shape": [2]})

#: Names a mutated pickle global (``module name``) or string becomes.
GLOBAL_NAMES = ("torch FloatStorage", "torch DoubleStorage", "torch HalfStorage", "torch LongStorage",
                "torch IntStorage", "torch BoolStorage", "torch ByteStorage", "torch BFloat16Storage",
                "torch ComplexFloatStorage", "torch ComplexDoubleStorage", "torch QInt8Storage",
                "torch float8_e4m3fn", "torch float8_e5m2", "torch complex64", "torch int32", "torch uint16",
                "torch.storage UntypedStorage", "torch._utils _rebuild_tensor_v2", "torch._utils _rebuild_tensor_v3",
                "torch._utils _rebuild_parameter", "collections OrderedDict", "builtins dict", "builtins list",
                "builtins set", "builtins bytearray", "builtins getattr", "numpy dtype", "numpy ndarray",
                "numpy.core.multiarray _reconstruct", "numpy._core.multiarray _reconstruct",
                "numpy.core.multiarray scalar", "numpy._core.numeric _frombuffer", "copyreg _reconstructor",
                "gymnasium.spaces.box Box", "gymnasium.spaces.discrete Discrete", "os system", "nosuch module")
ODD_STRINGS = ("", "x", "0", "-1", "cpu", "cuda:0", "float32", "f4", "<f8", "|b1", "c8", "O", "V8", "<", ">", "|",
               "default_policy", "weight", "bias", "\udcff", "a" * 300)

#: dtype descriptions a mutated ``.npy`` header declares.
NPY_DESCRS = ("<f4", "<f8", "<f2", ">f4", "<i8", "<i4", "|u1", "|b1", "<c8", "<c16", "|O", "<U3", "|S2", "|V4",
              "<M8[s]", "<m8[D]", "bogus", "[('a', '<f4')]")


# ---------------------------------------------------------------------------------------------- bytes

def flip_bytes(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    if not data:
        return b"\x00", "an empty file given one byte"
    out = bytearray(data)
    count = rng.choice((1, 1, 2, 4, 16))
    for _ in range(count):
        i = rng.randrange(len(out))
        out[i] = rng.choice((out[i] ^ (1 << rng.randrange(8)), 0, 0xFF, 0x7F, 0x80, rng.randrange(256)))
    return bytes(out), f"{count} byte(s) changed"


def truncate(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    n = rng.choice((0, 1, rng.randrange(max(1, len(data))), max(0, len(data) - rng.randrange(1, 64))))
    return data[:n], f"truncated to {n} of {len(data)} bytes"


def splice(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    if len(data) < 2:
        return data + data, "doubled"
    a = rng.randrange(len(data))
    b = min(len(data), a + rng.randrange(1, 256))
    choice = rng.randrange(3)
    if choice == 0:
        return data[:a] + data[b:], f"bytes {a}..{b} removed"
    if choice == 1:
        return data[:b] + data[a:b] + data[b:], f"bytes {a}..{b} repeated"
    junk = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 32)))
    return data[:a] + junk + data[a:], f"{len(junk)} random bytes inserted at {a}"


def mutate_bytes(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    return rng.choice((flip_bytes, flip_bytes, truncate, splice))(data, rng)


# ----------------------------------------------------------------------------------------------- json

#: Nesting deep enough to exhaust any recursive reader's stack.
DEEP = 100_000
_DEEP_MARK = "\x00policyport-deep\x00"
#: YAML nesting: deeper than Python's recursion limit, which PyYAML's parser meets (its scanner is slow).
YAML_DEEP = 5_000


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*prefix, i))


def _get(value, path):
    for step in path:
        value = value[step]
    return value


def mutate_value(doc, rng: random.Random, *, deep: bool = True, nested=None):
    """Change one value of a JSON-like document in place (or return a new root); ``(doc, what)``.

    ``nested(text_or_bytes, rng)`` mutates a string value as a nested format (a base64 pickle) when
    it returns something."""
    paths = list(_paths(doc))
    path = rng.choice(paths)
    target = _get(doc, path)
    choice = rng.randrange(10)
    if nested is not None and isinstance(target, str) and choice < 4:
        mutated = nested(target, rng)
        if mutated is not None:
            new, what = mutated
            return _put(doc, path, new), f"{_show(path)}: {what}"
    if choice == 0 and path and isinstance(_get(doc, path[:-1]), dict):
        del _get(doc, path[:-1])[path[-1]]
        return doc, f"{_show(path)} removed"
    if choice == 1 and deep:
        return _put(doc, path, _DEEP_MARK), f"{_show(path)} nested {DEEP} deep"
    if choice == 2 and isinstance(target, (int, float)) and not isinstance(target, bool):
        new = rng.choice((-target, target * 1000, target + 1, target - 1))
        return _put(doc, path, new), f"{_show(path)} {target!r} -> {new!r}"
    if choice == 3 and isinstance(target, list) and target:
        new = rng.choice((target[:-1], target + target[-1:], target[::-1], [target], []))
        return _put(doc, path, new), f"{_show(path)} list of {len(target)} -> {len(new)}"
    if choice == 4 and isinstance(target, dict):
        target[rng.choice(("1", "", "__class__", ":type:", "shape"))] = rng.choice(ODD_VALUES)
        return doc, f"{_show(path)} given a key"
    if choice == 5:
        strings = [_get(doc, p) for p in paths if isinstance(_get(doc, p), str)]
        if strings:
            new = rng.choice(strings)
            return _put(doc, path, new), f"{_show(path)} -> another string of the document {new[:40]!r}"
    new = rng.choice(ODD_VALUES)
    return _put(doc, path, json.loads(json.dumps(new))), f"{_show(path)} -> {new!r:.40}"


def _put(doc, path, value):
    if not path:
        return value
    _get(doc, path[:-1])[path[-1]] = value
    return doc


def _show(path) -> str:
    return "".join(f"[{p!r}]" for p in path) or "the document"


def dump_json(doc) -> bytes:
    text = json.dumps(doc)
    quoted = json.dumps(_DEEP_MARK)
    if quoted in text:
        text = text.replace(quoted, "[" * DEEP + "]" * DEEP, 1).replace(quoted, "0")
    return text.encode()


def _base64_pickle(text: str, rng: random.Random):
    """A mutated base64 pickle (as SB3 keeps objects in its ``data`` JSON), or None if not one."""
    if len(text) < 8 or not re.fullmatch(r"[A-Za-z0-9+/=\s]+", text):
        return None
    try:
        raw = base64.b64decode(text, validate=False)
    except ValueError:
        return None
    if raw[:1] != b"\x80":
        return None
    new, what = mutate_pickle(raw, rng)
    return base64.b64encode(new).decode(), f"base64 pickle: {what}"


def mutate_json(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):  # an earlier mutation broke or nested it: bytes then
        return mutate_bytes(data, rng)
    doc, what = mutate_value(doc, rng, nested=_base64_pickle)
    return dump_json(doc), f"JSON {what}"


# ----------------------------------------------------------------------------------------------- yaml

def mutate_yaml(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """A run's configuration (``agent.yaml``, ``configuration.yaml``) with one value changed as JSON's are."""
    import yaml

    try:
        doc = yaml.safe_load(data)
    except (yaml.YAMLError, RecursionError, ValueError):  # an earlier mutation broke it: bytes then
        return mutate_bytes(data, rng)
    if not isinstance(doc, (dict, list)):
        return mutate_bytes(data, rng)
    doc, what = mutate_value(doc, rng)
    what = what.replace(f"nested {DEEP} deep", f"nested {YAML_DEEP} deep")
    text = yaml.safe_dump(doc, sort_keys=False)
    quoted = yaml.safe_dump(_DEEP_MARK).split("\n", 1)[0]  # the mark as a YAML scalar
    if quoted in text:  # flow-style nesting: past the recursion limit, yet quick for PyYAML's pure-Python scanner
        text = text.replace(quoted, "[" * YAML_DEEP + "]" * YAML_DEEP, 1).replace(quoted, "0")
    return text.encode(), f"YAML {what}"


# --------------------------------------------------------------------------------------------- pickle

def _encode(value) -> bytes:
    """One opcode pushing ``value``."""
    if value is None:
        return b"N"
    if value is True:
        return b"\x88"
    if value is False:
        return b"\x89"
    if isinstance(value, (int, float)):
        return pickle.dumps(value, protocol=2)[2:-1]
    if isinstance(value, str):
        raw = value.encode("utf-8", "surrogatepass")
        return b"X" + struct.pack("<I", len(raw)) + raw
    if isinstance(value, bytes):
        return b"C" + bytes([len(value)]) + value if len(value) < 256 else b"B" + struct.pack("<I", len(value)) + value
    if value == ():
        return b")"
    if value == []:
        return b"]"
    return b"}"


_PUSHES = {"BININT", "BININT1", "BININT2", "LONG1", "LONG4", "INT", "LONG", "BINFLOAT", "FLOAT", "NONE",
           "NEWTRUE", "NEWFALSE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINBYTES",
           "BINBYTES", "BINBYTES8", "SHORT_BINSTRING", "BINSTRING", "STRING", "EMPTY_TUPLE", "EMPTY_LIST",
           "EMPTY_DICT", "BYTEARRAY8"}


def mutate_pickle(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    try:
        ops = list(pickletools.genops(data))
    except Exception:  # noqa: BLE001 - not a whole pickle (an earlier mutation): bytes then
        return mutate_bytes(data, rng)
    ends = [pos for _, _, pos in ops[1:]] + [len(data)]
    spans = [(op, arg, pos, end) for (op, arg, pos), end in zip(ops, ends)]
    choice = rng.randrange(8)
    pushes = [s for s in spans if s[0].name in _PUSHES]
    globals_ = [s for s in spans if s[0].name == "GLOBAL"]
    strings = [s for s in spans if isinstance(s[1], str) and s[0].name in _PUSHES]
    if choice <= 2 and pushes:
        op, arg, a, b = rng.choice(pushes)
        if isinstance(arg, int) and not isinstance(arg, bool) and rng.random() < 0.5:
            new = rng.choice((0, -1, 1, arg + 1, arg - 1, arg * 2, -arg, 2**31 - 1, 2**32, 2**62, 2**63, 10**30))
        elif isinstance(arg, str) and rng.random() < 0.5:
            new = rng.choice(ODD_STRINGS + tuple(s for g in GLOBAL_NAMES for s in g.split()))
        else:
            new = rng.choice([v for v in ODD_VALUES if not isinstance(v, (list, dict)) or not v] + [b"", b"\x00" * 3, ()])
        return data[:a] + _encode(new) + data[b:], f"pickle {op.name} {arg!r:.40} at {a} -> {new!r:.40}"
    if choice == 3 and globals_:
        op, arg, a, b = rng.choice(globals_)
        new = rng.choice(GLOBAL_NAMES)
        module, name = new.split(" ")
        return data[:a] + b"c" + f"{module}\n{name}\n".encode() + data[b:], f"pickle GLOBAL {arg!r} at {a} -> {new!r}"
    if choice == 4 and strings:
        op, arg, a, b = rng.choice(strings)
        new = rng.choice(GLOBAL_NAMES).split(" ")[rng.randrange(2)]
        return data[:a] + _encode(new) + data[b:], f"pickle string {arg!r:.40} at {a} -> {new!r}"
    if choice == 5 and len(spans) > 2:
        op, arg, a, b = rng.choice(spans[1:-1])
        return data[:a] + data[b:], f"pickle {op.name} at {a} removed"
    if choice == 6 and len(spans) > 2:
        op, arg, a, b = rng.choice(spans[1:-1])
        return data[:b] + data[a:b] + data[b:], f"pickle {op.name} at {a} repeated"
    if choice == 7 and len(spans) > 2:
        op, arg, a, b = rng.choice(spans[1:-1])
        new = rng.choice(b"NJK(t)]}eaRbsuQ0.\x85\x86\x87\x94\x93cqhX")
        return data[:a] + bytes([new]) + data[a + 1:], f"pickle opcode {op.name} at {a} -> {bytes([new])!r}"
    return mutate_bytes(data, rng)


# ------------------------------------------------------------------------------------------------ npy

def mutate_npy(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    import numpy as np

    try:
        f = io.BytesIO(data)
        version = np.lib.format.read_magic(f)
        header = (np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0)(f)
        body = data[f.tell():]
    except Exception:  # noqa: BLE001 - a header an earlier mutation broke
        return mutate_bytes(data, rng)
    shape, fortran, dtype = header
    descr = np.lib.format.dtype_to_descr(dtype)
    choice = rng.randrange(6)
    if choice == 0:
        descr = rng.choice(NPY_DESCRS)
        what = f"dtype -> {descr}"
    elif choice == 1:
        shape = rng.choice(((), (0,), (1,), shape[::-1], (*shape, 1), shape[1:], (2**40,), (2**31, 2**31), (-1,),
                            tuple(d + 1 for d in shape), (3, 0, 5)))
        what = f"shape -> {shape}"
    elif choice == 2:
        fortran = not fortran
        what = f"fortran_order -> {fortran}"
    elif choice == 3:
        body = body[: rng.randrange(max(1, len(body)))]
        what = f"data truncated to {len(body)} bytes"
    elif choice == 4:
        text = rng.choice(("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 'a')}", "{'descr': 1}", "[]",
                           "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'extra': 1}", "__import__('os')",
                           "{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}", "{" * 2000))
        return _npy_header(text) + body, f"header -> {text[:40]!r}"
    else:
        return mutate_bytes(data, rng)
    text = "{'descr': %r, 'fortran_order': %r, 'shape': %r, }" % (descr, fortran, tuple(shape))
    return _npy_header(text) + body, f"npy {what}"


def _npy_header(text: str) -> bytes:
    raw = text.encode("latin1")
    pad = 64 - (10 + len(raw) + 1) % 64
    raw = raw + b" " * pad + b"\n"
    if len(raw) < 65536:
        return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(raw)) + raw
    return b"\x93NUMPY\x02\x00" + struct.pack("<I", len(raw)) + raw


# -------------------------------------------------------------------------------------------- msgpack

def mutate_msgpack(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    import msgpack

    try:
        doc = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception:  # noqa: BLE001 - not a whole document (an earlier mutation): bytes then
        return mutate_bytes(data, rng)
    paths = list(_paths(doc))
    path = rng.choice(paths)
    target = _get(doc, path)
    choice = rng.randrange(5)
    if choice == 0 and path and isinstance(_get(doc, path[:-1]), dict):
        del _get(doc, path[:-1])[path[-1]]
        what = "removed"
    elif choice == 1 and isinstance(target, dict) and target:
        key = rng.choice(list(target))
        target[rng.choice((0, -1, 2**40, b"key", 1.5, None))] = target.pop(key)
        what = f"key {key!r:.30} retyped"
    elif choice == 2 and isinstance(target, bytes):
        new = target[: rng.randrange(len(target) + 1)] + bytes(rng.randrange(4) * 4)
        doc = _put(doc, path, new)
        what = f"{len(target)} bytes -> {len(new)}"
    else:
        new = rng.choice(ODD_VALUES + (b"", b"\x00" * 8, [2**40], [0], [-1, 3], "float64", "<c8", "|O"))
        doc = _put(doc, path, new)
        what = f"-> {new!r:.40}"
    try:
        return msgpack.packb(doc, use_bin_type=True), f"msgpack {_show(path)} {what}"
    except (OverflowError, ValueError, TypeError):  # an integer beyond 64 bits: msgpack has none
        return mutate_bytes(data, rng)


# ------------------------------------------------------------------------------------------------ zip

def mutate_zip(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            members = [(i, zf.read(i)) for i in zf.infolist()]
    except Exception:  # noqa: BLE001 - a damaged archive (an earlier mutation): bytes then
        return mutate_bytes(data, rng)
    if not members:
        return mutate_bytes(data, rng)
    choice = rng.randrange(10)
    index = rng.randrange(len(members))
    info, content = members[index]
    if choice <= 5:
        new, what = mutate_file(content, rng, info.filename)
        members[index] = (info, new)
        what = f"member {info.filename!r}: {what}"
    elif choice == 6:
        del members[index]
        what = f"member {info.filename!r} removed"
    elif choice == 7:
        other = rng.choice(members)[1]
        members[index] = (info, other)
        what = f"member {info.filename!r} replaced by another member's bytes"
    elif choice == 8:
        members.append((info, rng.choice(members)[1]))
        what = f"member {info.filename!r} listed twice"
    else:
        renamed = zipfile.ZipInfo(rng.choice(("", "../evil", info.filename + "x", info.filename.upper(),
                                              info.filename.rsplit("/", 1)[-1], "/abs/" + info.filename)))
        members[index] = (renamed, content)
        what = f"member {info.filename!r} renamed {renamed.filename!r}"
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for info, content in members:
            zi = zipfile.ZipInfo(info.filename, date_time=(2020, 1, 1, 0, 0, 0))
            zi.compress_type = info.compress_type
            with warnings.catch_warnings():  # zipfile warns of a name written twice: that is the mutation
                warnings.simplefilter("ignore")
                zf.writestr(zi, content)
    return out.getvalue(), what


# ----------------------------------------------------------------------------------------------- hdf5

def mutate_hdf5(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    import h5py
    import numpy as np

    fd, path = tempfile.mkstemp(suffix=".h5")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        try:
            with h5py.File(path, "r+") as h5:
                datasets, attributes = [], []
                h5.visititems(lambda n, o: datasets.append(n) if isinstance(o, h5py.Dataset) else None)
                for owner in [h5, *(h5[n] for n in datasets)]:
                    attributes += [(owner.name, k) for k in owner.attrs]
                json_attrs = [(o, k) for o, k in attributes if _text(h5[o].attrs[k])[:1] == "{"]
                if json_attrs and rng.random() < 0.4:
                    owner, key = rng.choice(json_attrs)
                    value = h5[owner].attrs[key]
                    new, what = mutate_json(value.encode() if isinstance(value, str) else value, rng)
                    h5[owner].attrs[key] = new.decode()
                    what = f"attribute {key!r}: {what}"
                elif datasets and rng.random() < 0.8:
                    name = rng.choice(datasets)
                    old = h5[name][()]
                    choice = rng.randrange(4)
                    if choice == 0:
                        new = np.asarray(old).astype(rng.choice(("int64", "complex64", "float16", "bool", "S4", "float64")))
                    elif choice == 1:
                        new = np.zeros(rng.choice(((), (0,), (3,), (np.size(old) + 1,), (*np.shape(old), 2))), np.float32)
                    elif choice == 2:
                        new = np.asarray(old).T.copy() if np.ndim(old) > 1 else np.full(np.shape(old), np.nan, np.float32)
                    else:
                        del h5[name]
                        return _read(path), f"HDF5 dataset {name!r} removed"
                    del h5[name]
                    h5.create_dataset(name, data=new, track_times=False)  # no clock in the bytes
                    what = f"HDF5 dataset {name!r} {np.asarray(old).dtype}{np.shape(old)} -> {new.dtype}{new.shape}"
                else:
                    return mutate_bytes(data, rng)
        except Exception:  # noqa: BLE001 - h5py cannot open it (an earlier mutation): bytes then
            return mutate_bytes(data, rng)
        return _read(path), what
    finally:
        os.unlink(path)


def _text(value) -> str:
    """An HDF5 attribute's text (Keras keeps its JSON config in one), or ``""`` for other values."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value if isinstance(value, str) else ""


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


# ---------------------------------------------------------------------------------------------- files

def sniff(data: bytes, name: str = "") -> str:
    """What ``data`` is: zip, pickle, npy, json, yaml, msgpack, hdf5, safetensors or bytes."""
    if data[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "zip"
    if data[:6] == b"\x93NUMPY":
        return "npy"
    if data[:8] == b"\x89HDF\r\n\x1a\n":
        return "hdf5"
    if name.endswith(".msgpack"):
        return "msgpack"
    if data[:1] == b"\x80" and data[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return "pickle"
    if name.endswith(".safetensors") and len(data) > 8:
        return "safetensors"
    if name.endswith((".yaml", ".yml")):
        return "yaml"
    if data.lstrip()[:1] in (b"{", b"[") or name.endswith((".json", "/data")) or name == "data":
        try:
            json.loads(data)
            return "json"
        except (ValueError, RecursionError):
            pass
    return "bytes"


def mutate_safetensors(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    (n,) = struct.unpack("<Q", data[:8])
    try:
        header = json.loads(data[8:8 + n])
    except (ValueError, RecursionError):
        return mutate_bytes(data, rng)
    header, what = mutate_value(header, rng)
    raw = dump_json(header)
    return struct.pack("<Q", len(raw)) + raw + data[8 + n:], f"safetensors header {what}"


_BY_KIND = {"zip": None, "npy": mutate_npy, "hdf5": mutate_hdf5, "msgpack": mutate_msgpack, "pickle": mutate_pickle,
            "safetensors": mutate_safetensors, "json": mutate_json, "yaml": mutate_yaml, "bytes": mutate_bytes}


def mutate_file(data: bytes, rng: random.Random, name: str = "") -> tuple[bytes, str]:
    """``(mutated bytes, what was done)``: one mutation of a file named ``name`` (used to tell msgpack
    and safetensors, which have no magic), structured by its kind with probability 3/4, else bytes."""
    kind = sniff(data, name)
    if kind == "bytes" or rng.random() < 0.25:
        return mutate_bytes(data, rng)
    if kind == "zip":
        return mutate_zip(data, rng)
    return _BY_KIND[kind](data, rng)
