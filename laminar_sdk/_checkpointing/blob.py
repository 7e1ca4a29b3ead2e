"""The checkpoint protocol over a store of named blobs, shared by the built-in backends.

A backend supplies five primitives (read with a version, write, conditional write, list,
delete); :class:`BlobCheckpointer` builds the :class:`Checkpointer` promises on them: manifests
created without overwriting, sink-status updates as compare-and-swap, a latest pointer that
never moves backwards, and sha256 checks on load.
"""

from __future__ import annotations

import asyncio
import io
import logging
from abc import abstractmethod
from typing import BinaryIO

from laminar_sdk._checkpointing.checkpointer import Checkpointer
from laminar_sdk._checkpointing.errors import (
    CheckpointConflict,
    CheckpointCorrupted,
    CheckpointNotFound,
)
from laminar_sdk._checkpointing.ids import (
    CheckpointId,
    checkpoint_of,
    parse_artifact_path,
    validate_stored_path,
)
from laminar_sdk._checkpointing.manifest import CheckpointManifest, sha256_hex
from laminar_sdk._contract.errors import CheckpointError
from laminar_sdk._contract.state import STATE_DIRECTORY, StateStore, validate_state_name

logger = logging.getLogger("laminar_sdk.checkpoint")

QUARANTINE_DIRECTORY = "quarantine"
"""Where :meth:`BlobCheckpointer.quarantine_checkpoint` moves a checkpoint's files."""

# Compare-and-swap retries before a write gives up: each retry means another writer
# succeeded meanwhile, so running out means a pathological number of racing writers.
_MAX_ATTEMPTS = 64


class PreconditionFailed(Exception):
    """A conditional write found a different version than expected."""


class BlobCheckpointer(Checkpointer):
    """A :class:`Checkpointer` over blobs addressed by ``/``-separated paths.

    Subclasses implement the ``_read``, ``_write``, ``_write_if``, ``_list`` and ``_delete``
    primitives. A *version* is whatever the backend uses to recognise one stored content of
    a path (a generation counter, an etag, an inode); only the backend reads it.
    """

    @abstractmethod
    async def _read(self, path: str) -> tuple[bytes, object]:
        """The content of ``path`` and its version.

        :raises CheckpointNotFound: when nothing is stored at ``path``.
        """

    @abstractmethod
    async def _write(self, path: str, data: bytes) -> None:
        """Store ``data`` at ``path`` durably and atomically, replacing what is there."""

    async def _read_file(self, path: str) -> BinaryIO:
        """The content of ``path``, as a binary file to read (the caller closes it).

        This default reads it whole; a backend that can stream it overrides this.

        :raises CheckpointNotFound: when nothing is stored at ``path``.
        """
        data, _ = await self._read(path)
        return io.BytesIO(data)

    async def _write_file(self, path: str, file: BinaryIO) -> None:
        """Like :meth:`_write`, with the content of ``file`` from its current position on.

        This default reads it whole; a backend that can stream it overrides this.
        """
        await self._write(path, await asyncio.to_thread(file.read))

    @abstractmethod
    async def _write_if(self, path: str, data: bytes, expected: object | None) -> None:
        """Like :meth:`_write`, only if ``path`` holds version ``expected`` (``None``: nothing).

        :raises PreconditionFailed: otherwise; nothing is written then.
        """

    @abstractmethod
    async def _list(self) -> list[str]:
        """Every stored path, in any order."""

    @abstractmethod
    async def _delete(self, path: str) -> None:
        """Remove ``path``; a missing path is not an error."""

    # Manifests ----------------------------------------------------------------------------

    async def save_manifest(self, manifest: CheckpointManifest) -> None:
        path = self.manifest_path(manifest.checkpoint_id)
        data = manifest.to_json()
        for _ in range(_MAX_ATTEMPTS):
            try:
                await self._write_if(path, data, None)
            except PreconditionFailed:
                pass
            else:
                return
            try:
                stored_data, version = await self._read(path)
            except CheckpointNotFound:
                continue  # deleted meanwhile: create it again
            if stored_data == data:
                return
            stored = CheckpointManifest.from_json(stored_data, path=path)
            if not manifest.is_update_of(stored):
                raise CheckpointConflict(
                    f"checkpoint {manifest.checkpoint_id} at {self.location} already has a "
                    f"different manifest ({path}); a stored manifest may only move its sinks "
                    "forward. Another writer uses the same checkpoint id, or this writer is "
                    "stale: start a new checkpoint with a new id",
                    path=path,
                )
            try:
                await self._write_if(path, data, version)
            except PreconditionFailed:
                continue
            return
        raise self._gave_up(path)

    async def load_manifest(self, checkpoint_id: CheckpointId) -> CheckpointManifest:
        path = self.manifest_path(checkpoint_id)
        data, _ = await self._read(path)
        manifest = CheckpointManifest.from_json(data, path=path)
        if manifest.checkpoint_id != checkpoint_id:
            raise CheckpointCorrupted(
                f"manifest {path} at {self.location} belongs to checkpoint "
                f"{manifest.checkpoint_id}, not {checkpoint_id}: it was copied or moved; "
                "do not load this checkpoint",
                path=path,
            )
        return manifest

    # Artifacts ----------------------------------------------------------------------------

    async def save_snapshot(
        self, checkpoint_id: CheckpointId, operator: str, partition: int, data: bytes
    ) -> str:
        return await self._save_artifact(
            self.artifact_path(checkpoint_id, operator, partition, delta=False), data
        )

    async def save_delta(
        self, checkpoint_id: CheckpointId, operator: str, partition: int, data: bytes
    ) -> str:
        return await self._save_artifact(
            self.artifact_path(checkpoint_id, operator, partition, delta=True), data
        )

    async def _save_artifact(self, path: str, data: bytes) -> str:
        if not isinstance(data, bytes | bytearray | memoryview):
            raise CheckpointError(f"artifact {path}: data must be bytes, got {type(data).__name__}")
        content = bytes(data)
        await self._write(path, content)
        return sha256_hex(content)

    async def load_artifact(self, path: str, *, sha256: str | None = None) -> bytes:
        parse_artifact_path(path)
        data, _ = await self._read(path)
        if sha256 is not None and (actual := sha256_hex(data)) != sha256:
            raise CheckpointCorrupted(
                f"artifact {path} at {self.location} fails its sha256 check (manifest says "
                f"{sha256}, the {len(data)} stored bytes hash to {actual}): it is truncated or "
                "corrupted; recovery passes over its checkpoint to an older one. Restore it "
                "from a backup, or set the checkpoint aside with `laminar checkpoints "
                "quarantine LOCATION ID`",
                path=path,
            )
        return data

    async def list_artifacts(self) -> list[str]:
        return sorted(
            path
            for path in await self._list()
            if (owner := checkpoint_of(path)) is not None and path != self.manifest_path(owner)
        )

    async def delete_artifact(self, path: str) -> None:
        owner = checkpoint_of(validate_stored_path(path))
        if owner is not None and path == self.manifest_path(owner):
            raise CheckpointError(
                f"{path} is a manifest, not an artifact: delete the checkpoint with "
                "delete_checkpoint instead"
            )
        await self._delete(path)

    # The latest pointer -------------------------------------------------------------------

    async def update_latest(self, checkpoint_id: CheckpointId) -> bool:
        # The pointer may only name a checkpoint whose manifest is stored and readable.
        await self.load_manifest(checkpoint_id)
        path = self.latest_path()
        for _ in range(_MAX_ATTEMPTS):
            version: object | None
            try:
                data, version = await self._read(path)
            except CheckpointNotFound:
                version = None
            else:
                try:
                    current = self._decode_latest(data)
                except CheckpointCorrupted as error:
                    logger.warning("replacing an unreadable latest pointer: %s", error)
                else:
                    if current >= checkpoint_id:
                        return False
            try:
                await self._write_if(path, str(checkpoint_id).encode(), version)
            except PreconditionFailed:
                continue  # another writer moved it: compare again
            return True
        raise self._gave_up(path)

    async def read_latest(self) -> CheckpointId | None:
        try:
            data, _ = await self._read(self.latest_path())
        except CheckpointNotFound:
            return None
        return self._decode_latest(data)

    def _decode_latest(self, data: bytes) -> CheckpointId:
        path = self.latest_path()
        try:
            return CheckpointId.parse(data.decode("ascii"))
        except (UnicodeDecodeError, CheckpointError) as error:
            raise CheckpointCorrupted(
                f"latest pointer {path} at {self.location} is corrupted ({len(data)} bytes that "
                "are not a checkpoint id); recovery falls back to the newest valid checkpoint, "
                "and the next completed checkpoint rewrites the pointer",
                path=path,
            ) from error

    # Listing and deleting -----------------------------------------------------------------

    async def list_checkpoints(self) -> list[CheckpointId]:
        return sorted(
            owner
            for path in await self._list()
            if (owner := checkpoint_of(path)) is not None and path == self.manifest_path(owner)
        )

    async def delete_checkpoint(self, checkpoint_id: CheckpointId) -> None:
        manifest = self.manifest_path(checkpoint_id)
        paths = sorted(path for path in await self._list() if checkpoint_of(path) == checkpoint_id)
        # The manifest goes first: a crash part-way leaves orphaned artifacts, which retention
        # removes, never a manifest that lists missing artifacts.
        if manifest in paths:
            await self._delete(manifest)
        for path in paths:
            if path != manifest:
                await self._delete(path)

    def state_store(self, space: str) -> StateStore:
        return _BlobStateStore(self, f"{STATE_DIRECTORY}/{validate_state_name(space)}")

    async def quarantine_checkpoint(self, checkpoint_id: CheckpointId) -> list[str]:
        paths = sorted(p for p in await self._list() if checkpoint_of(p) == checkpoint_id)
        if not paths:
            raise CheckpointNotFound(
                f"nothing is stored for checkpoint {checkpoint_id} at {self.location}; "
                "`laminar checkpoints list LOCATION` shows the stored ones",
                path=self.manifest_path(checkpoint_id),
            )
        # Copies first, the originals last: a crash part-way leaves both, never neither.
        moved = []
        for path in paths:
            data, _ = await self._read(path)
            await self._write(f"{QUARANTINE_DIRECTORY}/{path}", data)
            moved.append(f"{QUARANTINE_DIRECTORY}/{path}")
        await self._repoint_latest(leaving=checkpoint_id)
        for path in paths:
            await self._delete(path)
        return moved

    async def _repoint_latest(self, *, leaving: CheckpointId) -> None:
        """Move the latest pointer off ``leaving``, back to the newest valid older checkpoint.

        Never forward: a checkpoint newer than the pointer was not completed.
        """
        try:
            latest = await self.read_latest()
        except CheckpointCorrupted:
            latest = None  # unreadable: which checkpoints were completed is unknown
        else:
            if latest != leaving:
                return
        for candidate in reversed(await self.list_checkpoints()):
            if candidate == leaving or (latest is not None and candidate > latest):
                continue
            try:
                await self.load_manifest(candidate)
            except CheckpointError:
                continue
            # Moving the pointer backwards is a repair, so not update_latest (which refuses).
            await self._write(self.latest_path(), str(candidate).encode())
            return
        await self._delete(self.latest_path())

    def _gave_up(self, path: str) -> CheckpointConflict:
        return CheckpointConflict(
            f"{path} at {self.location} changed under {_MAX_ATTEMPTS} consecutive attempts to "
            "update it: too many writers race on this location; give each pipeline its own "
            "checkpoint location",
            path=path,
        )


class _BlobStateStore(StateStore):
    """A :class:`StateStore` over a blob checkpoint store's primitives, under a prefix."""

    def __init__(self, blobs: BlobCheckpointer, prefix: str) -> None:
        self._blobs = blobs
        self._prefix = prefix

    @property
    def location(self) -> str:
        return f"{self._blobs.location.rstrip('/')}/{self._prefix}"

    async def put(self, name: str, data: bytes) -> None:
        await self._blobs._write(self._path(name), bytes(data))

    async def put_file(self, name: str, file: BinaryIO) -> None:
        await self._blobs._write_file(self._path(name), file)

    async def get(self, name: str) -> bytes | None:
        try:
            data, _ = await self._blobs._read(self._path(name))
        except CheckpointNotFound:
            return None
        return data

    async def get_file(self, name: str) -> BinaryIO | None:
        try:
            return await self._blobs._read_file(self._path(name))
        except CheckpointNotFound:
            return None

    async def delete(self, name: str) -> None:
        await self._blobs._delete(self._path(name))

    async def names(self, prefix: str = "") -> list[str]:
        start = f"{self._prefix}/"
        found = [path[len(start) :] for path in await self._blobs._list() if path.startswith(start)]
        return sorted(name for name in found if name.startswith(prefix) and _is_stored_name(name))

    def _path(self, name: str) -> str:
        return f"{self._prefix}/{validate_state_name(name)}"


def _is_stored_name(name: str) -> bool:
    """Whether a listed path under a state prefix is a name (not a write's leftover)."""
    try:
        validate_state_name(name)
    except CheckpointError:
        return False
    return True
