"""The layout of an orbax checkpoint folder, told from its file names alone (nothing in it is read).

``orbax.checkpoint.PyTreeCheckpointer().save(folder, tree)`` (orbax-checkpoint 0.12, what
``brax.training.checkpoint.save`` calls) writes into ``folder``: ``_CHECKPOINT_METADATA`` (JSON: the handler,
timestamps), ``_METADATA`` (JSON: every leaf's tree path and value type), ``_sharding``, ``array_metadatas/``,
``commit_success.txt``, and the arrays themselves in an OCDBT key-value database (``manifest.ocdbt``,
``d/<id>`` and ``ocdbt.process_<n>/``: B+tree nodes and out-of-line values, zstd-compressed) holding one zarr
v2 array per leaf (keys ``<path.joined.by.dots>/.zarray`` and ``/0``, ``/0.0`` chunks, zstd-compressed);
with OCDBT off the same zarr arrays are plain folders.
"""

from __future__ import annotations

import re
from pathlib import Path

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
