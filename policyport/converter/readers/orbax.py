"""Orbax checkpoint folders: told from their file names alone, and read with tensorstore (no JAX).

``orbax.checkpoint.PyTreeCheckpointer().save(folder, tree)`` (orbax-checkpoint 0.12, what
``brax.training.checkpoint.save`` calls) writes into ``folder``: ``_CHECKPOINT_METADATA`` (JSON: the handler,
timestamps), ``_METADATA`` (JSON: every leaf's tree path and value type), ``_sharding``, ``array_metadatas/``,
``commit_success.txt``, and the arrays themselves in an OCDBT key-value database (``manifest.ocdbt``,
``d/<id>`` and ``ocdbt.process_<n>/``: B+tree nodes and out-of-line values, zstd-compressed) holding one zarr
v2 array per leaf (keys ``<path.joined.by.dots>/.zarray`` and ``/0``, ``/0.0`` chunks, zstd-compressed);
with OCDBT off the same zarr arrays are plain folders.

:func:`read_orbax_tree` reads the arrays with tensorstore (the library orbax itself writes them with; it
needs neither JAX nor orbax, and nothing in the folder is executed): the tree's structure from
``_METADATA``, each leaf's shape and dtype from its zarr metadata, checked against the array limit before a
byte of it is decompressed.
"""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path

import numpy as np

from ...errors import UnreadableFileError

#: What orbax's ``PyTreeCheckpointer.save`` writes into a checkpoint folder: its metadata (JSON) ...
ORBAX_METADATA = ("_CHECKPOINT_METADATA", "_METADATA")
#: ... and the store of the arrays: an OCDBT database (orbax's default) or, with OCDBT off, zarr arrays.
ORBAX_STORES = ("manifest.ocdbt", "*/.zarray", "*/zarr.json")


def _is_orbax_folder(path: Path) -> bool:
    return (any((path / name).is_file() for name in ORBAX_METADATA)
            and any(next(path.glob(pattern), None) is not None for pattern in ORBAX_STORES))


def orbax_step_folder(path) -> Path | None:
    """The orbax checkpoint folder ``path`` is, or the newest of the ``<step:012d>`` folders it holds
    (``brax.training.checkpoint.save(path, step, ...)`` writes ``path/<step:012d>/``); ``None`` when it is
    neither. Told from the names of the files orbax writes (:data:`ORBAX_METADATA`, :data:`ORBAX_STORES`),
    nothing read."""
    path = Path(path)
    if not path.is_dir():
        return None
    if _is_orbax_folder(path):
        return path
    steps = sorted((p for p in path.iterdir() if re.fullmatch(r"\d{12}", p.name) and p.is_dir()), reverse=True)
    return next((p for p in steps if _is_orbax_folder(p)), None)


#: The most bytes of ``_METADATA`` read (a tree of a few thousand leaves takes well under 1 MiB).
METADATA_BYTES = 16 << 20
#: orbax's ``KeyType`` in ``_METADATA``'s ``key_metadata`` (orbax/checkpoint/_src/metadata/tree.py): 1 a sequence index, 2 a dict key.
SEQUENCE, DICT = 1, 2
#: The largest decoded OCDBT B+tree node a database may declare (``max_decoded_node_bytes`` in its manifest;
#: tensorstore's default, which orbax keeps, is 100 MB): tensorstore decompresses a node up to that size.
NODE_BYTES = 100_000_000


def _tree_paths(folder: Path) -> list[tuple[tuple[tuple[str, int], ...], str]]:
    """``[(((key, key_type), ...), value_type), ...]`` of every leaf ``_METADATA`` lists."""
    from ...io.limits import check_json_bytes
    from ...io.schema import load_json

    file = folder / "_METADATA"
    if not file.is_file():
        raise UnreadableFileError(f"{folder} holds no _METADATA, which orbax writes with the tree's structure")
    size = file.stat().st_size
    check_json_bytes(size, str(file))
    if size > METADATA_BYTES:
        raise UnreadableFileError(f"{file} is {size:,} bytes; an orbax tree's metadata is read up to {METADATA_BYTES:,}")
    meta = load_json(file.read_bytes(), str(file), error=UnreadableFileError)
    tree = meta.get("tree_metadata") if isinstance(meta, dict) else None
    if not isinstance(tree, dict) or not tree:
        raise UnreadableFileError(f"{file} has no tree_metadata (orbax's PyTree checkpoint metadata)")
    leaves = []
    for name, entry in tree.items():
        keys = entry.get("key_metadata") if isinstance(entry, dict) else None
        value = entry.get("value_metadata") if isinstance(entry, dict) else None
        if not (isinstance(keys, list) and keys and isinstance(value, dict)
                and all(isinstance(k, dict) and isinstance(k.get("key"), str) and k.get("key_type") in (SEQUENCE, DICT)
                        for k in keys)):
            raise UnreadableFileError(f"{file}: the entry {name[:200]!r} is not a leaf of orbax's tree_metadata")
        leaves.append((tuple((k["key"], k["key_type"]) for k in keys), str(value.get("value_type", ""))))
    return leaves


def _nest(leaves: dict[tuple[tuple[str, int], ...], object]):
    """The tree the leaves' key paths describe: dicts for dict keys, tuples for sequence indices."""
    root: dict = {}
    kinds: dict[int, int] = {}
    for path, value in leaves.items():
        node = root
        for depth, (key, kind) in enumerate(path):
            if kinds.setdefault(id(node), kind) != kind:
                raise UnreadableFileError(f"orbax's _METADATA keys one container both as a sequence and a dict "
                                          f"(at {'.'.join(k for k, _ in path[:depth + 1])})")
            if depth == len(path) - 1:
                if key in node:
                    raise UnreadableFileError(f"orbax's _METADATA lists {'.'.join(k for k, _ in path)} twice")
                node[key] = value
            else:
                node = node.setdefault(key, {})
                if not isinstance(node, dict):
                    raise UnreadableFileError(f"orbax's _METADATA has a leaf and a subtree at {key!r}")

    def build(node):
        if not isinstance(node, dict):
            return node
        if kinds.get(id(node)) == SEQUENCE:
            if sorted(node, key=lambda k: int(k) if k.isdigit() else -1) != [str(i) for i in range(len(node))]:
                raise UnreadableFileError(f"orbax's _METADATA numbers a sequence {sorted(node)[:10]}, not 0 ... n-1")
            return tuple(build(node[str(i)]) for i in range(len(node)))
        return {k: build(v) for k, v in node.items()}

    return build(root)


def folder_sha256(folder: Path) -> str:
    """The sha256 of a checkpoint folder: every file's path (relative, sorted) and bytes (provenance)."""
    digest = hashlib.sha256()
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(folder)).encode() + b"\0")
        with open(file, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def _declared_node_bytes(ts, folder: Path, context) -> int:
    """The ``max_decoded_node_bytes`` the OCDBT manifest declares, checked against the array limit before
    any node is decompressed: tensorstore refuses a configuration that differs from the manifest's, naming
    the manifest's value, so a read under :data:`NODE_BYTES` either works or tells it."""
    from ...io.limits import check_array_bytes

    declared = NODE_BYTES
    for _ in range(2):
        store = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{folder.resolve()}/",
                                 "config": {"max_decoded_node_bytes": declared}}, context=context).result()
        try:
            store.read(b"_").result()
            return declared
        except Exception as e:  # noqa: BLE001 - tensorstore raises ValueError subclasses for every failure
            found = re.search(r"max_decoded_node_bytes: expected \d+ but received (\d+)", str(e))
            if found is None:
                raise UnreadableFileError(f"{folder}: its OCDBT database (manifest.ocdbt) is damaged: "
                                          f"{str(e)[:300]}") from e
            declared = int(found[1])
            check_array_bytes(declared, f"{folder}: manifest.ocdbt's decoded B+tree nodes (max_decoded_node_bytes)")
    raise UnreadableFileError(f"{folder}: its OCDBT manifest's configuration cannot be matched")


def read_orbax_tree(folder) -> object:
    """The tree of numpy arrays orbax's ``PyTreeCheckpointer.save`` wrote into ``folder``.

    Read with tensorstore (the ``brax`` extra): the OCDBT database, or plain zarr folders when orbax wrote
    without OCDBT; zarr v2 (``.zarray``) and v3 (``zarr.json``) arrays. Every leaf's declared shape and dtype
    is checked against the array limit before it is read. Nothing in the folder runs.

    Args:
        folder: the step folder (:func:`orbax_step_folder`).

    Returns:
        Dicts (dict keys) and tuples (sequence indices) as ``_METADATA`` records them; leaves are numpy
        arrays (0-d for scalars), or ``None`` for leaves orbax saved as ``None``.

    Raises:
        MissingDependencyError: tensorstore is not installed.
        UnreadableFileError: metadata or arrays missing, damaged or not numeric.
        LimitExceededError: a leaf declares more bytes than the array limit.
    """
    from ...errors import require
    from ...io.limits import check_array_bytes

    folder = Path(folder)
    ts = require("tensorstore", "brax", "reading an orbax checkpoint folder")
    leaves = _tree_paths(folder)
    context = ts.Context({"cache_pool": {"total_bytes_limit": 0}, "data_copy_concurrency": {"limit": 1},
                          "file_io_concurrency": {"limit": 1}})
    node_bytes = _declared_node_bytes(ts, folder, context) if (folder / "manifest.ocdbt").is_file() else None
    values = {}
    for path, value_type in leaves:
        name = ".".join(key for key, _ in path)
        if value_type in ("None", "NoneType"):
            values[path] = None
            continue
        if node_bytes is not None:
            kvstore = {"driver": "ocdbt", "base": f"file://{folder.resolve()}/", "path": f"{name}/",
                       "config": {"max_decoded_node_bytes": node_bytes}}
        else:
            kvstore = {"driver": "file", "path": f"{(folder / name).resolve()}/"}
        what = f"{folder}: leaf {name}"
        array = None
        for driver in ("zarr", "zarr3"):
            try:
                array = ts.open({"driver": driver, "kvstore": kvstore}, open=True, read=True, context=context).result()
                break
            except Exception:  # noqa: BLE001 - ValueError or tensorstore's own errors: not this zarr version
                continue
        if array is None:
            raise UnreadableFileError(f"{what}: no zarr array (orbax writes one per leaf) could be read")
        try:
            dtype = np.dtype(array.dtype.numpy_dtype)
        except (TypeError, AttributeError) as e:
            raise UnreadableFileError(f"{what}: an array of dtype {array.dtype}, which numpy cannot hold") from e
        if dtype.kind not in "biuf":
            raise UnreadableFileError(f"{what}: an array of dtype {dtype}; only numeric arrays are read")
        shape = tuple(int(d) for d in array.shape)
        check_array_bytes(math.prod(shape) * dtype.itemsize, f"{what} ({dtype.name}, shape {shape})")
        try:
            values[path] = np.asarray(array.read().result())
        except Exception as e:  # noqa: BLE001 - tensorstore raises ValueError/RuntimeError subclasses
            raise UnreadableFileError(f"{what} is damaged: {str(e)[:300]}") from e
    return _nest(values)
