"""Retention: keep the newest checkpoints, delete older ones and orphaned artifacts."""

from __future__ import annotations

import time
from dataclasses import dataclass

from laminar_sdk._checkpointing.checkpointer import Checkpointer
from laminar_sdk._checkpointing.ids import CheckpointId, checkpoint_of
from laminar_sdk._checkpointing.manifest import CheckpointManifest
from laminar_sdk._contract.errors import CheckpointError

DEFAULT_ORPHAN_GRACE_S = 600.0
"""How old an unreferenced artifact must be before it is deleted (it may be mid-checkpoint)."""


@dataclass(frozen=True, slots=True)
class PruneResult:
    """What :func:`prune_checkpoints` did.

    :param kept: the checkpoints left, oldest first.
    :param deleted_checkpoints: the checkpoints deleted, oldest first.
    :param deleted_artifacts: the orphaned artifacts deleted (outside deleted checkpoints).
    """

    kept: tuple[CheckpointId, ...]
    deleted_checkpoints: tuple[CheckpointId, ...]
    deleted_artifacts: tuple[str, ...]


def _dependencies(manifest: CheckpointManifest) -> set[CheckpointId]:
    owners = {checkpoint_of(path) for path in manifest.artifact_paths()}
    owners.add(manifest.parent_id)
    owners.discard(None)
    owners.discard(manifest.checkpoint_id)
    return {owner for owner in owners if owner is not None}


async def prune_checkpoints(
    checkpointer: Checkpointer,
    *,
    keep: int,
    orphan_grace_s: float = DEFAULT_ORPHAN_GRACE_S,
) -> PruneResult:
    """Keep the newest ``keep`` checkpoints; delete older ones and orphaned artifacts.

    Kept, whatever their age: the checkpoint the latest pointer names; every checkpoint a kept
    one depends on (its ``parent_id``, or an artifact it lists from an older checkpoint);
    checkpoints whose manifest cannot be read, when they are newer than the oldest kept one
    (left for ``laminar checkpoints verify`` to report). Only checkpoints with a readable
    manifest count towards ``keep``.

    An artifact no remaining manifest lists is deleted when it belongs to a checkpoint older
    than the latest one and was made more than ``orphan_grace_s`` seconds ago (newer ones may
    belong to a checkpoint still being written).

    :raises CheckpointError: when ``keep`` is below 1, or the latest pointer is unreadable
        (run recovery first: the next ``update_latest`` rewrites the pointer).
    """
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise CheckpointError(f"retention must keep at least 1 checkpoint, got keep={keep!r}")
    latest = await checkpointer.read_latest()
    stored = await checkpointer.list_checkpoints()
    manifests: dict[CheckpointId, CheckpointManifest] = {}
    for checkpoint_id in stored:
        try:
            manifests[checkpoint_id] = await checkpointer.load_manifest(checkpoint_id)
        except CheckpointError:
            continue  # unreadable: kept when recent, deleted when old (see below)
    kept = set([c for c in stored if c in manifests][-keep:])
    if latest in manifests:
        kept.add(latest)
    pending = list(kept)
    while pending:
        for dependency in _dependencies(manifests[pending.pop()]):
            if dependency in manifests and dependency not in kept:
                kept.add(dependency)
                pending.append(dependency)
    oldest_kept = min(kept, default=None)
    doomed = [
        c
        for c in stored
        if c not in kept and (c in manifests or oldest_kept is None or c < oldest_kept)
    ]
    for checkpoint_id in doomed:
        await checkpointer.delete_checkpoint(checkpoint_id)
    remaining = [c for c in stored if c not in doomed]
    deleted_artifacts = await _prune_orphans(
        checkpointer,
        latest,
        [manifests[c] for c in remaining if c in manifests],
        unreadable={c for c in remaining if c not in manifests},
        orphan_grace_s=orphan_grace_s,
    )
    return PruneResult(tuple(remaining), tuple(doomed), deleted_artifacts)


async def _prune_orphans(
    checkpointer: Checkpointer,
    latest: CheckpointId | None,
    manifests: list[CheckpointManifest],
    *,
    unreadable: set[CheckpointId],
    orphan_grace_s: float,
) -> tuple[str, ...]:
    if latest is None:
        return ()  # no checkpoint was ever completed: everything may be in flight
    referenced = set().union(*(m.artifact_paths() for m in manifests))
    cutoff_ms = time.time_ns() // 1_000_000 - orphan_grace_s * 1000
    deleted: list[str] = []
    for path in await checkpointer.list_artifacts():
        owner = checkpoint_of(path)
        if (
            owner is None
            or path in referenced
            or owner in unreadable
            or owner > latest
            or owner.timestamp_ms > cutoff_ms
        ):
            continue
        await checkpointer.delete_artifact(path)
        deleted.append(path)
    return tuple(deleted)
