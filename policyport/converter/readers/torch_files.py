"""Reading torch ``.pt``/``.pth`` files and ``.safetensors`` into numpy arrays, safely.

* ``.pt``/``.pth`` with torch installed: ``torch.load(map_location="cpu", weights_only=True)``, which
  rebuilds tensors and plain containers only; a file that needs more (a whole pickled module) is
  refused, naming the global it asked for, unless ``trust`` is given.
* ``.pt``/``.pth`` without torch: the zip archive torch writes (``<name>/data.pkl`` plus one raw
  file per storage under ``<name>/data/``, ``<name>/byteorder``; ``torch/serialization.py``) is read
  through policyport's restricted unpickler, whose only torch globals are rebuilt by policyport's
  own functions (``torch._utils._rebuild_tensor_v2`` -> a numpy view of the storage bytes, copied;
  ``torch.<Type>Storage`` -> its dtype). Nothing from the file is called.
* Sizes: the members of a torch zip archive together, and every tensor once copied to numpy (a
  tensor with stride 0 declares its whole shape over a storage of a few bytes), are checked against
  the array limit (:func:`policyport.io.limits.limits`) before they are read or copied; what a file
  pickles shared (a DAG) is converted once and stays shared.
* ``.safetensors``: the ``safetensors`` package when installed, else a reader of its documented
  layout (an 8-byte little-endian header length, a JSON header of dtype/shape/data_offsets, raw
  little-endian bytes), checking every offset.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import struct
import warnings
import zipfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ...errors import ZIP_ERRORS, BadModelError, LimitExceededError, PolicyportError, UnreadableFileError, UntrustedFileError
from ...io.limits import check_array_bytes
from ...io.arrays import check_zip_members, read_zip_member
from ...io.schema import load_json
from ...text import bounded_repr

#: torch storage class -> numpy dtype (``torch/storage.py``'s legacy typed storages).
STORAGE_DTYPES = {
    "DoubleStorage": "float64", "FloatStorage": "float32", "HalfStorage": "float16", "LongStorage": "int64",
    "IntStorage": "int32", "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8",
    "BoolStorage": "bool", "BFloat16Storage": "bfloat16",
}

#: safetensors dtype -> numpy dtype (https://github.com/huggingface/safetensors, "Format").
SAFETENSORS_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "I32": "int32",
    "I16": "int16", "I8": "int8", "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8", "BOOL": "bool",
}


#: torch element types numpy holds only through the ml_dtypes package, which names them as torch does.
ML_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")


def _numpy_dtype(name: str, what: str) -> np.dtype:
    if name in ML_DTYPES:
        try:
            import ml_dtypes

            return np.dtype(getattr(ml_dtypes, name))
        except (ImportError, AttributeError):
            raise UnreadableFileError(f"{what} holds {name} tensors, which numpy reads only with the ml_dtypes package "
                                      "(pip install ml_dtypes)") from None
    return np.dtype(name)


def load_torch_file(path: str | Path | bytes, *, trust: bool = False, what: str | None = None,
                    inert_modules: Iterable[str] | None = None):
    """The object a ``.pt``/``.pth`` file holds, tensors as numpy arrays (see the module docstring).

    Args:
        path: the file, or its bytes (a member of an SB3 zip).
        trust: unpickle whatever the file holds (runs its code), with the current folder and the
            file's own on the import path, as for the script that saved it
            (:func:`~policyport.converter.readers.unpickle.user_import_path`).
        what: how to name the file in messages (default: the path).
        inert_modules: module prefixes whose globals, functions included, become inert records
            instead of being refused, for a payload beside the weights that the caller never uses
            (the ``infos`` an rsl_rl checkpoint pickles). When given (an empty list too), the file
            is read by :func:`read_torch_zip` whether torch is installed or not, ``trust`` or not
            (torch's weights-only unpickler refuses such globals): nothing from the file is called.
            ``None`` (default): as the module docstring says.

    Returns:
        Usually a dict name -> array (a state_dict); with ``trust``, whatever the file pickled
        (a whole ``nn.Module`` stays a torch object).

    Raises:
        UntrustedFileError: a file torch.save wrote that needs more than tensors and containers, and
            ``trust`` is false.
        UnreadableFileError: not a file torch.save wrote (:func:`not_a_torch_pickle` says what it is
            instead: a TorchScript file, an ONNX model, an ``.npy``, a plain Python pickle ...), a
            missing storage, bad offsets; with ``trust``, a module or class the file names that
            Python cannot import (saying where it looked).
        LimitExceededError: the archive's members declare more than the array limit together, its
            pickle's calls do (``bytearray(n)``, ``list(range(n))``), its tensors would take more once
            copied to numpy (a tensor with stride 0 declares its whole shape), or what it holds,
            written out as a tree, would (:func:`policyport.converter.readers.unpickle.check_written_size`);
            nothing that large was read or allocated.
    """
    if isinstance(path, (bytes, bytearray)):
        refusal = not_a_torch_pickle(bytes(path), what or "the torch file")
        source, path = io.BytesIO(path), what or "the torch file"
    else:
        path = Path(path)
        if not path.is_file():
            raise UnreadableFileError(f"{path}: no such file")
        check_torch_file(path)
        refusal = not_a_torch_pickle(path, str(path))
        source = str(path)
    if refusal:
        raise UnreadableFileError(refusal)
    _check_archive_sizes(source, str(path))
    if inert_modules is not None:
        return read_torch_zip(source, what=str(path), inert_modules=tuple(inert_modules))
    try:
        import torch
    except ImportError:
        if trust:
            from ...errors import MissingDependencyError

            raise MissingDependencyError("torch", "torch", "loading a whole pickled torch module (--trust)") from None
        return read_torch_zip(source, what=str(path))
    from .unpickle import unimportable_class, user_import_path

    try:
        with warnings.catch_warnings():  # torch's note on a pickle protocol it did not write: the refusal says more
            warnings.simplefilter("ignore", UserWarning)
            with user_import_path(path) if trust and isinstance(path, Path) else contextlib.nullcontext():
                loaded = torch.load(source, map_location="cpu", weights_only=not trust)
    except Exception as e:  # noqa: BLE001 - UnpicklingError for refused globals, RuntimeError for junk
        unimportable = trust and unimportable_class(e, str(path), path if isinstance(path, Path) else None)
        if unimportable:
            raise UnreadableFileError(unimportable) from e
        text = str(e)
        refused = re.search(r"GLOBAL ([\w.]+)", text)
        if not trust and (refused or "weights_only" in text.lower() or "Weights only load failed" in text):
            damage = None if refused else _pickle_damage(source)
            if damage:  # not a pickle that asks for too much: one that is no pickle at all
                raise UnreadableFileError(f"{path} is damaged: its pickle {damage}, so it is not a file torch.save "
                                          "wrote (nothing from it ran); save the policy again") from e
            what = refused.group(1) if refused else _refused_global(source) or "objects beyond tensors and containers"
            raise UntrustedFileError(
                f"{path} asks for {what} while unpickling; torch.load(weights_only=True) rebuilds only tensors and "
                "plain containers and refused it (nothing from the file ran). A whole pickled module runs code "
                "when loaded: if you trust this file, pass --trust (trust=True)"
            ) from e
        raise UnreadableFileError(f"{path} is not a readable torch file: {text.strip().splitlines()[0] if text.strip() else type(e).__name__}") from e
    value = _tensors_to_numpy(loaded, _TensorBytes(str(path)), {})
    if not trust:
        from .unpickle import check_written_size

        check_written_size(value, str(path))
    return value


def _check_archive_sizes(source, what: str) -> None:
    """Refuse a torch zip archive whose members declare more than the array limit together, or whose
    ``data.pkl`` declares more (:func:`policyport.converter.readers.unpickle.load`: sizes its calls ask for,
    its value written out as a tree), before torch (or :func:`read_torch_zip`) reads any of it.

    ``data.pkl`` is read once more for this with policyport's restricted unpickler, torch's
    globals inert (recorded, never called) and its storages not read: torch's own weights-only
    unpickler calls what its allowlist holds (``bytearray(n)``) with no size checked. Anything but a
    size is left for the reader to say. A file that is no zip archive (torch's legacy format) is
    left alone.
    """
    from .unpickle import load

    if isinstance(source, io.BytesIO):
        source.seek(0)
    try:
        with zipfile.ZipFile(source) as zf:
            check_zip_members(zf, what)
            pickles = [n for n in zf.namelist() if n == "data.pkl" or n.endswith("/data.pkl")]
            if len(pickles) == 1:
                try:
                    load(zf.read(pickles[0]), what=what, inert_modules=("torch",), persistent_load=lambda pid: None)
                except LimitExceededError:
                    raise
                except PolicyportError:
                    pass  # refused or unreadable for another reason: the reader names it
    except LimitExceededError:
        raise
    except ZIP_ERRORS:
        pass  # not a zip archive: the legacy format, or a damaged file the reader will name
    finally:
        if isinstance(source, io.BytesIO):
            source.seek(0)


class _TensorBytes:
    """The bytes the tensors of one file take once copied to numpy, added up and checked against
    the array limit before each copy: a tensor with stride 0 (``expand``) declares its whole shape
    over a storage of a few bytes."""

    def __init__(self, what: str):
        self.what, self.total = what, 0

    def take(self, shape: tuple[int, ...], dtype: str, itemsize: int) -> None:
        """Count a tensor of ``shape``; refuse when the file's total passes the limit.

        Raises:
            LimitExceededError: naming the tensor, the total, the limit and how to raise it.
        """
        before, self.total = self.total, self.total + math.prod(shape) * itemsize
        check_array_bytes(self.total, f"{self.what}: its {dtype} tensor of shape {shape}"
                          + (" with the tensors before it" if before else ""), purpose="tensors read from a file")


def check_torch_file(path: Path) -> None:
    """Refuse, saying what it is, a ``.pt``/``.pth`` file torch would report only by an internal error.

    torch writes a zip archive whose members sit under one folder (``archive/data.pkl``); a file
    that is not a zip is left to torch (the legacy pickle format).

    Raises:
        UnreadableFileError: the file is empty, a damaged zip archive, or a Stable-Baselines3 save
            (a zip holding ``data`` and ``policy.pth`` at its top, ``stable_baselines3/common/save_util.py``).
    """
    with path.open("rb") as f:
        head = f.read(4)
    if not head:
        raise UnreadableFileError(f"{path} is empty")
    if head not in (b"PK\x03\x04", b"PK\x05\x06"):
        return
    try:
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
    except ZIP_ERRORS as e:
        raise UnreadableFileError(f"{path} is not a readable torch file (a damaged or truncated zip archive: {e})") from e
    if {"data", "policy.pth"} <= names:
        raise UnreadableFileError(f"{path} is a Stable-Baselines3 save (a zip holding data and policy.pth), not a torch "
                                  "file; convert it with --from sb3")


#: torch.save's magic number (``MAGIC_NUMBER`` in ``torch/serialization.py``) as its legacy format
#: pickles it first (a LONG1 opcode), after the protocol header and, from protocol 4, a frame header.
_LEGACY_MAGIC = b"\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19"
#: What a file torch.save wrote looks like, for the refusal of one that is not.
_TORCH_SAVE = ("torch.save writes a zip archive holding data.pkl, or, before torch 1.6, a pickle that starts "
               "with torch's magic number")


def not_a_torch_pickle(file: Path | bytes, what: str) -> str | None:
    """Why ``file`` is not something torch.load reads as a pickle of tensors or a pickled module,
    told from its first bytes and a zip archive's member names, without unpickling anything; ``None``
    for a file torch.save wrote (a zip archive holding ``data.pkl``, or the legacy format).

    Args:
        file: a path, or the bytes of an archive member (an SB3 zip's ``policy.pth``).
        what: how to name it in the message.

    Returns:
        The refusal, naming what the file is instead (:func:`policyport.io.kinds.file_kind`, or an
        ONNX model) and, for a source policyport reads another way, the kind that reads it.
    """
    from ...io.kinds import file_kind

    data = file if isinstance(file, bytes) else None
    if data is None:
        with open(file, "rb") as f:
            head = f.read(64)
    else:
        head = data[:64]
    if not head:
        return f"{what} is empty"
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        try:
            with zipfile.ZipFile(io.BytesIO(data) if data is not None else file) as zf:
                members = {n.rsplit("/", 1)[-1] for n in zf.namelist()}
        except ZIP_ERRORS as e:
            return f"{what} is a damaged or truncated zip archive ({e}), not a file torch.save wrote"
        if {"data.pkl", "constants.pkl"} <= members:
            return (f"{what} is a TorchScript file (torch.jit.save), not a state_dict or a pickled module; "
                    "policyport converts it with --from torchscript, which loads it only with --trust: loading "
                    "TorchScript runs the code the file holds")
        if "data.pkl" in members:
            return None
    elif _LEGACY_MAGIC in head[:32]:
        return None
    elif head[:1] == b"\x80":  # a pickle torch.save did not write: torch.load would run it, then refuse it
        from .unpickle import refused_global

        wanted = refused_global(data if data is not None else Path(file).read_bytes())
        asks = f", asking for {wanted}" if wanted else ""
        return (f"{what} is a Python pickle{asks}, not a file torch.save wrote ({_TORCH_SAVE}); torch.load reads "
                "no such pickle, trusted or not, and nothing from it ran: save the policy's state_dict with "
                "torch.save, or its arrays with numpy.savez")
    kind = file_kind(file) if data is None else None
    described = kind.what if kind is not None else "an ONNX model" if data is None and _is_onnx(file) else None
    if described is None:
        return f"{what} is not a file torch.save wrote: it starts with {head[:8]!r}, and {_TORCH_SAVE}"
    reads = f"; policyport converts it with --from {kind.source}" if kind is not None and kind.source else ""
    return f"{what} is {described}, not a file torch.save wrote ({_TORCH_SAVE}){reads}"


def not_torchscript(path: Path) -> str | None:
    """Why ``path`` is not a TorchScript file, told from its layout without loading it: ``None`` for
    a zip archive holding ``data.pkl`` and ``constants.pkl`` (as ``torch.jit.save`` writes,
    ``torch/csrc/jit/serialization/export_module.cpp``), else the refusal naming what the file is
    (:func:`policyport.io.kinds.file_kind`) and the ``--from`` that reads it, when one does."""
    from ...io.kinds import file_kind

    try:
        with zipfile.ZipFile(path) as zf:
            members = {n.rsplit("/", 1)[-1] for n in zf.namelist()}
    except ZIP_ERRORS:
        members = set()
    if {"data.pkl", "constants.pkl"} <= members:
        return None
    kind = file_kind(path)
    described = f": it is {kind.what}" if kind is not None else ""
    reads = f"; policyport converts it with --from {kind.source}" if kind is not None and kind.source else ""
    return (f"{path} is not a TorchScript file (torch.jit.save writes a zip archive holding data.pkl, constants.pkl "
            f"and code/){described}{reads}")


def _is_onnx(path: Path) -> bool:
    """Whether ``path`` parses as an ONNX model with a graph that has outputs (external data not read)."""
    try:
        import onnx

        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 - protobuf's DecodeError and whatever a file that is not one gives
        return False
    return model.HasField("graph") and len(model.graph.output) > 0


def _refused_global(source) -> str | None:
    """The global torch's weights-only reader refused, read from the file's pickle opcodes, for
    when torch's message does not name it (a legacy-format file, a plain pickle): the first that is
    neither a torch tensor rebuilder nor a plain container (see :func:`unpickle.refused_global`)."""
    from .unpickle import refused_global

    found = _pickle_of(source)
    return None if found is None else refused_global(found[1], allowed_roots=("torch",))


def _pickle_of(source) -> tuple[str, bytes] | None:
    """The pickle of a torch file (a path or ``io.BytesIO``), named: its zip archive's
    ``data.pkl``, or the whole file in the legacy format; None for an archive without exactly one
    ``data.pkl``, or a damaged one."""
    data = source.getvalue() if isinstance(source, io.BytesIO) else Path(source).read_bytes()
    if not zipfile.is_zipfile(io.BytesIO(data)):
        return "pickle", data
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            pickles = [n for n in zf.namelist() if n == "data.pkl" or n.endswith("/data.pkl")]
            return ("data.pkl", zf.read(pickles[0])) if len(pickles) == 1 else None
    except ZIP_ERRORS:  # a damaged archive names no global and holds no pickle to parse
        return None


def _pickle_damage(source) -> str | None:
    """What makes a torch file's pickle no pickle at all (a byte that is no opcode, an end before
    its STOP), read with ``pickletools.genops``, which only parses; None for a well-formed one.
    torch's weights-only reader reports both as a failure of its own, as it reports a refused global."""
    import pickletools

    found = _pickle_of(source)
    if found is None:
        return None
    name, data = found
    try:
        for _ in pickletools.genops(data):
            pass
    except ValueError as e:  # an unknown opcode, data exhausted before STOP
        return f"({name}, {len(data):,} bytes starting {data[:8]!r}) is not one: {e}"
    return None


def _tensors_to_numpy(value, sizes: _TensorBytes, done: dict[int, tuple], name: str = ""):
    """``value`` with every tensor copied to a numpy array (each counted in ``sizes`` first), in
    dicts, lists and tuples; each object once (``done``: id -> (object, converted)), so what torch's
    unpickler shares stays shared and a list DAG costs one step per list, not per path. ``name``:
    where in the file ``value`` is, for messages (``sizes.what`` names the file).

    Raises:
        UnreadableFileError: a tensor numpy cannot hold as it is: sparse or another non-strided
            layout, quantized, or an element type numpy lacks (float8 without ml_dtypes, ...).
        LimitExceededError: the tensors together would take more than the array limit.
    """
    import torch

    if not isinstance(value, (torch.Tensor, dict, list, tuple)) or isinstance(value, torch.nn.Module):
        return value
    if id(value) in done:
        return done[id(value)][1]
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        sizes.take(tuple(t.shape), str(t.dtype).replace("torch.", ""), t.element_size())
        shown = f"{sizes.what}: tensor {name!r}" if name else sizes.what
        if t.layout != torch.strided:
            raise UnreadableFileError(f"{shown} is stored as {t.layout}; policyport reads dense tensors: save the "
                                      "state_dict with each tensor made dense (tensor.to_dense())")
        if t.is_quantized:
            raise UnreadableFileError(f"{shown} is quantized ({t.dtype}); policyport converts floating-point policies: "
                                      "save the state_dict of the model before quantization (or tensor.dequantize())")
        element = str(t.dtype).removeprefix("torch.")
        if element in ML_DTYPES:  # the same bits, as ml_dtypes' numpy dtype of that name
            bits = t.view(torch.uint8 if t.element_size() == 1 else torch.int16)
            out = bits.numpy().copy().view(_numpy_dtype(element, sizes.what))
        else:
            try:
                out = t.numpy().copy()
            except TypeError as e:  # an element type numpy has no dtype for
                raise UnreadableFileError(f"{shown} holds {t.dtype} elements, which numpy has no dtype for") from e
    elif isinstance(value, dict):
        out = {}
        done[id(value)] = (value, out)
        out.update((k, _tensors_to_numpy(v, sizes, done, f"{name}.{k}" if name else str(k))) for k, v in value.items())
    elif isinstance(value, list):
        out = []
        done[id(value)] = (value, out)
        out.extend(_tensors_to_numpy(v, sizes, done, f"{name}[{i}]") for i, v in enumerate(value))
    else:
        out = type(value)(_tensors_to_numpy(v, sizes, done, f"{name}[{i}]") for i, v in enumerate(value))
    done[id(value)] = (value, out)
    return out


class _StorageType:
    """What ``torch.<Type>Storage`` stands for in the pickle: its element dtype."""

    def __init__(self, name: str):
        self.name, self.dtype_name = name, STORAGE_DTYPES[name]


def read_torch_zip(source, what: str | None = None, inert_modules: Iterable[str] = ()) -> object:
    """Read torch's zip serialization without torch (see the module docstring).

    Args:
        source: the file, or a file object.
        what: how to name it in messages.
        inert_modules: module prefixes whose globals, functions included, become inert records
            instead of being refused (for a payload beside the weights that a reader never uses,
            such as the ``infos`` an rsl_rl checkpoint pickles); nothing from them is called.

    Raises:
        UnreadableFileError: the legacy (pre-1.6) format, a damaged archive, a missing ``data.pkl``
            or storage, a byte order other than little or big, a tensor reaching outside its storage.
        UntrustedFileError: the pickle asks for anything but tensors and containers.
        LimitExceededError: the archive's members, a storage or the tensors once copied declare more
            than the array limit (checked before each is read or copied).
    """
    path = what or str(source)
    try:
        return _read_torch_zip(source, path, inert_modules)
    except ZIP_ERRORS as e:  # a member that fails its CRC, corrupt deflate data ... as its storages are read
        if isinstance(e, PolicyportError):
            raise
        raise UnreadableFileError(f"{path} is a damaged torch zip archive: {e}") from e


def _read_torch_zip(source, path: str, inert_modules: Iterable[str] = ()) -> object:
    from .unpickle import load

    try:
        zf = zipfile.ZipFile(source)
    except ZIP_ERRORS:
        raise UnreadableFileError(
            f"{path} is not a torch zip archive (torch >= 1.6 writes one); reading the legacy format needs torch "
            "installed: pip install 'policyport[torch]'"
        ) from None
    with zf:
        names = zf.namelist()
        pickles = [n for n in names if n == "data.pkl" or n.endswith("/data.pkl")]
        if len(pickles) != 1:
            raise UnreadableFileError(f"{path} is a zip archive but not a torch file (no single data.pkl)")
        prefix = pickles[0][: -len("data.pkl")]
        check_zip_members(zf, path)
        order = (read_zip_member(zf, f"{prefix}byteorder", path).decode("ascii", "replace").strip()
                 if f"{prefix}byteorder" in names else "little")
        if order not in ("little", "big"):
            raise UnreadableFileError(f"{path}: its byteorder member says {order[:20]!r}, not little or big")
        storages: dict[str, np.ndarray] = {}
        sizes = _TensorBytes(path)

        def persistent_load(pid):
            if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _StorageType)):
                raise UntrustedFileError(f"{path} holds a persistent id this reader does not rebuild: {bounded_repr(pid):.80}")
            _, storage_type, key, _location, numel = pid
            if key not in storages:
                member = f"{prefix}data/{key}"
                if member not in names:
                    raise UnreadableFileError(f"{path} lacks the storage {member}")
                dtype = _numpy_dtype(storage_type.dtype_name, str(path)).newbyteorder("<" if order == "little" else ">")
                raw = read_zip_member(zf, member, path)
                if len(raw) < int(numel) * dtype.itemsize:
                    raise UnreadableFileError(f"{path}: storage {key} holds {len(raw)} bytes, expected {numel} x {dtype.itemsize}")
                storages[key] = np.frombuffer(raw, dtype=dtype, count=int(numel))
            return storages[key]

        def rebuild_tensor(storage, offset, size, stride,
                           requires_grad=False, hooks=None, metadata=None):  # pragma: no mutate (flags unused)
            size, stride = tuple(int(s) for s in size), tuple(int(s) for s in stride)
            if not isinstance(storage, np.ndarray) or len(size) != len(stride) or offset < 0 or any(s < 0 for s in (*size, *stride)):
                raise UnreadableFileError(f"{path} holds a malformed tensor (size {size}, stride {stride}, offset {offset})")
            if math.prod(size) and offset + sum((n - 1) * s for n, s in zip(size, stride)) >= storage.size:
                raise UnreadableFileError(f"{path} holds a tensor reaching outside its storage (size {size}, stride {stride})")
            sizes.take(size, storage.dtype.name, storage.itemsize)  # its copy, whatever its strides
            view = np.lib.stride_tricks.as_strided(storage[offset:], size, [s * storage.itemsize for s in stride],
                                                   writeable=False)  # pragma: no mutate (copied at once)
            return np.array(view, dtype=storage.dtype.newbyteorder("="))

        rebuilders = {
            ("torch._utils", "_rebuild_tensor_v2"): rebuild_tensor,
            ("torch._utils", "_rebuild_parameter"):
                lambda data, requires_grad=False, hooks=None: data,  # pragma: no mutate (flags unused)
            ("torch._utils", "_rebuild_parameter_with_state"): lambda data, requires_grad, hooks, state: data,
            **{("torch", name): _StorageType(name) for name in STORAGE_DTYPES},
        }
        return load(read_zip_member(zf, pickles[0], path), what=str(path), rebuilders=rebuilders,
                    persistent_load=persistent_load, inert_modules=inert_modules)


def read_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """The tensors of a ``.safetensors`` file, by name, in file order.

    Raises:
        UnreadableFileError: a malformed header, an unknown dtype, offsets outside the data.
    """
    path = Path(path)
    try:
        from safetensors.numpy import load_file
    except ImportError:
        return _read_safetensors_layout(path)
    try:
        return dict(load_file(str(path)))
    except Exception as e:  # noqa: BLE001 - SafetensorError and friends
        raise UnreadableFileError(f"{path} is not a readable .safetensors file: {e}") from e


def _read_safetensors_layout(path: Path) -> dict[str, np.ndarray]:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UnreadableFileError(f"cannot read {path}: {e}") from e
    if len(data) < 8:
        raise UnreadableFileError(f"{path} is not a .safetensors file: {len(data)} bytes")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise UnreadableFileError(f"{path} is not a .safetensors file: header length {n} exceeds the file")
    header = load_json(data[8:8 + n], f"{path} is not a .safetensors file: its header", error=UnreadableFileError)
    if not isinstance(header, dict):
        raise UnreadableFileError(f"{path} is not a .safetensors file: its header is a JSON {type(header).__name__}, "
                                  "not an object")
    body = memoryview(data)[8 + n:]
    arrays = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = _numpy_dtype(SAFETENSORS_DTYPES[entry["dtype"]], str(path)).newbyteorder("<")
            shape = tuple(int(d) for d in entry["shape"])
            begin, end = (int(o) for o in entry["data_offsets"])
        except (KeyError, TypeError, ValueError) as e:
            raise UnreadableFileError(f"{path}: tensor {name!r} has a malformed header entry {entry!r:.120}") from e
        if not 0 <= begin <= end <= len(body) or end - begin != math.prod(shape) * dtype.itemsize:
            raise UnreadableFileError(f"{path}: tensor {name!r} offsets {begin}..{end} do not fit shape {shape} {dtype} "
                                      f"within {len(body)} data bytes")
        arrays[name] = np.frombuffer(body[begin:end], dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="))
    return arrays


def as_state_dict(value, path) -> dict[str, np.ndarray]:
    """``value`` as a flat name -> array mapping, or a refusal saying what the file holds instead.

    Raises:
        BadModelError: not a mapping of arrays (a pickled object, nested or non-array entries).
    """
    from .unpickle import Record

    if isinstance(value, Record):
        raise UntrustedFileError(
            f"{path} holds a whole pickled object ({value.global_name}), not a state_dict; loading it runs code "
            "from the file: if you trust it, pass --trust (trust=True)"
        )
    if not isinstance(value, dict):
        raise BadModelError(f"{path} holds a {type(value).__name__}, not a state_dict (a mapping of parameter names to tensors)")
    bad = [str(k) for k, v in value.items() if not isinstance(v, np.ndarray)]
    if bad:
        raise BadModelError(f"{path} is not a flat state_dict: {', '.join(bad[:10])} {'is' if len(bad) == 1 else 'are'} not tensors")
    return {str(k): v for k, v in value.items()}


def keep_state_dict_layout(model, state_dict, *, every_integer: bool = False) -> list[str]:
    """Make ``extract`` give back the whole ``state_dict`` in its own order (changes ``model``'s metadata).

    Small integer buffers that no computation reads (``BatchNorm.num_batches_tracked``), and so are
    not in the graph, are recorded as ``"value"`` entries of the parameter metadata (at most
    :data:`~policyport.graph.passes.MAX_VALUE_ELEMENTS` elements); the order of the state_dict's keys
    is recorded as ``policyport.parameter_order`` (see :func:`policyport.graph.passes.parameter_map`).

    Args:
        model: an ``onnx.ModelProto`` whose ``policyport.parameters`` metadata a converter wrote.
        state_dict: the source's arrays, name -> array, in the source's order.
        every_integer: record every small integer entry the graph does not hold, whatever its name
            (a live module's own counters, such as rsl_rl's ``EmpiricalNormalization.count``), not
            only ``num_batches_tracked`` (default ``False``: a file's entries are known by name).

    Returns:
        The names recorded as values, in the state_dict's order.
    """
    from ...graph.passes import MAX_VALUE_ELEMENTS, ORDER_KEY, PARAMETERS_KEY

    props = {p.key: p for p in model.metadata_props}
    mapping = load_json(props[PARAMETERS_KEY].value, f"model metadata {PARAMETERS_KEY!r}") if PARAMETERS_KEY in props else {}
    mapped = {v if isinstance(v, str) else v["name"] for v in mapping.values()}
    mapped |= {a for v in mapping.values() if isinstance(v, dict) for a in v.get("also", [])}
    for name, array in state_dict.items():
        array = np.asarray(array)
        if name not in mapped and (every_integer or name.endswith("num_batches_tracked")) and array.dtype.kind in "iu" \
                and array.size <= MAX_VALUE_ELEMENTS:
            mapping[name] = {"name": name, "value": {"dtype": array.dtype.name, "shape": list(array.shape),
                                                     "data": array.ravel().tolist()}}
            mapped.add(name)
    order = [name for name in state_dict if name in mapped]
    for key, value in ((PARAMETERS_KEY, json.dumps(mapping)), (ORDER_KEY, json.dumps(order))):
        if key in props:
            props[key].value = value
        else:
            entry = model.metadata_props.add()
            entry.key, entry.value = key, value
    return [name for name in state_dict if isinstance(mapping.get(name), dict) and "value" in mapping[name]]
