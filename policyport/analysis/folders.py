"""Output folders written all at once: built under a temporary sibling name, then renamed into place."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ..errors import OutputExistsError, UnreadableFileError


def check_out_folder(out: Path, force: bool, suffixes: tuple[str, ...]) -> None:
    """Refuse an output folder that exists (unless ``force`` and it holds only files ending in
    ``suffixes``: a previous output of the same command), or whose parent does not exist.

    Raises:
        OutputExistsError: as said.
        UnreadableFileError: the parent folder does not exist.
    """
    if out.exists() or out.is_symlink():
        replaceable = out.is_dir() and not out.is_symlink() and all(p.suffix in suffixes and not p.is_dir()
                                                                    for p in out.iterdir())
        if not force and replaceable:
            raise OutputExistsError(f"{out} exists; overwrite it with --force (force=True in Python)")
        if not replaceable:
            raise OutputExistsError(f"{out} exists and is not a folder of {'/'.join(suffixes)} files only (a previous "
                                    "output of this command), so it is never replaced — remove it yourself or choose "
                                    "another name")
        if not out.is_dir() or out.is_symlink() or any(p.suffix not in suffixes or p.is_dir() for p in out.iterdir()):
            raise OutputExistsError(f"{out} is not a folder of {'/'.join(suffixes)} files only; force replaces only a "
                                    "previous output of this command — remove it yourself or choose another name")
    if not out.parent.is_dir():
        raise UnreadableFileError(f"cannot write {out}: folder {out.parent} does not exist")


def temporary_folder(out: Path, purpose: str) -> Path:
    """A new hidden folder beside ``out`` to build it in."""
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=f".{purpose}", dir=out.parent))


def commit_folder(tmp: Path, out: Path, force: bool, suffixes: tuple[str, ...]) -> None:
    """Rename the finished ``tmp`` onto ``out``; a previous output there is removed only after."""
    check_out_folder(out, force, suffixes)
    if not out.exists():
        os.rename(tmp, out)
        return
    old = temporary_folder(out, "replaced")
    os.rmdir(old)
    os.rename(out, old)
    os.rename(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
