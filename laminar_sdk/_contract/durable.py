"""Crash-safe file operations: a crash at any point leaves either the old or the new state.

A new name becomes visible only by ``rename`` / ``link`` of a complete, fsynced file, and the
directory holding it is fsynced afterwards so the new name itself survives a power loss.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import BinaryIO

_COPY_CHUNK_BYTES = 1 << 20
"""How much of a file :func:`write_file_atomically` copies at a time."""


def fsync_path(path: Path) -> None:
    """Flush a file's data, or a directory's entries, to stable storage."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def make_dirs(path: Path) -> None:
    """Create ``path`` and its missing parents, each made durable in its own parent.

    :raises NotADirectoryError: when ``path`` or a parent exists and is not a directory.
    """
    missing: list[Path] = []
    current = path
    while not current.exists():
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        # Another process may create it first: that is as good as creating it here.
        directory.mkdir(exist_ok=True)
        fsync_path(directory.parent)
    if not path.is_dir():
        raise NotADirectoryError(f"{path} exists and is not a directory")


def write_file_atomically(path: Path, data: bytes | BinaryIO) -> None:
    """Replace ``path`` with ``data``: readers see the old content or the new, never a mix.

    :param data: the bytes, or a binary file whose content from its current position on is
        copied, a chunk at a time (memory does not grow with its size).
    """
    temporary = _durable_temporary(path.parent, data)
    try:
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


def create_file_atomically(path: Path, data: bytes) -> bool:
    """Create ``path`` holding ``data``, complete and durable, unless it exists already.

    :returns: ``True`` when this call created the file; ``False`` when ``path`` existed (it is
        left untouched, so two processes racing for one name cannot both win).
    """
    temporary = _durable_temporary(path.parent, data)
    try:
        os.link(temporary, path)
    except FileExistsError:
        return False
    finally:
        temporary.unlink()
    fsync_path(path.parent)
    return True


def _durable_temporary(directory: Path, data: bytes | BinaryIO) -> Path:
    descriptor, name = tempfile.mkstemp(dir=directory, prefix=".", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as file:
            if isinstance(data, bytes | bytearray | memoryview):
                file.write(data)
            else:
                shutil.copyfileobj(data, file, _COPY_CHUNK_BYTES)
            file.flush()
            os.fsync(file.fileno())
    except BaseException:
        os.unlink(name)
        raise
    return Path(name)
