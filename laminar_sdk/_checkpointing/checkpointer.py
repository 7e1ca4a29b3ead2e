"""The :class:`Checkpointer` contract: LaminarDB's ``Checkpointer`` trait, in async Python."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod

from laminar_sdk._checkpointing.ids import LATEST_PATH, CheckpointId, artifact_path, manifest_path
from laminar_sdk._checkpointing.manifest import CheckpointManifest, PartitionSnapshotEntry
from laminar_sdk._contract.errors import CheckpointError
from laminar_sdk._contract.state import StateStore

_USERINFO = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)[^/@]*@")


def display_location(location: str) -> str:
    """``location`` without anything that may be a credential (``user:pass@``, a query).

    Object-store URLs may carry a password or a signed query string (an Azure SAS token);
    messages and listings show the location through this function only.
    """
    without_query = location.split("?", 1)[0].split("#", 1)[0]
    return _USERINFO.sub(r"\g<scheme>***@", without_query)


class Checkpointer(ABC):
    """Where checkpoints are stored: manifests, operator state artifacts, a latest pointer.

    The methods are LaminarDB's ``Checkpointer`` trait (``save_manifest``, ``load_manifest``,
    ``save_snapshot``, ``save_delta``, ``load_artifact``, ``update_latest``, ``read_latest``,
    ``list_checkpoints``, ``delete_checkpoint``) plus :meth:`list_artifacts` and
    :meth:`delete_artifact`, which retention needs to remove orphaned artifacts.

    The order of one checkpoint is: save every artifact, then the manifest, then
    :meth:`update_latest`. A crash at any point leaves the previous checkpoint the latest. An
    implementation must keep these promises (the ``laminar-conformance`` checkpointer suite
    checks them):

    - a stored manifest is never replaced by different content, except by a manifest that
      only moves its sinks forward (:meth:`CheckpointManifest.is_update_of`); a conflicting
      save raises :class:`CheckpointConflict`, also when two writers race;
    - the latest pointer never moves to an older checkpoint, also when two writers race;
    - what is loaded is what was saved, or a :class:`CheckpointCorrupted` /
      :class:`CheckpointNotFound` naming the path — never other bytes;
    - no id, operator or path can address anything outside the store's location.

    Instances are made by factories registered under the ``laminar_sdk.checkpointers``
    entry-point group; see ``open_checkpointer``.
    """

    @property
    @abstractmethod
    def location(self) -> str:
        """Where the store is, safe to show (no credentials)."""

    # The layout every store uses, relative to its location (LaminarDB's V2 layout).

    def manifest_path(self, checkpoint_id: CheckpointId) -> str:
        """Where the manifest of ``checkpoint_id`` is: ``{checkpoint_id}/manifest.json``."""
        return manifest_path(checkpoint_id)

    def latest_path(self) -> str:
        """Where the latest pointer is: ``_latest``."""
        return LATEST_PATH

    def artifact_path(
        self, checkpoint_id: CheckpointId, operator: str, partition: int, *, delta: bool = False
    ) -> str:
        """Where a partition's snapshot (or delta) is.

        That is ``{checkpoint_id}/operators/{operator}/partition-{partition}.snap``
        (``.delta``).

        :raises CheckpointError: when ``operator`` or ``partition`` cannot be part of a path.
        """
        return artifact_path(checkpoint_id, operator, partition, delta=delta)

    async def save_partition(
        self,
        checkpoint_id: CheckpointId,
        operator: str,
        partition: int,
        data: bytes,
        *,
        delta: bool = False,
    ) -> PartitionSnapshotEntry:
        """Save a snapshot (or delta) and return the manifest entry that describes it.

        Equivalent to :meth:`save_snapshot` / :meth:`save_delta` followed by building the
        :class:`PartitionSnapshotEntry` from the returned digest.
        """
        save = self.save_delta if delta else self.save_snapshot
        digest = await save(checkpoint_id, operator, partition, data)
        path = self.artifact_path(checkpoint_id, operator, partition, delta=delta)
        return PartitionSnapshotEntry(partition, delta, path, len(data), digest)

    @abstractmethod
    async def save_manifest(self, manifest: CheckpointManifest) -> None:
        """Store ``manifest`` durably, once every artifact it lists is stored.

        Saving the same content again is a no-op; saving a manifest that moves sinks forward
        replaces the stored one.

        :raises CheckpointConflict: when different content is stored under the same id.
        """

    @abstractmethod
    async def load_manifest(self, checkpoint_id: CheckpointId) -> CheckpointManifest:
        """Load and check the manifest of ``checkpoint_id``.

        :raises CheckpointNotFound: when there is none.
        :raises CheckpointCorrupted: when it is truncated, corrupted or of an unknown version.
        """

    @abstractmethod
    async def save_snapshot(
        self, checkpoint_id: CheckpointId, operator: str, partition: int, data: bytes
    ) -> str:
        """Store a full state snapshot of one operator partition durably.

        :returns: the hex SHA-256 of ``data``, for the manifest's entry.
        :raises CheckpointError: when ``operator`` or ``partition`` cannot be a path.
        """

    @abstractmethod
    async def save_delta(
        self, checkpoint_id: CheckpointId, operator: str, partition: int, data: bytes
    ) -> str:
        """Store an incremental delta of one operator partition durably.

        :returns: the hex SHA-256 of ``data``, for the manifest's entry.
        :raises CheckpointError: when ``operator`` or ``partition`` cannot be a path.
        """

    @abstractmethod
    async def load_artifact(self, path: str, *, sha256: str | None = None) -> bytes:
        """Load the snapshot or delta at ``path`` (a manifest entry's ``path``).

        :param sha256: the digest the manifest recorded; when given (recovery always gives
            it), the bytes are checked against it.
        :raises CheckpointNotFound: when the artifact is missing.
        :raises CheckpointCorrupted: when the bytes fail the ``sha256`` check.
        :raises CheckpointError: when ``path`` is not an artifact path of this layout.
        """

    @abstractmethod
    async def update_latest(self, checkpoint_id: CheckpointId) -> bool:
        """Point the latest pointer at ``checkpoint_id``, unless it points at a newer one.

        :returns: ``True`` when the pointer moved, ``False`` when it already pointed at
            ``checkpoint_id`` or a newer checkpoint.
        :raises CheckpointNotFound: when ``checkpoint_id`` has no stored manifest.
        """

    @abstractmethod
    async def read_latest(self) -> CheckpointId | None:
        """The checkpoint the latest pointer names, or ``None`` before the first one.

        :raises CheckpointCorrupted: when the pointer is unreadable.
        """

    @abstractmethod
    async def list_checkpoints(self) -> list[CheckpointId]:
        """Every checkpoint with a stored manifest, oldest first."""

    @abstractmethod
    async def delete_checkpoint(self, checkpoint_id: CheckpointId) -> None:
        """Delete a checkpoint's manifest, then everything else stored under its id.

        Deleting a checkpoint that does not exist is a no-op.
        """

    @abstractmethod
    async def list_artifacts(self) -> list[str]:
        """Every stored path inside a checkpoint's directory except the manifests, sorted.

        This includes files no manifest references: artifacts of a checkpoint whose manifest
        was never saved (a crash) and leftovers of interrupted writes.
        """

    @abstractmethod
    async def delete_artifact(self, path: str) -> None:
        """Delete one stored path returned by :meth:`list_artifacts` (missing is a no-op).

        :raises CheckpointError: when ``path`` is not inside a checkpoint's directory.
        """

    def state_store(self, space: str) -> StateStore | None:
        """A :class:`StateStore` kept in this location, under ``state/<space>``.

        ``None`` when this store cannot keep one (the default).

        :raises CheckpointError: when ``space`` is not a safe name.
        """
        return None

    async def quarantine_checkpoint(self, checkpoint_id: CheckpointId) -> list[str]:
        """Set a checkpoint aside: move its files where recovery never looks; return them.

        For a checkpoint that is corrupted or belongs to another query: its files are kept
        (for a post-mortem, or to be put back) but no longer considered. If the latest
        pointer names it, the pointer moves to the newest valid checkpoint left (or is
        removed when none is). Default: refused, for stores that cannot move files.

        :raises CheckpointNotFound: when nothing is stored under ``checkpoint_id``.
        :raises CheckpointError: when this store cannot set checkpoints aside.
        """
        raise CheckpointError(
            f"the checkpoint store at {self.location} ({type(self).__name__}) cannot set "
            f"checkpoint {checkpoint_id} aside: restore the location from a backup instead"
        )
