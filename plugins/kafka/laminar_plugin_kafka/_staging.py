"""Where the ``kafka`` sink keeps pre-committed epochs: ``staging.dir``, or the runtime's store.

A pre-committed epoch must survive the process that wrote it: after a crash another instance
— on Spark, the driver's next commit, possibly on another machine — produces it again in a new
transaction (see :mod:`laminar_plugin_kafka._sink`). By default it is kept in the
:class:`~laminar_sdk.StateStore` the runtime hands the sink, in the laminar checkpoint location
(a file system or an object store); ``staging.dir`` names a directory to keep it in instead.
Each epoch is one Arrow IPC stream, ``<transactional id>/epoch-<N>.arrow``.
"""

from __future__ import annotations

import asyncio
import re
from abc import ABC, abstractmethod
from pathlib import Path
from typing import BinaryIO

from laminar_sdk import (
    CheckpointError,
    StateStore,
    fsync_path,
    make_dirs,
    write_file_atomically,
)

_STAGED = re.compile(r"epoch-(\d+)\.arrow")


class EpochStaging(ABC):
    """The pre-committed epochs of one transactional id, kept durably."""

    def __init__(self, transactional_id: str) -> None:
        self._transactional_id = transactional_id

    def name(self, epoch: int) -> str:
        """The staged copy's name: ``<transactional id>/epoch-<epoch>.arrow``."""
        return f"{self._transactional_id}/epoch-{epoch}.arrow"

    @abstractmethod
    def where(self, epoch: int) -> str:
        """Where the staged copy of ``epoch`` is, for messages."""

    @abstractmethod
    async def save(self, epoch: int, file: BinaryIO) -> None:
        """Keep what ``file`` holds from its position on as ``epoch``'s staged copy, durably.

        Streamed, a chunk at a time: an epoch never has to fit in memory.

        :raises OSError: or :class:`CheckpointError` when it cannot be written.
        """

    @abstractmethod
    async def open(self, epoch: int) -> BinaryIO | None:
        """The staged copy of ``epoch``, as a file to read (close it), or ``None`` when none.

        Streamed: an epoch never has to fit in memory.
        """

    @abstractmethod
    async def discard(self, epoch: int) -> None:
        """Remove the staged copy of ``epoch``, if any."""

    @abstractmethod
    async def epochs(self) -> list[int]:
        """The epochs that have a staged copy."""

    async def discard_through(self, epoch: int) -> None:
        """Remove the staged copies of ``epoch`` and older ones (committed before)."""
        for staged in await self.epochs():
            if staged <= epoch:
                await self.discard(staged)


class DirectoryStaging(EpochStaging):
    """Staged copies in a directory of ``staging.dir``, written atomically and fsynced."""

    def __init__(self, directory: Path, transactional_id: str) -> None:
        super().__init__(transactional_id)
        self._directory = directory / transactional_id

    def where(self, epoch: int) -> str:
        return str(self._path(epoch))

    async def save(self, epoch: int, file: BinaryIO) -> None:
        path = self._path(epoch)

        def write() -> None:
            make_dirs(path.parent)
            write_file_atomically(path, file)

        await asyncio.to_thread(write)

    async def open(self, epoch: int) -> BinaryIO | None:
        try:
            return await asyncio.to_thread(self._path(epoch).open, "rb")
        except FileNotFoundError:
            return None

    async def discard(self, epoch: int) -> None:
        path = self._path(epoch)

        def remove() -> None:
            if path.exists():
                path.unlink()
                fsync_path(path.parent)

        await asyncio.to_thread(remove)

    async def epochs(self) -> list[int]:
        if not self._directory.is_dir():
            return []
        names = await asyncio.to_thread(lambda: [path.name for path in self._directory.iterdir()])
        return sorted(int(match[1]) for name in names if (match := _STAGED.fullmatch(name)))

    def _path(self, epoch: int) -> Path:
        return self._directory / f"epoch-{epoch}.arrow"


class StoreStaging(EpochStaging):
    """Staged copies in the sink's :class:`~laminar_sdk.StateStore`."""

    def __init__(self, store: StateStore, transactional_id: str) -> None:
        super().__init__(transactional_id)
        self._store = store

    def where(self, epoch: int) -> str:
        return f"{self._store.location}/{self.name(epoch)}"

    async def save(self, epoch: int, file: BinaryIO) -> None:
        await self._store.put_file(self.name(epoch), file)

    async def open(self, epoch: int) -> BinaryIO | None:
        return await self._store.get_file(self.name(epoch))

    async def discard(self, epoch: int) -> None:
        await self._store.delete(self.name(epoch))

    async def epochs(self) -> list[int]:
        prefix = f"{self._transactional_id}/"
        names = await self._store.names(prefix)
        return sorted(
            int(match[1])
            for name in names
            if (match := _STAGED.fullmatch(name.removeprefix(prefix)))
        )


STAGING_ERRORS = (OSError, CheckpointError)
"""What a staging's ``save`` raises when it cannot write."""
