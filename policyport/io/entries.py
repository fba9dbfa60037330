"""The entries of a folder, read without following links: its files, subfolders and anything else (standard
library only, as a packed folder's check runs before its runtime is imported)."""

from __future__ import annotations

import os
from pathlib import Path

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def folder_entries_at(folder: int) -> tuple[list[str], list[str], list[str]]:
    """As :func:`folder_entries`, for the folder open as the descriptor ``folder``: every folder
    below it is opened relative to it, never through a link."""
    files: list[str] = []
    folders: list[str] = []
    others: list[str] = []
    todo: list[list[str]] = [[]]
    while todo:
        parts = todo.pop()
        fd = os.dup(folder)
        try:
            for part in parts:
                inner = os.open(part, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC, dir_fd=fd)
                os.close(fd)
                fd = inner
            with os.scandir(fd) as entries:
                for entry in entries:
                    name = "/".join([*parts, entry.name])
                    if entry.is_dir(follow_symlinks=False):
                        folders.append(name)
                        todo.append([*parts, entry.name])
                    elif entry.is_file(follow_symlinks=False):
                        files.append(name)
                    else:
                        others.append(name)
        finally:
            os.close(fd)
    return sorted(files), sorted(folders), sorted(others)


def folder_entries(directory: str | os.PathLike) -> tuple[list[str], list[str], list[str]]:
    """Everything below ``directory`` as ``(files, folders, others)``: ``/``-separated relative
    names of the regular files, of the folders, and of everything else (symbolic links, devices,
    FIFOs ...). Links are never followed.
    """
    files: list[str] = []
    folders: list[str] = []
    others: list[str] = []
    todo = [("", Path(directory))]
    while todo:
        prefix, path = todo.pop()
        with os.scandir(path) as entries:
            for entry in entries:
                name = prefix + entry.name
                if entry.is_dir(follow_symlinks=False):
                    folders.append(name)
                    todo.append((name + "/", Path(entry.path)))
                elif entry.is_file(follow_symlinks=False):
                    files.append(name)
                else:
                    others.append(name)
    return sorted(files), sorted(folders), sorted(others)
