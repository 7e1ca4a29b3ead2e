"""The ``file`` checkpoint store: a directory on a local (POSIX) file system.

Every file is written to a temporary name in its directory, fsynced, renamed over its final
name and then the directory is fsynced, so a crash leaves either the old file or the new one,
never a torn one; new directories are fsynced into their parents. Conditional writes (the
manifest create, sink-status updates, the latest pointer) hold an exclusive ``flock`` on
``.lock`` in the store's root, which serialises writers in any thread or process on the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

from laminar_sdk._checkpointing.blob import BlobCheckpointer, PreconditionFailed
from laminar_sdk._checkpointing.errors import CheckpointNotFound
from laminar_sdk._contract.durable import fsync_path, make_dirs, write_file_atomically
from laminar_sdk._contract.errors import CheckpointError

_LOCK_NAME = ".lock"


def _version(stat: os.stat_result) -> tuple[int, int, int]:
    # Every write renames a new file into place, so the inode changes with each content.
    return (stat.st_ino, stat.st_mtime_ns, stat.st_size)


class FileCheckpointer(BlobCheckpointer):
    """Checkpoints in a local directory: ``file:///path`` or a bare path.

    The directory is created on the first write. No options are accepted.

    :param location: ``file:///abs/path``, or a path (relative paths are resolved now).
    :param options: must be empty.
    """

    def __init__(self, location: str, options: Mapping[str, str] | None = None) -> None:
        if options:
            raise CheckpointError(
                f"the file checkpoint store takes no options, got {sorted(options)}"
            )
        path = location.removeprefix("file://") if location.startswith("file://") else location
        if not path or "\0" in path:
            raise CheckpointError(f"{location!r} is not a directory path for the file store")
        self._root = Path(path).expanduser().absolute()

    @property
    def root(self) -> Path:
        """The directory checkpoints are stored in."""
        return self._root

    @property
    def location(self) -> str:
        """The store's directory."""
        return str(self._root)

    def __repr__(self) -> str:
        return f"FileCheckpointer({str(self._root)!r})"

    def _file(self, path: str) -> Path:
        # Paths reaching here come from the layout (ids, validated operators) or were listed.
        return self._root.joinpath(*path.split("/"))

    # Primitives: each runs its blocking I/O in a worker thread. -----------------------------

    async def _read(self, path: str) -> tuple[bytes, object]:
        return await asyncio.to_thread(self._read_sync, path)

    async def _write(self, path: str, data: bytes) -> None:
        await asyncio.to_thread(self._replace_sync, path, data)

    async def _read_file(self, path: str) -> BinaryIO:
        return await asyncio.to_thread(self._read_file_sync, path)

    async def _write_file(self, path: str, file: BinaryIO) -> None:
        await asyncio.to_thread(self._replace_sync, path, file)

    async def _write_if(self, path: str, data: bytes, expected: object | None) -> None:
        await asyncio.to_thread(self._write_if_sync, path, data, expected)

    async def _list(self) -> list[str]:
        return await asyncio.to_thread(self._list_sync)

    async def _delete(self, path: str) -> None:
        await asyncio.to_thread(self._delete_sync, path)

    # Blocking implementations -------------------------------------------------------------

    def _read_sync(self, path: str) -> tuple[bytes, object]:
        target = self._file(path)
        try:
            with target.open("rb") as stream:
                version = _version(os.fstat(stream.fileno()))
                return stream.read(), version
        except FileNotFoundError:
            raise CheckpointNotFound(
                f"{target} does not exist: the checkpoint was never completed or was deleted",
                path=path,
            ) from None
        except OSError as error:
            raise self._io_error("read", target, error) from error

    def _read_file_sync(self, path: str) -> BinaryIO:
        target = self._file(path)
        try:
            return target.open("rb")
        except FileNotFoundError:
            raise CheckpointNotFound(f"{target} does not exist", path=path) from None
        except OSError as error:
            raise self._io_error("read", target, error) from error

    def _write_if_sync(self, path: str, data: bytes, expected: object | None) -> None:
        target = self._file(path)
        try:
            with self._locked():
                try:
                    current: object | None = _version(os.stat(target))
                except FileNotFoundError:
                    current = None
                if current != expected:
                    raise PreconditionFailed(path)
                self._replace_sync(path, data)
        except OSError as error:
            raise self._io_error("write", target, error) from error

    def _replace_sync(self, path: str, data: bytes | BinaryIO) -> None:
        target = self._file(path)
        try:
            make_dirs(target.parent)
            write_file_atomically(target, data)
        except OSError as error:
            raise self._io_error("write", target, error) from error

    def _list_sync(self) -> list[str]:
        found: list[str] = []
        for directory, _, files in os.walk(self._root):
            relative = Path(directory).relative_to(self._root).parts
            found.extend("/".join((*relative, name)) for name in files)
        return found

    def _delete_sync(self, path: str) -> None:
        target = self._file(path)
        try:
            target.unlink(missing_ok=True)
            fsync_path(target.parent)
            # Remove directories left empty, up to (not including) the root.
            directory = target.parent
            while directory != self._root and directory.is_relative_to(self._root):
                try:
                    directory.rmdir()
                except OSError as error:
                    if error.errno in {errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT}:
                        break
                    raise
                fsync_path(directory.parent)
                directory = directory.parent
        except FileNotFoundError:
            return  # the directory went away with a concurrent delete
        except OSError as error:
            raise self._io_error("delete", target, error) from error

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        make_dirs(self._root)
        fd = os.open(self._root / _LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _io_error(self, action: str, target: Path, error: OSError) -> CheckpointError:
        return CheckpointError(
            f"could not {action} {target}: {error.strerror or error}; check that the "
            "directory exists, is writable and the disk is not full"
        )
