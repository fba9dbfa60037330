"""Output folders written all at once: built under a temporary sibling name, then renamed into place."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Iterator

from ..errors import OutputExistsError, UnreadableFileError
from ..files import check_not_a_stream, note_placed


def check_out_folder(out: Path, force: bool, suffixes: tuple[str, ...]) -> None:
    """Refuse an output folder that exists (unless ``force`` and it holds only files ending in
    ``suffixes``: a previous output of the same command), or whose parent does not exist.

    Raises:
        OptionError: a device, FIFO or socket (:func:`policyport.files.check_not_a_stream`).
        OutputExistsError: as said.
        UnreadableFileError: the parent folder does not exist.
    """
    check_not_a_stream(out)
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


@contextlib.contextmanager
def building(out: Path, purpose: str) -> Iterator[Path]:
    """A new hidden folder beside ``out`` to build it in (``.<name>.<8 hex digits>.<purpose>``, mode
    0700), removed with whatever is left in it when the block ends, however it ends. Its name is
    chosen before it is made, so that a signal (Ctrl-C, SIGTERM) the moment it is made still has it
    removed.

    Raises:
        OutputExistsError: no free name beside ``out`` after 100 tries.
    """
    folder = None
    try:
        for _ in range(100):
            folder = out.parent / f".{out.name}.{os.urandom(4).hex()}.{purpose}"
            try:
                os.mkdir(folder, 0o700)
            except FileExistsError:
                folder = None  # another's folder: never to be removed
                continue
            break
        if folder is None:
            raise OutputExistsError(f"cannot find a free temporary name beside {out}")
        yield folder
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def commit_folder(tmp: Path, out: Path, force: bool, suffixes: tuple[str, ...]) -> None:
    """Rename the finished ``tmp`` onto ``out``; a previous output there is removed only after.
    ``out`` is then noted as placed (:func:`policyport.files.noting_placed`)."""
    check_out_folder(out, force, suffixes)
    if not out.exists():
        os.rename(tmp, out)
        note_placed(out)
        return
    with building(out, "replaced") as old:
        os.rmdir(old)
        os.rename(out, old)
        os.rename(tmp, out)
        note_placed(out)
