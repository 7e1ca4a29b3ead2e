"""The ``memory`` checkpoint store, for tests: process-global, gone when the process exits."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from laminar_sdk._checkpointing.blob import BlobCheckpointer, PreconditionFailed
from laminar_sdk._checkpointing.errors import CheckpointNotFound
from laminar_sdk._contract.errors import CheckpointError


@dataclass(slots=True)
class _Space:
    """What one ``memory://`` location holds: path to (content, generation)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    blobs: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    generation: int = 0


_spaces: dict[str, _Space] = {}
_spaces_lock = threading.Lock()


class MemoryCheckpointer(BlobCheckpointer):
    """Checkpoints in this process's memory, at ``memory://NAME``.

    Every instance opened on the same location in the same process sees the same data (so a
    test can "restart" by opening a new instance); other processes see nothing. Use it in
    tests; call :meth:`discard` to free a location.

    :param location: ``memory://NAME``.
    :param options: must be empty.
    """

    def __init__(self, location: str, options: Mapping[str, str] | None = None) -> None:
        if options:
            raise CheckpointError(
                f"the memory checkpoint store takes no options, got {sorted(options)}"
            )
        if not location.startswith("memory://"):
            raise CheckpointError(f"{location!r} is not a memory store location: use memory://NAME")
        self._location = location
        with _spaces_lock:
            self._space = _spaces.setdefault(location, _Space())

    @property
    def location(self) -> str:
        """The ``memory://`` location."""
        return self._location

    def __repr__(self) -> str:
        return f"MemoryCheckpointer({self._location!r})"

    def discard(self) -> None:
        """Forget everything stored at this location, for every instance opened on it."""
        with _spaces_lock:
            _spaces.pop(self._location, None)
        with self._space.lock:
            self._space.blobs.clear()

    async def _read(self, path: str) -> tuple[bytes, object]:
        with self._space.lock:
            stored = self._space.blobs.get(path)
        if stored is None:
            raise CheckpointNotFound(f"{self._location}/{path} does not exist", path=path)
        return stored

    async def _write(self, path: str, data: bytes) -> None:
        with self._space.lock:
            self._put(path, data)

    async def _write_if(self, path: str, data: bytes, expected: object | None) -> None:
        with self._space.lock:
            stored = self._space.blobs.get(path)
            if (None if stored is None else stored[1]) != expected:
                raise PreconditionFailed(path)
            self._put(path, data)

    def _put(self, path: str, data: bytes) -> None:
        self._space.generation += 1
        self._space.blobs[path] = (bytes(data), self._space.generation)

    async def _list(self) -> list[str]:
        with self._space.lock:
            return list(self._space.blobs)

    async def _delete(self, path: str) -> None:
        with self._space.lock:
            self._space.blobs.pop(path, None)
