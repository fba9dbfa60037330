"""Output folders written all at once: built under a temporary sibling name, then renamed into place
(:class:`policyport.io.outputs.FolderBuild`: every file created relative to descriptors)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

from ..errors import OutputExistsError, UnreadableFileError
from ..io.outputs import FolderBuild, FolderContents
from ..io.kinds import check_not_a_stream


def check_out_folder(out: Path, force: bool, suffixes: tuple[str, ...]) -> None:
    """Refuse an output folder that exists (unless ``force`` and it holds only files ending in
    ``suffixes``: a previous output of the same command), or whose parent does not exist.

    Raises:
        OptionError: a device, FIFO or socket (:func:`policyport.io.kinds.check_not_a_stream`).
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
    if not out.parent.is_dir():
        raise UnreadableFileError(f"cannot write {out}: folder {out.parent} does not exist")


@contextlib.contextmanager
def building(out: Path, purpose: str) -> Iterator[FolderBuild]:
    """A new hidden folder beside ``out`` to build it in (``.<name>.<8 hex digits>.<purpose>``, mode
    0700; :class:`~policyport.io.outputs.FolderBuild`), removed with whatever is left in it when the block
    ends uncommitted, however it ends.

    Raises:
        OutputExistsError: no free name beside ``out`` after 100 tries.
        UnreadableFileError: the folder of ``out`` cannot be written in.
    """
    with FolderBuild(out, purpose) as build:
        yield build


def commit_folder(build: FolderBuild, out: Path, force: bool, suffixes: tuple[str, ...]) -> None:
    """Rename the finished ``build`` onto ``out``; a previous output there (a folder of files ending
    in ``suffixes`` only, replaced with ``force``) is removed only after.

    Raises:
        OutputExistsError: ``out`` appeared meanwhile, or is not such a folder.
    """

    def replaceable(found: FolderContents) -> list[str]:
        if found.folders or found.others or not all(Path(n).suffix in suffixes for n in found.files):
            raise OutputExistsError(f"{out} is not a folder of {'/'.join(suffixes)} files only; force replaces only a "
                                    "previous output of this command — remove it yourself or choose another name")
        if not force:
            raise OutputExistsError(f"{out} appeared while it was written; nothing was written (overwrite it with "
                                    "--force)")
        return found.files

    build.commit(replaceable)
