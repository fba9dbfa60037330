"""Outputs (:func:`write_outputs`, :func:`write_atomic`): all of a command's files or none.
Each is written to a temporary file in its folder, which is opened once: creating, writing
and renaming all happen relative to that one descriptor, so swapping the folder for a
symlink meanwhile cannot redirect an output, and no temporary file survives a failure
(Ctrl-C and SIGTERM included). An existing file is never replaced unless asked."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, Mapping


from ..errors import (OutputExistsError, PolicyportError, UnreadableFileError)
from .entries import folder_entries, folder_entries_at
from .kinds import check_not_a_stream


def check_writable(path: str | os.PathLike, force: bool = False) -> Path:
    """Refuse an output path that exists (unless ``force``), is not a regular file, or whose folder
    does not exist.

    Raises:
        OptionError: a device, FIFO or socket (:func:`check_not_a_stream`).
        OutputExistsError: the path exists and ``force`` is false, or it is a folder, a link or
            anything else that is not a regular file (never replaced, even with ``force``).
        UnreadableFileError: the parent folder does not exist or is a file; a name the file system
            refuses (too long).
    """
    path = Path(path)
    try:
        exists = path.exists() or path.is_symlink()
    except OSError as e:  # a name too long for the file system, a loop of links ...
        raise UnreadableFileError(f"cannot write {path}: {e.strerror or e}") from None
    check_not_a_stream(path)
    if exists:
        if path.is_dir():
            raise OutputExistsError(f"{path} is a folder; give a file name for the output")
        if not path.is_file() or path.is_symlink():
            raise OutputExistsError(f"{path} is not a regular file (a device, FIFO or link); policyport never replaces one")
        if not force:
            raise OutputExistsError(f"{path} exists; overwrite it with --force (force=True in Python)")
    check_parent(path)
    return path


def check_parent(path: Path) -> None:
    """Refuse an output whose parent is not an existing folder, saying which it is.

    Raises:
        UnreadableFileError: the parent does not exist, or is a file.
    """
    if not path.parent.is_dir():
        there = "is not a folder" if path.parent.exists() else "does not exist"
        raise UnreadableFileError(f"cannot write {path}: {path.parent} {there}")


def check_distinct(output: str | os.PathLike, *inputs: str | os.PathLike | None) -> None:
    """Refuse an output path that names one of the inputs (even with ``--force``).

    Raises:
        OutputExistsError: ``output`` resolves to the same file as an input.
    """
    out = Path(output).resolve()
    for given in inputs:
        if given is not None and Path(given).resolve() == out:
            raise OutputExistsError(f"the output {output} is also an input of this command; choose another path")


Writer = Callable[[BinaryIO], None]

#: The outputs moved into place since the innermost :func:`noting_placed` began (None outside one).
_placed: list[Path] | None = None


@contextlib.contextmanager
def noting_placed() -> Iterator[list[Path]]:
    """Within the block, every output moved into place, complete (a file of :func:`write_outputs`,
    a folder its writer notes with :func:`note_placed`), is appended to the list it yields, so that
    a command that ends early afterwards (a signal, an error) can say what it wrote: see
    :func:`written` and :func:`ended_after`. A block within another notes into both."""
    global _placed
    outer, _placed = _placed, []
    try:
        yield _placed
    finally:
        placed, _placed = _placed, outer
        if outer is not None:
            outer.extend(placed)


def note_placed(*paths: str | os.PathLike) -> None:
    """Note ``paths`` as moved into place, complete (see :func:`noting_placed`; nothing outside one)."""
    if _placed is not None:
        _placed.extend(Path(p) for p in paths)


def unnote_placed(paths: list[Path]) -> None:
    """Take back the last :func:`note_placed` of ``paths``, when it was their last (their placing
    was undone)."""
    if paths and _placed is not None and _placed[-len(paths):] == paths:
        del _placed[-len(paths):]


def _paths_text(placed: list[Path]) -> str:
    names = [str(p) for p in placed]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def written(placed: list[Path]) -> str:
    """What a command that failed had written, for its message: ``"nothing was written"``, or
    ``"out.npz had been written and is complete"`` (``placed`` from :func:`noting_placed`)."""
    if not placed:
        return "nothing was written"
    return f"{_paths_text(placed)} had been written and {'is' if len(placed) == 1 else 'are'} complete"


def written_sentence(placed: list[Path]) -> str:
    """:func:`written` as a sentence after an error's own: ``"Nothing was written."``, or ``"It came
    after writing out.npz, which is complete."``."""
    return f"{ended_after('It came', placed)}." if placed else "Nothing was written."


def ended_after(word: str, placed: list[Path]) -> str:
    """The message of a command ended by a signal (``word``: ``"terminated"``, ``"interrupted"``):
    ``"terminated; nothing was written"`` (every output in progress removed), or
    ``"terminated after writing out.npz, which is complete"`` when outputs were already in place."""
    if not placed:
        return f"{word}; nothing was written"
    return f"{word} after writing {_paths_text(placed)}, which {'is' if len(placed) == 1 else 'are'} complete"


#: Whether this platform can create, rename and remove files relative to a folder's descriptor
#: (POSIX); elsewhere (Windows) outputs are written by path, with the same all-or-none rule.
_AT_FOLDER = all(f in os.supports_dir_fd for f in (os.open, os.stat, os.rename, os.unlink))


@dataclass
class _Output:
    """One file of :func:`write_outputs` on its way: its folder (opened once) and the names in it.

    Every file operation goes through a method that works relative to the folder's descriptor.
    """

    path: Path
    folder: int | None  # the descriptor; None where the platform has none (paths are used)
    tmp: str | None = None
    backup: str | None = None
    placed: bool = False
    lock: int | None = None  # a descriptor of the temporary file, holding its lock until the end

    @property
    def name(self) -> str:
        return self.path.name

    def at(self, name: str) -> str:
        return name if self.folder is not None else str(self.path.parent / name)

    def stat(self) -> os.stat_result | None:
        """The output's own entry in the folder (a symlink itself, not what it points to), if any."""
        try:
            return os.stat(self.at(self.name), dir_fd=self.folder, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def create(self, name: str, flags: int) -> int:
        return os.open(self.at(name), flags, 0o600, dir_fd=self.folder)

    def link(self, src: str, dst: str) -> None:
        os.link(self.at(src), self.at(dst), src_dir_fd=self.folder, dst_dir_fd=self.folder, follow_symlinks=False)

    def rename(self, src: str, dst: str) -> None:
        os.replace(self.at(src), self.at(dst), src_dir_fd=self.folder, dst_dir_fd=self.folder)

    def unlink(self, name: str) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.at(name), dir_fd=self.folder)

    def close(self) -> None:
        for fd in (self.lock, self.folder):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.lock = self.folder = None


def write_outputs(outputs: Mapping[str | os.PathLike, Writer], force: bool = False) -> list[Path]:
    """Write several files together: every one of them, or none.

    Each ``write(file)`` writes one whole file into the binary file object it is given (a temporary
    file in the output's folder). Only when every file is complete are they renamed into place; if a
    rename fails, those already renamed are undone (a file replaced with ``force`` is restored). Each
    output's folder is opened once, and the temporary file is created, written, checked and renamed
    relative to that descriptor, so a folder swapped for a symlink meanwhile cannot redirect it. On
    any failure — an exception in a writer, a full disk, Ctrl-C or SIGTERM — no temporary file is
    left and every output path is as it was. A new file gets the mode the umask gives; a replaced
    one keeps its mode. Once every file is in place, they are noted (:func:`noting_placed`).

    Args:
        outputs: destination -> writer, in the order they are renamed into place.
        force: allow replacing existing regular files.

    Returns:
        The destinations.

    Raises:
        OutputExistsError: see :func:`check_writable`; an output named twice; or an output that
            appeared while the files were written.
        UnreadableFileError: a folder that does not exist or cannot be written.
    """
    paths = [check_writable(p, force) for p in outputs]
    try:
        resolved = {p.resolve() for p in paths}
    except OSError as e:  # a folder on the way swapped or removed while it is read
        raise UnreadableFileError(f"cannot write {e.filename or paths[0]}: {e.strerror or e}") from None
    if len(resolved) != len(paths):
        raise OutputExistsError(f"the outputs {[str(p) for p in paths]} name one file twice; give each its own path")
    pending: list[_Output] = []
    try:
        for path in paths:  # every folder opened before anything is written
            pending.append(_Output(path, _open_folder(path.parent)))
        cleaned: set[tuple[int, int]] = set()
        for out in pending:  # what killed writers left in each folder, once per folder
            if out.folder is not None and (key := _identity(os.fstat(out.folder))) not in cleaned:
                cleaned.add(key)
                remove_stale_temporaries(out.folder)
        for out, write in zip(pending, outputs.values()):
            _write_temp(out, write)
        for out in pending:
            _check_target(out, force)  # nothing appeared there while we wrote
        for out in pending:
            _place(out)
        note_placed(*paths)
    except BaseException as e:
        _undo(pending)
        unnote_placed(paths)
        for out in pending:
            out.close()
        if isinstance(e, OSError) and not isinstance(e, PolicyportError):
            raise UnreadableFileError(f"writing {', '.join(map(str, paths))} failed: {e}; nothing was written") from e
        raise
    for out in pending:
        if out.backup is not None:
            out.unlink(out.backup)
        out.close()
    return paths


def write_atomic(path: str | os.PathLike, write: Writer, force: bool = False) -> Path:
    """Write one file through ``write(file)`` atomically: see :func:`write_outputs`."""
    return write_outputs({path: write}, force)[0]


def _open_folder(folder: Path) -> int | None:
    if not _AT_FOLDER:
        return None
    try:
        return os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise UnreadableFileError(f"cannot write in {folder}: {e.strerror or e}") from e


def _new_mode(out: _Output) -> int:
    """The mode of the file being replaced, or the one the umask gives a new file."""
    found = out.stat()
    if found is not None and stat.S_ISREG(found.st_mode):
        return found.st_mode & 0o7777
    return 0o666 & ~_umask()


def _umask() -> int:
    """The process's umask (read by setting it, then setting it back)."""
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _random_hex() -> str:
    """Eight random hex digits for a temporary name (``os.urandom``, as ``secrets.token_hex(4)``
    draws them, without importing ``secrets`` and the hashing modules it brings)."""
    return os.urandom(4).hex()


def _fresh(path: Path, suffix: str, make: Callable[[str], Any], claim: Callable[[str | None], None]) -> Any:
    """``make(name)`` of a new name ``.<name of path>.<8 hex digits>.<suffix>`` beside ``path``, tried
    afresh while the name is taken (100 times). ``claim`` is told each name before it is made (a
    signal that moment still has it removed), and None when the name turned out to be another's
    (never to be removed).

    Returns:
        What ``make`` returned.

    Raises:
        OutputExistsError: no free name after 100 tries.
    """
    for _ in range(100):
        name = f".{path.name}.{_random_hex()}.{suffix}"
        claim(name)
        try:
            return make(name)
        except FileExistsError:
            claim(None)
    raise OutputExistsError(f"cannot find a free temporary name beside {path}")


def _write_temp(out: _Output, write: Writer) -> None:
    mode = _new_mode(out)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = _fresh(out.path, "tmp", lambda name: out.create(name, flags), lambda name: setattr(out, "tmp", name))
    try:
        out.lock = os.dup(fd)  # the lock lives as long as a descriptor of the file is open
        hold_lock(out.lock)
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "w+b") as f:
        write(f)
        f.flush()
        os.fchmod(f.fileno(), mode)
        os.fsync(f.fileno())


def _check_target(out: _Output, force: bool) -> None:
    found = out.stat()
    if found is None:
        return
    if not stat.S_ISREG(found.st_mode):
        raise OutputExistsError(f"{out.path} appeared while writing and is not a regular file; nothing was written")
    if not force:
        raise OutputExistsError(f"{out.path} appeared while writing; nothing was written (overwrite it with --force)")


def _place(out: _Output) -> None:
    """Rename the finished temporary file onto the output, keeping a hard link to a replaced file."""
    if out.stat() is not None:
        for _ in range(100):
            backup = f".{out.name}.{_random_hex()}.old"
            try:
                out.link(out.name, backup)
            except FileExistsError:
                continue
            except (OSError, NotImplementedError):  # no hard links here: move the old file aside instead
                out.rename(out.name, backup)
            out.backup = backup
            break
    out.rename(out.tmp, out.name)
    out.tmp, out.placed = None, True


def _undo(pending: list[_Output]) -> None:
    """Put every output back as it was and remove every temporary file (best effort, never raises)."""
    for out in reversed(pending):
        if out.tmp is not None:
            out.unlink(out.tmp)
        with contextlib.suppress(OSError):
            if out.backup is not None:  # restore the replaced file (or drop a link to it, if still in place)
                out.rename(out.backup, out.name)
            elif out.placed:
                out.unlink(out.name)


# --------------------------------------------------------------------- what killed writers left

#: A temporary file of :func:`write_outputs`: ``.<output name>.<8 hex digits>.tmp``.
_TEMP_FILE = re.compile(r"\..+\.[0-9a-f]{8}\.tmp", re.DOTALL)
#: A temporary folder of :class:`FolderBuild`: ``.<output name>.<8 hex digits>.<purpose>``.
_TEMP_FOLDER = re.compile(r"\..+\.[0-9a-f]{8}\.(?:packing|recording|plots|replaced)", re.DOTALL)
#: How long (seconds) a temporary file or folder must have gone unchanged before it may be taken
#: for one a killed writer left: far more than a writer takes between creating it and locking it.
STALE_AFTER = 10 * 60
#: How deep a stale temporary folder is removed: policyport builds none deeper.
_TREE_DEPTH = 16

try:
    import fcntl
except ImportError:  # Windows: no advisory locks, so nothing is ever taken for stale
    fcntl = None


def hold_lock(fd: int) -> None:
    """Lock the file (or folder) open as ``fd`` exclusively (``flock``), as every writer of a
    temporary file or folder does from creating it until it is renamed or removed: the lock lasts
    as long as a descriptor of that open file does, and the kernel drops it when the process dies
    (SIGKILL included), which is how :func:`remove_stale_temporaries` tells a dead writer's file
    from a live one's. Nothing where the platform has no ``flock``, nor where the file system
    refuses one (a remover's own attempt fails there too, so it removes nothing)."""
    if fcntl is not None:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def remove_stale_temporaries(folder: int) -> list[str]:
    """Remove the temporary files and folders that policyport writers killed before they finished
    (SIGKILL, a power cut) left in a folder, and nothing else.

    An entry is removed only when all of these hold: its name is exactly policyport's temporary
    naming (``.<name>.<8 hex digits>.tmp`` for a file; ``.<name>.<8 hex digits>.<purpose>`` for a
    folder, purpose ``packing``, ``recording``, ``plots`` or ``replaced``); it is a regular file or
    a folder (not a link); it has not changed for :data:`STALE_AFTER` seconds; and its lock can be
    taken, so no process holds it: every writer holds one on its temporary file or folder
    (:func:`hold_lock`) for as long as it exists. A concurrent writer's file is never touched, and
    neither is anything where the platform has no ``flock`` (nothing is removed there).

    Args:
        folder: a descriptor of the folder (every step is relative to it; links are never followed).

    Returns:
        The names removed.
    """
    if fcntl is None:
        return []
    try:
        names = [entry.name for entry in os.scandir(folder)]
    except OSError:
        return []
    removed = []
    for name in names:
        is_file = _TEMP_FILE.fullmatch(name) is not None
        if not is_file and _TEMP_FOLDER.fullmatch(name) is None:
            continue
        flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) \
            | getattr(os, "O_NOCTTY", 0) | (0 if is_file else getattr(os, "O_DIRECTORY", 0))
        try:
            fd = os.open(name, flags, dir_fd=folder)
        except OSError:  # a link, gone meanwhile, not ours to read
            continue
        try:
            found = os.fstat(fd)
            kind = stat.S_ISREG if is_file else stat.S_ISDIR
            if not kind(found.st_mode) or time.time() - found.st_mtime < STALE_AFTER:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # a live writer holds it
                continue
            try:  # still the same entry under that name
                if _identity(os.stat(name, dir_fd=folder, follow_symlinks=False)) != _identity(found):
                    continue
            except OSError:
                continue
            if is_file:
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=folder)
            else:
                _remove_tree(folder, name)
            removed.append(name)
        finally:
            os.close(fd)
    return removed


def _open_subfolder(folder: int, name: str) -> int:
    """The folder ``name`` in ``folder`` (a descriptor), opened without following a link."""
    return os.open(name, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
                   | getattr(os, "O_CLOEXEC", 0), dir_fd=folder)


def _descend(folder: int, parts: list[str], make: bool = False) -> int:
    """A new descriptor of the folder ``parts`` below ``folder`` (made on the way if ``make``),
    never through a link; the caller closes it."""
    fd = os.dup(folder)
    try:
        for part in parts:
            if make:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o777, dir_fd=fd)
            inner = _open_subfolder(fd, part)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def _remove_tree(folder: int, name: str, depth: int = 0) -> None:
    """Remove the folder ``name`` in ``folder`` (a descriptor) and all it holds, every step relative
    to descriptors, never following a link (best effort, never raises; stops :data:`_TREE_DEPTH` deep)."""
    if depth > _TREE_DEPTH:
        return
    try:
        fd = _open_subfolder(folder, name)
    except OSError:
        return
    try:
        for entry in list(os.scandir(fd)):
            if entry.is_dir(follow_symlinks=False):
                _remove_tree(fd, entry.name, depth + 1)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(entry.name, dir_fd=fd)
    except OSError:
        pass
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(name, dir_fd=folder)


@dataclass(frozen=True)
class FolderContents:
    """What an existing output folder holds, read through a descriptor of it where the platform
    has them (:meth:`FolderBuild.commit`).

    Attributes:
        files, folders, others: ``/``-separated relative names (see :func:`files_at`).
        fd: the descriptor it is open as (valid during the call it is given to); None where the
            platform has none (its path is used).
    """

    files: list[str]
    folders: list[str]
    others: list[str]
    fd: int | None

    @classmethod
    def of(cls, fd: int | None, path: Path) -> FolderContents:
        """The contents of the folder open as ``fd`` (None: the folder at ``path``).

        Raises:
            OutputExistsError: it cannot be read.
        """
        try:
            if fd is None:
                return cls(*folder_entries(path), fd=None)
            return cls(*folder_entries_at(fd), fd=fd)
        except OSError as e:
            raise OutputExistsError(f"{path} cannot be read ({e.strerror or e}); nothing was written") from e


class FolderBuild:
    """An output folder built under a hidden temporary name beside it, then renamed into place
    (:meth:`commit`): all of its files or none.

    The destination's parent folder is opened once, and the temporary folder once it is made; every
    file and subfolder is created relative to those descriptors (exclusively, never following a
    link), and the renames into place happen relative to the parent's, so swapping either folder
    for a symlink meanwhile cannot redirect a file or the folder. The temporary folder is
    ``.<name>.<8 hex digits>.<purpose>``, mode 0700 until it is committed (then the umask's, or the replaced folder's), locked while it exists (see
    :func:`remove_stale_temporaries`), and removed with whatever it holds unless committed, however
    the ``with`` block ends (Ctrl-C and SIGTERM included). Where the platform has no descriptor-
    relative calls (Windows), paths are used, with the same all-or-none rule.

    Args:
        out: the destination folder.
        purpose: the end of the temporary name: ``"packing"``, ``"recording"`` or ``"plots"``.

    Attributes:
        path: the temporary folder's path, to read it back or to hand to other processes that write
            by path (not for writing from this one: use :meth:`open`, :meth:`create`).

    Raises:
        UnreadableFileError: the parent folder cannot be opened or written in.
        OutputExistsError: no free temporary name after 100 tries.
    """

    def __init__(self, out: str | os.PathLike, purpose: str):
        self.out = Path(out)
        self.name: str | None = None
        self.fd: int | None = None
        self.committed = False
        self.parent = _open_folder(self.out.parent)
        try:
            if self.parent is not None:
                remove_stale_temporaries(self.parent)
            _fresh(self.out, purpose, lambda name: os.mkdir(self._at(name), 0o700, dir_fd=self.parent),
                   lambda name: setattr(self, "name", name))
            if self.parent is not None:
                self.fd = _open_subfolder(self.parent, self.name)
                hold_lock(self.fd)
        except OSError as e:
            self.close()
            raise UnreadableFileError(f"cannot write in {self.out.parent}: {e.strerror or e}") from e
        except BaseException:
            self.close()
            raise

    def _at(self, name: str) -> str:
        return name if self.parent is not None else str(self.out.parent / name)

    @property
    def path(self) -> Path:
        return self.out.parent / self.name

    def __enter__(self) -> FolderBuild:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def create(self, name: str) -> int:
        """A new file ``name`` (``/``-separated below the folder; subfolders are made) opened for
        reading and writing as a descriptor, which the caller closes.

        Raises:
            OSError: it exists, a part of the name is a link, or it cannot be created.
        """
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) \
            | getattr(os, "O_BINARY", 0)
        *folders, leaf = name.split("/")
        if self.fd is None:
            path = self.path
            for part in folders:
                path = path / part
                with contextlib.suppress(FileExistsError):
                    os.mkdir(path)
            return os.open(path / leaf, flags, 0o666)
        fd = _descend(self.fd, folders, make=True)
        try:
            return os.open(leaf, flags, 0o666, dir_fd=fd)
        finally:
            os.close(fd)

    def open(self, name: str) -> BinaryIO:
        """A new file ``name`` (as for :meth:`create`) open for binary writing."""
        return os.fdopen(self.create(name), "wb")

    def write_bytes(self, name: str, data: bytes) -> None:
        """Write ``data`` to the new file ``name`` (as for :meth:`create`)."""
        with self.open(name) as f:
            f.write(data)

    def nbytes(self) -> int:
        """The bytes of the files in the folder (read through its descriptor)."""
        if self.fd is None:
            return sum(p.stat().st_size for p in self.path.rglob("*") if p.is_file() and not p.is_symlink())
        total = 0
        for name in folder_entries_at(self.fd)[0]:
            *up, leaf = name.split("/")
            fd = _descend(self.fd, up)
            try:
                total += os.stat(leaf, dir_fd=fd, follow_symlinks=False).st_size
            finally:
                os.close(fd)
        return total

    def commit(self, replaceable: Callable[[FolderContents], list[str]] | None = None) -> None:
        """Rename the finished folder onto the destination.

        Args:
            replaceable: when the destination exists: called with what it holds
                (:class:`FolderContents`, read through a descriptor of it opened relative to the
                parent, not through a link); returns the files that may be deleted once it is moved
                aside, or raises :class:`~policyport.errors.OutputExistsError` if it may not be
                replaced. None (default): an existing destination is refused. The old folder is
                moved aside under a temporary name, the new one renamed into place, then the listed
                files and the folders left empty are deleted; anything else in it keeps the old
                folder under that name.

        The destination is noted as placed once it is (:func:`noting_placed`).

        Raises:
            OutputExistsError: the destination exists and may not be replaced, is not a folder, or
                the folder cannot be renamed into place (the old one is then put back).
        """
        found = self._entry(self.out.name)
        self._set_mode(found)
        if found is None:
            self._rename(self.name, self.out.name)
            self.committed = True
            note_placed(self.out)
            return
        if not stat.S_ISDIR(found.st_mode) or replaceable is None:
            raise OutputExistsError(f"{self.out} exists and is not a folder this command replaces; nothing was written")
        old = self._open_existing()
        try:
            listed = replaceable(FolderContents.of(old, self.out))
            if old is not None and fcntl is not None:
                with contextlib.suppress(OSError):  # kept from stale-folder removal while it is aside
                    fcntl.flock(old, fcntl.LOCK_EX | fcntl.LOCK_NB)
            aside = self._aside()
            self._rename(self.out.name, aside)
            try:
                self._rename(self.name, self.out.name)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.rename(self._at(aside), self._at(self.out.name), src_dir_fd=self.parent,
                              dst_dir_fd=self.parent)
                raise
            self.committed = True
            note_placed(self.out)
            self._remove_listed(old, aside, listed)
        finally:
            if old is not None:
                os.close(old)

    def _set_mode(self, found: os.stat_result | None) -> None:
        """Give the folder, private (0700) while it is built, the mode of the folder it replaces, or
        the one the umask gives a new folder, as files get theirs (:func:`_new_mode`)."""
        if found is not None and stat.S_ISDIR(found.st_mode):
            mode = found.st_mode & 0o7777
        else:
            mode = 0o777 & ~_umask()
        try:
            if self.fd is not None:
                os.fchmod(self.fd, mode)
            else:
                os.chmod(self.path, mode)
        except OSError as e:
            raise UnreadableFileError(f"cannot set the mode of the folder for {self.out}: {e.strerror or e}") from e

    def _entry(self, name: str) -> os.stat_result | None:
        try:
            return os.stat(self._at(name), dir_fd=self.parent, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def _open_existing(self) -> int | None:
        if self.parent is None:
            return None
        try:
            return _open_subfolder(self.parent, self.out.name)
        except OSError as e:
            raise OutputExistsError(f"{self.out} cannot be opened as a folder ({e.strerror or e}); nothing was written") from e

    def _aside(self) -> str:
        for _ in range(100):
            name = f".{self.out.name}.{_random_hex()}.replaced"
            if self._entry(name) is None:
                return name
        raise OutputExistsError(f"cannot find a free temporary name beside {self.out}")

    def _rename(self, src: str, dst: str) -> None:
        try:
            os.rename(self._at(src), self._at(dst), src_dir_fd=self.parent, dst_dir_fd=self.parent)
        except OSError as e:
            raise OutputExistsError(f"cannot move the new folder to {self.out}: {e.strerror or e}; nothing was "
                                    "written") from e

    def _remove_listed(self, old: int | None, aside: str, listed: list[str]) -> None:
        """Delete ``listed`` from the replaced folder moved ``aside``, then its folders left empty,
        then itself if empty (best effort, never raises)."""
        if old is None:  # no descriptors: by path
            base = self.out.parent / aside
            for name in listed:
                with contextlib.suppress(OSError):
                    os.unlink(base / name)
            for folder, _, _ in sorted(os.walk(base), key=lambda entry: -len(entry[0])):
                with contextlib.suppress(OSError):
                    os.rmdir(folder)
            return
        for name in listed:
            *up, leaf = name.split("/")
            with contextlib.suppress(OSError):
                fd = _descend(old, up)
                try:
                    os.unlink(leaf, dir_fd=fd)
                finally:
                    os.close(fd)
        with contextlib.suppress(OSError):
            for name in sorted(folder_entries_at(old)[1], key=lambda n: -n.count("/")):
                *up, leaf = name.split("/")
                fd = _descend(old, up)
                try:
                    with contextlib.suppress(OSError):
                        os.rmdir(leaf, dir_fd=fd)
                finally:
                    os.close(fd)
        with contextlib.suppress(OSError):
            os.rmdir(aside, dir_fd=self.parent)

    def close(self) -> None:
        """Remove the temporary folder with all it holds unless committed, and close the descriptors."""
        if not self.committed and self.name is not None:
            if self.parent is not None:
                _remove_tree(self.parent, self.name)
            else:
                shutil.rmtree(self.path, ignore_errors=True)
        self.name = None if not self.committed else self.name
        for fd in (self.fd, self.parent):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.fd = self.parent = None


class _ReaderMayLeave:
    """A text stream in front of ``sys.stdout`` that, once the reader has gone (a broken pipe), sends
    the rest of the output to ``os.devnull`` instead of raising (see :func:`stdout_reader_may_leave`)."""

    def __init__(self, stream):
        self._stream = stream
        self.cut_off = False

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._to_devnull()
            return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._to_devnull()

    def _to_devnull(self) -> None:
        """Point the stream's descriptor at ``os.devnull``, so that what it still buffers (flushed
        again at exit) goes nowhere instead of raising once more."""
        self.cut_off = True
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, self._stream.fileno())
            finally:
                os.close(devnull)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@contextlib.contextmanager
def stdout_reader_may_leave() -> Iterator[None]:
    """Within the block, output the reader no longer takes is not an error: once writing to
    ``sys.stdout`` fails with a broken pipe (``policyport inspect m.onnx | head -1``), the rest goes
    to ``os.devnull``, as the Python documentation's "Note on SIGPIPE" recommends (``signal``
    module), and the command ends as it would have (its own exit code, no traceback).
    ``sys.stdout`` is flushed and restored on leaving.
    """
    stream = sys.stdout
    if stream is None or isinstance(stream, _ReaderMayLeave):
        yield
        return
    guarded = sys.stdout = _ReaderMayLeave(stream)
    try:
        yield
    finally:
        guarded.flush()
        if sys.stdout is guarded:
            sys.stdout = stream


#: How the archive comment of an ``.npz`` of a model's parameters begins (``policyport extract``,
#: ``export-numpy``'s weights): readers of recordings refuse such a file by it. numpy ignores the
#: comment, so the arrays read back as they were written.
WEIGHTS_COMMENT = b"policyport.weights"


def weights_comment(writer: str) -> bytes:
    """The archive comment of an ``.npz`` of parameters that ``writer`` (``"policyport extract"``) wrote."""
    return WEIGHTS_COMMENT + f": written by {writer}".encode()
