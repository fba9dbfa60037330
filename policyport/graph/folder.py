"""A packed folder's files: what the format allows, their limits, and the one integrity check.

Every reader of a packed folder — :func:`policyport.load`, ``verify``, ``run``, ``inspect``,
``extract``, ``expose``, ``pack`` and ``export-numpy`` on a folder, and the folder's own ``run.py``
— opens it through :func:`read_bundle` (:func:`open_bundle`, then the contents: both JSON documents
against their schemas, every ``.npz`` member's header), and :func:`open_bundle`, before it returns
a single byte:

* reads ``policy.json`` (at most :data:`MAX_POLICY_BYTES`) and validates it against
  :data:`POLICY_SCHEMA`;
* accepts only the file names the format defines (:func:`listed_files`);
* opens each listed file relative to the folder's descriptor without following a symbolic link
  (``O_NOFOLLOW`` on every path component), checks on the opened descriptor that it is a regular
  file, and checks its size against its limit *before* hashing or reading it;
* compares its sha256 with the one ``policy.json`` records. A file that is refused is never hashed,
  and no message ever shows the digest of what was found.

The module imports the standard library alone (:func:`read_bundle` imports numpy when called), so
``run.py`` can check a folder's files before importing the numpy runtime it carries. The folder's layout (format ``policyport.bundle/1``) is described in
:mod:`policyport.runtime.packed`.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import re
import stat
import zipfile
from pathlib import Path
from typing import Any

from ..errors import ZIP_ERRORS, BadModelError, UnreadableFileError
from ..io.entries import folder_entries, folder_entries_at  # noqa: F401  (re-exported: the format's readers list folders with them)
from ..io.schema import (
    Anything,
    Const,
    Either,
    Int,
    ListOf,
    MapOf,
    Null,
    Num,
    Obj,
    OneOf,
    Str,
    Where,
    load_json,
)

#: The value of ``policy.json``'s ``"format"`` key that this version writes and reads.
BUNDLE_FORMAT = "policyport.bundle/1"

MODEL_FILE = "model.onnx"
GRAPH_FILE = "graph.json"
WEIGHTS_FILE = "weights.npz"
CONSTANTS_FILE = "constants.npz"
GOLDEN_FILE = "golden.npz"
POLICY_FILE = "policy.json"
#: The data files every bundle lists in ``policy.json``.
DATA_FILES = (MODEL_FILE, GRAPH_FILE, WEIGHTS_FILE, CONSTANTS_FILE, GOLDEN_FILE)
#: The entry point and the private package of a folder that carries its own runtime.
ENTRY_POINT = "run.py"
RUNTIME_PACKAGE = "_policyport"
#: A runtime file: a ``.py`` file below ``_policyport/``, lowercase identifiers, at most 4 folders deep.
RUNTIME_FILE = re.compile(r"_policyport(?:/[a-z_][a-z0-9_]*){0,4}/[a-z_][a-z0-9_]*\.py")

#: Names of what Python can import, or read instead of a source: modules, bytecode, extension
#: modules, path configuration files, bytecode caches. Only listed files may have such a name.
IMPORTABLE = re.compile(r"__pycache__|.+\.(?:py|pyc|pyo|pyw|pyd|so|pth|zip|egg)", re.IGNORECASE)

# Limits, checked on the opened file's size before it is hashed or read (bytes).
#: ``policy.json``.
MAX_POLICY_BYTES = 1 << 20
#: ``graph.json`` (its initializers travel in the .npz files; attribute tensors are all it holds of size).
MAX_GRAPH_BYTES = 16 << 20
#: ``run.py`` and each file of the runtime, and how many runtime files there may be.
MAX_CODE_BYTES = 1 << 20
MAX_RUNTIME_FILES = 64
#: Nesting of arrays and objects in either JSON document.
MAX_JSON_DEPTH = 32
#: ``model.onnx`` and each .npz file, unless the environment variable below says otherwise.
DEFAULT_MAX_DATA_BYTES = 1 << 30
DATA_LIMIT_VARIABLE = "POLICYPORT_BUNDLE_MAX_BYTES"

#: The key of ``graph.json`` that says where each initializer's array is stored.
SOURCES_KEY = "initializer_sources"

#: Key groups of ``golden.npz``: ``<group>/<tensor name>``.
GOLDEN_GROUPS = ("inputs", "outputs", "activations")

#: How many arrays one .npz of a bundle may hold.
MAX_NPZ_ARRAYS = 65536


#: Element types a bundle may name (numpy's own, and those of the optional ml_dtypes package).
DTYPE_NAMES = (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
    "bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "uint4", "int4",
    "float4_e2m1fn", "float8_e8m0fnu", "uint2", "int2", "float6_e2m3fn", "float6_e3m2fn",
)
DTYPE = OneOf(*DTYPE_NAMES, what="an element type name (float32, int64, ...; see policyport.graph.folder.DTYPE_NAMES)")
SHA256 = Str(64, r"[0-9a-f]{64}", "a sha256 hex digest")
NAME = Str(65536)
VALUE_INFO = Obj({"name": NAME, "dtype": DTYPE, "shape": Null | ListOf(Either(Int(0), Str(256), Null), 64)})

#: ``policy.json``: the keys the reader uses are typed exactly; ``provenance``, ``golden``, ``parity``,
#: ``observation_filter`` and ``assumptions`` (what the model rests on that its source file does not
#: record; absent from folders packed before policyport recorded them) are informational (any JSON
#: within the size and depth limits).
POLICY_SCHEMA = Obj(
    {
        "format": Const(BUNDLE_FORMAT),
        "inputs": ListOf(VALUE_INFO, 4096),
        "outputs": ListOf(VALUE_INFO, 4096),
        "head": Null | Str(256),
        "observation_filter": Anything(),
        "provenance": MapOf(Str(256), Anything()),
        "golden": MapOf(Str(256), Anything()),
        "parity": MapOf(Str(256), Anything()),
        "files": MapOf(Str(256), SHA256, 1 + len(DATA_FILES) + MAX_RUNTIME_FILES),
    },
    {
        "assumptions": Anything(),
        "runtime": Obj({
            "package": Const(RUNTIME_PACKAGE),
            "entry_point": Const(ENTRY_POINT),
            "policyport_version": Str(64),
            "digest": SHA256,
            "requires_python": Str(64),
            "requires": ListOf(Str(128), 16),
        }),
    },
)


def _tensor_size(t: dict) -> str | None:
    count = 1
    for d in t["shape"]:
        count *= d
    if count != len(t["data"]):
        return f"holds {len(t['data'])} values but its shape {t['shape']} has {count} elements"
    return None


_TENSOR = Obj({"tensor": Where(Obj({
    "dtype": OneOf(*(n for n in DTYPE_NAMES if not n.startswith("complex")), what="a real or boolean element type name"),
    "shape": ListOf(Int(0), 32),
    "data": ListOf(Num() | OneOf(True, False)),
}), _tensor_size)})
_ATTR_ITEM = Either(Num(), Str(1 << 24), _TENSOR)
_ATTR = Either(_ATTR_ITEM, Obj({"list": ListOf(_ATTR_ITEM)}))

#: ``graph.json``: :meth:`policyport.graph.model.Graph.to_json` plus ``initializer_sources``.
GRAPH_SCHEMA = Obj({
    "format": Const("policyport.graph/1"),
    "opsets": MapOf(Str(256), Int(1, 10_000)),
    "metadata": MapOf(Str(4096), Str(1 << 24)),
    "inputs": ListOf(VALUE_INFO),
    "outputs": ListOf(VALUE_INFO),
    "initializers": ListOf(Obj({"name": NAME, "dtype": DTYPE, "shape": ListOf(Int(0), 32)})),
    "nodes": ListOf(Obj({
        "op_type": Str(128),
        "domain": Str(256),
        "name": NAME,
        "inputs": ListOf(NAME, 65536),
        "outputs": ListOf(NAME, 65536),
        "attrs": MapOf(Str(256), _ATTR, 1024),
    })),
    "initializer_sources": MapOf(NAME, Obj({
        "file": OneOf(WEIGHTS_FILE, CONSTANTS_FILE),
        "key": NAME,
        "transpose": Null | ListOf(Int(0, 31), 32),
    })),
}, {
    "optional_inputs": ListOf(VALUE_INFO),
})


def data_limit() -> int:
    """The size limit of ``model.onnx`` and each .npz file, in bytes (1 GiB unless
    ``POLICYPORT_BUNDLE_MAX_BYTES`` says otherwise).

    Raises:
        BadModelError: the environment variable is not a positive integer.
    """
    text = os.environ.get(DATA_LIMIT_VARIABLE)
    if text is None:
        return DEFAULT_MAX_DATA_BYTES
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise BadModelError(f"{DATA_LIMIT_VARIABLE}={text!r}: expected a positive number of bytes")
    return value


def size_limit(name: str) -> int:
    """The largest size, in bytes, that the bundle file ``name`` may have."""
    if name == POLICY_FILE:
        return MAX_POLICY_BYTES
    if name == GRAPH_FILE:
        return MAX_GRAPH_BYTES
    if name in DATA_FILES:
        return data_limit()
    return MAX_CODE_BYTES


def parse_json(data: bytes, document: str, schema) -> Any:
    """A JSON document decoded, parsed, depth-checked and validated against ``schema``.

    Raises:
        BadModelError: not UTF-8, not JSON, nested deeper than :data:`MAX_JSON_DEPTH`, or not
            fitting the schema (the message names the place).
    """
    return schema.validate(load_json(data, document, depth=MAX_JSON_DEPTH), document)


def listed_files(policy: dict, document: str) -> list[str]:
    """The files a validated ``policy.json`` lists: the data files, then run.py and the runtime.

    Raises:
        BadModelError: a data file is not listed; a name is not one the format defines; runtime
            files without a ``runtime`` section, or a ``runtime`` section without them.
    """
    files, runtime = policy["files"], policy.get("runtime")
    missing = [n for n in DATA_FILES if n not in files]
    if missing:
        raise BadModelError(f"{document} lists no sha256 for {', '.join(missing)}; a bundle lists {', '.join(DATA_FILES)}")
    code = [n for n in files if n not in DATA_FILES]
    for name in code:
        if name != ENTRY_POINT and not RUNTIME_FILE.fullmatch(name):
            raise BadModelError(
                f"{document}: {name!r} is not a file of the bundle format, which lists {', '.join(DATA_FILES)} "
                f"and, for a folder that carries its runtime, {ENTRY_POINT} and {RUNTIME_PACKAGE}/**/*.py"
            )
    if runtime is None and code:
        raise BadModelError(f"{document} lists {', '.join(code[:3])} but has no 'runtime' section to describe them")
    if runtime is not None:
        needed = [n for n in (ENTRY_POINT, f"{RUNTIME_PACKAGE}/__init__.py") if n not in files]
        if needed:
            raise BadModelError(f"{document} has a 'runtime' section but lists no sha256 for {', '.join(needed)}")
        if len(code) - 1 > MAX_RUNTIME_FILES:
            raise BadModelError(f"{document} lists {len(code) - 1} runtime files; at most {MAX_RUNTIME_FILES} are allowed")
    return [*DATA_FILES, *code]


def runtime_digest(files: dict[str, str]) -> str:
    """sha256 over the sorted ``name sha256`` lines of the runtime files (``_policyport/...``)."""
    lines = "".join(f"{n} {files[n]}\n" for n in sorted(n for n in files if n.startswith(RUNTIME_PACKAGE + "/")))
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()


def runtime_modules(policy: dict) -> list[str]:
    """The dotted module names (relative to the runtime package) of a policy's runtime files, sorted."""
    names = []
    for name in policy["files"]:
        if name.startswith(RUNTIME_PACKAGE + "/"):
            parts = name[len(RUNTIME_PACKAGE) + 1:-3].split("/")
            if parts[-1] == "__init__":
                parts.pop()
            if parts:
                names.append(".".join(parts))
    return sorted(names)


def not_packed(directory: str | os.PathLike) -> str:
    """The message for a folder without :data:`POLICY_FILE` given where a model goes: what was
    expected instead, and the ``.onnx`` files it holds, if any (the likely meant model)."""
    directory = Path(directory)
    try:
        models = sorted(p.name for p in directory.glob("*.onnx") if p.is_file())
    except OSError:
        models = []
    held = ""
    if models:
        shown = ", ".join(models[:3]) + (f" and {len(models) - 3:,} more" if len(models) > 3 else "")
        held = f"; it holds {shown}: give {'that file' if len(models) == 1 else 'one of those files'} itself"
    return (f"{directory} is a folder without {POLICY_FILE}, so not one written by policyport pack; expected an "
            f".onnx model or a folder written by policyport pack{held}")


def read_policy(directory: str | os.PathLike) -> dict[str, Any]:
    """The validated ``policy.json`` of a packed folder, after checking every file it lists.

    Raises:
        As :func:`open_bundle`.
    """
    return open_bundle(directory)[0]


def open_bundle(directory: str | os.PathLike, needed: tuple[str, ...] = (), *,
                folder_fd: int | None = None) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Check a packed folder and read the files in ``needed`` (the one integrity check).

    Args:
        directory: the folder.
        needed: names of listed files whose bytes to return.
        folder_fd: a descriptor of the folder, already open, to read its files through (relative
            to it) instead of opening ``directory`` (which then only names it in messages).

    Returns:
        ``(policy, blobs)``: the validated ``policy.json`` and ``{name: bytes}`` for ``needed``.

    Raises:
        UnreadableFileError: the folder or its ``policy.json`` is missing, or a file cannot be read.
        BadModelError: ``policy.json`` is not a valid ``policyport.bundle/1`` document; a listed
            file is missing, a symbolic link, not a regular file, larger than its limit, or has
            another sha256 than ``policy.json`` records; the runtime digest does not match.
    """
    directory = Path(directory)
    with _Folder(directory, folder_fd) as folder:
        document = str(directory / POLICY_FILE)
        policy = _parse_policy(folder.read(POLICY_FILE, missing_is_bundle=False), document)
        names = listed_files(policy, document)
        unlisted = [n for n in needed if n not in names]
        if unlisted:
            raise BadModelError(f"{document} lists no sha256 for {', '.join(unlisted)}")
        blobs: dict[str, bytes] = {}
        for name in names:
            if name in needed:
                blobs[name] = folder.read(name)
                found = hashlib.sha256(blobs[name]).hexdigest()
            else:
                found = folder.sha256(name)
            if found != policy["files"][name]:
                raise BadModelError(
                    f"{directory / name}: its content differs from the sha256 {POLICY_FILE} records; the "
                    "file was changed or damaged after packing — restore the file, or pack the model again into a new "
                    "folder (pack --force replaces only an intact bundle)"
                )
        _refuse_unlisted_code(directory, folder.entries(), names, document)
    runtime = policy.get("runtime")
    if runtime is not None and runtime_digest(policy["files"]) != runtime["digest"]:
        raise BadModelError(f"{document}: the runtime files do not add up to the runtime digest it records")
    return policy, blobs


def read_bundle(directory: str | os.PathLike, needed: tuple[str, ...] = (), *,
                folder_fd: int | None = None) -> tuple[dict[str, Any], dict[str, bytes], Any, dict[str, dict]]:
    """The check every reader of a packed folder makes where numpy is installed, and what it read.

    :func:`open_bundle` (sizes, regular files, every sha256), then the contents, before any of them
    is used: ``graph.json`` against :data:`GRAPH_SCHEMA` and rebuilt as a graph, every member of
    ``weights.npz``, ``constants.npz`` and ``golden.npz`` read as a plain uncompressed array whose
    header matches its bytes, ``golden.npz``'s keys in their groups. ``inspect``, ``extract``,
    ``expose``, ``run``, ``verify``, ``pack`` and ``export-numpy`` of a folder, and
    :func:`policyport.load`, all read it through this one function. (``run.py`` runs
    :func:`read_policy` before it imports numpy, then this check when it loads the graph.)

    Args:
        directory: a folder written by :func:`policyport.handoff.pack.pack`.
        needed: more listed files whose bytes to return (``model.onnx``).
        folder_fd: as for :func:`open_bundle`.

    Returns:
        ``(policy, blobs, graph, golden)``: the validated ``policy.json``; ``{name: bytes}`` of the
        files read; the :class:`policyport.graph.model.Graph` with its initializers; the golden arrays by
        group (``{"inputs": {name: array}, "outputs": ..., "activations": ...}``).

    Raises:
        As :func:`open_bundle`; BadModelError also for a document that does not fit its schema, an
        .npz that is not plain uncompressed arrays, an initializer missing or misshapen, or a
        golden key outside its groups.
    """
    directory = Path(directory)
    policy, blobs = open_bundle(directory, tuple(dict.fromkeys((GRAPH_FILE, WEIGHTS_FILE, CONSTANTS_FILE,
                                                                 GOLDEN_FILE, *needed))), folder_fd=folder_fd)
    graph = _graph_from(blobs, directory)
    golden = _split_golden(_read_npz(blobs[GOLDEN_FILE], directory / GOLDEN_FILE), directory / GOLDEN_FILE)
    return policy, blobs, graph, golden


def _graph_from(blobs: dict[str, bytes], directory: Path):
    from .model import Graph

    doc = parse_json(blobs[GRAPH_FILE], str(directory / GRAPH_FILE), GRAPH_SCHEMA)
    stores = {
        WEIGHTS_FILE: _read_npz(blobs[WEIGHTS_FILE], directory / WEIGHTS_FILE),
        CONSTANTS_FILE: _read_npz(blobs[CONSTANTS_FILE], directory / CONSTANTS_FILE),
    }
    initializers: dict = {}
    for name, spec in doc[SOURCES_KEY].items():
        store, key, perm = spec["file"], spec["key"], spec["transpose"]
        if key not in stores[store]:
            raise BadModelError(f"{directory / store} has no array {key!r}, which initializer {name!r} needs")
        array = stores[store][key]
        if perm is not None and sorted(perm) != list(range(array.ndim)):
            raise BadModelError(
                f"{directory / GRAPH_FILE}: initializer {name!r} has transpose {perm}, which is not a "
                f"permutation of the {array.ndim} axes of {key!r} {list(array.shape)}"
            )
        initializers[name] = place_initializer(array, perm)
    try:
        return Graph.from_json(blobs[GRAPH_FILE].decode("utf-8"), initializers)
    except OverflowError as e:  # an integer attribute beyond its element type
        raise BadModelError(f"{directory / GRAPH_FILE}: an attribute tensor holds a value its element type "
                            f"cannot ({e})") from None


def _read_npz(data: bytes, path: Path) -> dict:
    """Every array of a bundle's ``.npz`` held in memory, each header checked before it is read.

    A bundle's archives are uncompressed (as :func:`policyport.io.arrays.write_npz` writes them) and hold
    at most :data:`MAX_NPZ_ARRAYS` arrays; each member is then read as every ``.npz`` policyport reads
    (:func:`policyport.io.arrays.read_npz`: plain element types only, headers checked against the bytes
    there, sizes against the folder's data limit), so an array takes no more memory than the file.
    """
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            infos = zf.infolist()
        if len(infos) > MAX_NPZ_ARRAYS:
            raise BadModelError(f"{path} holds {len(infos)} arrays; a bundle's .npz may hold at most {MAX_NPZ_ARRAYS}")
        for info in infos:
            if info.compress_type != zipfile.ZIP_STORED:
                raise BadModelError(f"{path}: member {info.filename!r} is compressed; a bundle's .npz files are "
                                    "uncompressed (as policyport pack writes them)")
        from ..io.arrays import read_npz

        return read_npz(io.BytesIO(data), str(path), max_bytes=data_limit(), max_arrays=MAX_NPZ_ARRAYS)
    except UnreadableFileError as e:  # a damaged file of the bundle: the bundle is bad
        raise BadModelError(str(e)) from e
    except ZIP_ERRORS as e:
        if isinstance(e, BadModelError):
            raise
        raise BadModelError(f"{path} is not a readable .npz of plain arrays: {e}") from e


def place_initializer(array, perm: list[int] | None):
    """The initializer from its stored array: ``numpy.transpose(array, perm)``, contiguous."""
    return array if perm is None else array.transpose(perm).copy(order="C")


def _split_golden(arrays: dict, path: Path) -> dict[str, dict]:
    groups: dict[str, dict] = {g: {} for g in GOLDEN_GROUPS}
    for key, array in arrays.items():
        group, sep, tensor = key.partition("/")
        if not sep or group not in groups:
            raise BadModelError(
                f"{path}: key {key!r} is not <group>/<tensor> with group one of {', '.join(GOLDEN_GROUPS)}"
            )
        groups[group][tensor] = array
    return groups


def _refuse_unlisted_code(directory: Path, entries: tuple[list[str], list[str], list[str]], listed: list[str],
                          document: str) -> None:
    """Refuse a file or folder Python could import from the folder that ``policy.json`` does not list
    (a ``hashlib.py`` beside ``run.py`` would shadow the standard library's, a ``__pycache__`` would
    stand in for the runtime's sources), whatever it is (a file, a folder, a link); ``entries`` are
    the folder's (:func:`folder_entries`)."""
    files, folders, others = entries
    planted = [n for n in sorted((*files, *folders, *others)) if n not in listed and IMPORTABLE.fullmatch(n.rsplit("/", 1)[-1])]
    if planted:
        shown = ", ".join(repr(n) for n in planted[:5]) + (f" and {len(planted) - 5} more" if len(planted) > 5 else "")
        raise BadModelError(f"{directory}: holds Python code that {document} does not list ({shown}); a packed folder "
                            "holds only the files it lists — remove them, or pack the model again into a new folder")


def _parse_policy(data: bytes, document: str) -> dict[str, Any]:
    try:
        head = load_json(data, document)
    except BadModelError:
        head = None  # parse_json below says what is wrong
    if isinstance(head, dict) and head.get("format") != BUNDLE_FORMAT:
        found = head.get("format")
        raise BadModelError(f"{document}: expected format {BUNDLE_FORMAT!r}, found {found!r:.80}; "
                            "re-pack the model with this version of policyport")
    return parse_json(data, document, POLICY_SCHEMA)


# ------------------------------------------------------------------------------------ safe opening

_DIR_FD = os.open in os.supports_dir_fd and os.stat in os.supports_dir_fd and hasattr(os, "O_NOFOLLOW")
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_CHUNK = 1 << 20


class _Folder:
    """A folder opened once; its files are opened relative to its descriptor, never through a link.

    Where the platform lacks ``dir_fd`` and ``O_NOFOLLOW`` (Windows), each path component is checked
    with ``lstat`` and the opened file's identity compared with what ``lstat`` saw.
    """

    def __init__(self, path: Path, fd: int | None = None):
        self.path = path
        try:
            if fd is not None and _DIR_FD:
                self.fd = os.dup(fd)
            elif _DIR_FD:
                self.fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC)
            else:
                self.fd = None
                if not stat.S_ISDIR(os.stat(path).st_mode):
                    raise NotADirectoryError(errno.ENOTDIR, "not a folder")
        except FileNotFoundError:
            raise UnreadableFileError(f"{path}: no such folder (expected a bundle written by policyport pack)") from None
        except NotADirectoryError:
            raise UnreadableFileError(f"{path} is not a folder (expected a bundle written by policyport pack)") from None
        except OSError as e:
            raise UnreadableFileError(f"cannot open {path}: {e.strerror}") from None

    def __enter__(self) -> _Folder:
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)

    def entries(self) -> tuple[list[str], list[str], list[str]]:
        """Everything below the folder (:func:`folder_entries`), read through its descriptor where there is one."""
        return folder_entries_at(self.fd) if self.fd is not None else folder_entries(self.path)

    def open(self, name: str, missing_is_bundle: bool = True) -> tuple[int, int]:
        """``(descriptor, size limit)`` of the regular file ``name`` (``/``-separated), its size checked."""
        shown = self.path / name
        try:
            fd = self._open(name.split("/"))
        except FileNotFoundError:
            if not missing_is_bundle:
                raise UnreadableFileError(not_packed(self.path)) from None
            raise BadModelError(f"{self.path} is incomplete: {POLICY_FILE} lists {name}, which is missing") from None
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.EMLINK, errno.ENOTDIR):
                raise BadModelError(f"{shown} is (or lies behind) a symbolic link or is not a regular file; "
                                    "a bundle holds regular files inside its folder only") from None
            raise UnreadableFileError(f"cannot read {shown}: {e.strerror}") from None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            raise BadModelError(f"{shown} is not a regular file; a bundle holds regular files inside its folder only")
        limit = size_limit(name)
        if info.st_size > limit:
            os.close(fd)
            hint = f" (raise it with {DATA_LIMIT_VARIABLE}=BYTES)" if name in DATA_FILES else ""
            raise BadModelError(f"{shown} is {info.st_size:,} bytes; a bundle's {name} may be at most {limit:,} bytes{hint}")
        return fd, limit

    def _open(self, parts: list[str]) -> int:
        flags = os.O_RDONLY | _CLOEXEC | getattr(os, "O_BINARY", 0)
        if not _DIR_FD:
            path = self.path
            for part in parts:
                path = path / part
                if stat.S_ISLNK(os.lstat(path).st_mode):
                    raise OSError(errno.ELOOP, "symbolic link")
            seen = os.lstat(path)
            if not stat.S_ISREG(seen.st_mode):
                raise OSError(errno.ENOTDIR, "not a regular file")
            fd = os.open(path, flags)
            now = os.fstat(fd)
            if (now.st_dev, now.st_ino) != (seen.st_dev, seen.st_ino):
                os.close(fd)
                raise OSError(errno.ELOOP, "replaced while opening")
            return fd
        parent, opened = self.fd, []
        try:
            for part in parts[:-1]:
                parent = os.open(part, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC, dir_fd=parent)
                opened.append(parent)
            if not stat.S_ISREG(os.stat(parts[-1], dir_fd=parent, follow_symlinks=False).st_mode):
                raise OSError(errno.ENOTDIR, "not a regular file")  # never open a FIFO or a device
            return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=parent)
        finally:
            for fd in opened:
                os.close(fd)

    def read(self, name: str, missing_is_bundle: bool = True) -> bytes:
        """The bytes of ``name``, read after its checks and never beyond its limit."""
        fd, limit = self.open(name, missing_is_bundle)
        chunks, total = [], 0
        try:
            while chunk := os.read(fd, min(_CHUNK, limit + 1 - total)):
                chunks.append(chunk)
                total += len(chunk)
                if total > limit:
                    raise BadModelError(f"{self.path / name} grew beyond {limit:,} bytes while it was read")
        except OSError as e:
            raise UnreadableFileError(f"cannot read {self.path / name}: {e.strerror}") from None
        finally:
            os.close(fd)
        return b"".join(chunks)

    def sha256(self, name: str) -> str:
        """The sha256 hex digest of ``name``, streamed after its checks and never beyond its limit."""
        fd, limit = self.open(name)
        digest, total = hashlib.sha256(), 0
        try:
            while chunk := os.read(fd, _CHUNK):
                total += len(chunk)
                if total > limit:
                    raise BadModelError(f"{self.path / name} grew beyond {limit:,} bytes while it was read")
                digest.update(chunk)
        except OSError as e:
            raise UnreadableFileError(f"cannot read {self.path / name}: {e.strerror}") from None
        finally:
            os.close(fd)
        return digest.hexdigest()




