"""Loading checkpoints back, checked end to end, and finding the newest one that is valid."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from laminar_sdk._checkpointing.checkpointer import Checkpointer
from laminar_sdk._checkpointing.errors import CheckpointNotFound
from laminar_sdk._checkpointing.ids import CheckpointId
from laminar_sdk._checkpointing.manifest import CheckpointManifest
from laminar_sdk._contract.errors import CheckpointError

logger = logging.getLogger("laminar_sdk.checkpoint")


@dataclass(frozen=True, slots=True)
class RecoveredCheckpoint:
    """A checkpoint loaded back whole: its manifest and every artifact, each checked.

    :param manifest: the checkpoint's manifest.
    :param artifacts: every artifact the manifest lists, by path, each matching its sha256.
    :param skipped: why newer checkpoints were passed over (empty when the latest was valid);
        worth logging, as each one is a corrupted or incomplete checkpoint.
    """

    manifest: CheckpointManifest
    artifacts: Mapping[str, bytes]
    skipped: tuple[CheckpointError, ...] = field(default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "artifacts", MappingProxyType(dict(self.artifacts)))

    def __hash__(self) -> int:
        return hash(self.manifest)

    def artifact(self, operator: str, partition: int) -> bytes:
        """The state of one operator partition.

        :raises KeyError: naming them when the manifest lists no such partition.
        """
        for entry in self.manifest.operators.get(operator, ()):
            if entry.partition_id == partition:
                return self.artifacts[entry.path]
        raise KeyError(
            f"checkpoint {self.manifest.checkpoint_id} has no partition {partition} of "
            f"operator {operator!r}"
        )


async def load_checkpoint(
    checkpointer: Checkpointer, checkpoint_id: CheckpointId
) -> RecoveredCheckpoint:
    """Load one checkpoint's manifest and all its artifacts, checking each sha256.

    :raises CheckpointNotFound: naming the manifest or artifact that is missing.
    :raises CheckpointCorrupted: naming the manifest or artifact that is corrupted.
    """
    manifest = await checkpointer.load_manifest(checkpoint_id)
    artifacts = {
        entry.path: await checkpointer.load_artifact(entry.path, sha256=entry.sha256)
        for _, entry in manifest.partitions()
    }
    return RecoveredCheckpoint(manifest, artifacts)


async def verify_checkpoint(
    checkpointer: Checkpointer, checkpoint_id: CheckpointId
) -> list[CheckpointError]:
    """Every problem of one checkpoint: an unreadable manifest, or each bad artifact.

    Artifacts are read one at a time and not kept, so this runs in bounded memory.
    """
    try:
        manifest = await checkpointer.load_manifest(checkpoint_id)
    except CheckpointError as error:
        return [error]
    problems: list[CheckpointError] = []
    for _, entry in manifest.partitions():
        try:
            await checkpointer.load_artifact(entry.path, sha256=entry.sha256)
        except CheckpointError as error:
            problems.append(error)
    return problems


@dataclass(frozen=True, slots=True)
class CheckpointSearch:
    """What :func:`search_latest_valid` found.

    :param recovered: the newest valid checkpoint the latest pointer allows, or ``None``.
    :param skipped: why checkpoints the latest pointer names or allows, newer than
        ``recovered``, were passed over — completed checkpoints that are now unreadable or
        missing, or an unreadable pointer; empty when the latest checkpoint was valid.
    """

    recovered: RecoveredCheckpoint | None
    skipped: tuple[CheckpointError, ...]


async def search_latest_valid(
    checkpointer: Checkpointer,
    *,
    on_skip: Callable[[CheckpointError], None] | None = None,
) -> CheckpointSearch:
    """The newest valid checkpoint, and what was passed over to find it; never raises for them.

    Starts from the checkpoint the latest pointer names and walks back through older ones
    until one loads whole (manifest and every artifact pass their checks). Checkpoints newer
    than the pointer are never used: they were not completed. When the pointer itself is
    unreadable, every stored checkpoint is a candidate, newest first. The store is listed only
    when the checkpoint the pointer names does not load: a store keeps every checkpoint, and
    the Spark bridge searches once per micro-batch.

    :param on_skip: called with the reason each time a checkpoint is passed over (default:
        log a warning to ``laminar_sdk.checkpoint``).
    """
    report = on_skip or (lambda error: logger.warning("skipping checkpoint: %s", error))
    skipped: list[CheckpointError] = []

    def skip(error: CheckpointError) -> None:
        skipped.append(error)
        report(error)

    try:
        latest = await checkpointer.read_latest()
    except CheckpointError as error:
        skip(error)
        candidates = await checkpointer.list_checkpoints()
    else:
        if latest is None:
            return CheckpointSearch(None, ())
        with contextlib.suppress(CheckpointError):  # else walk back, reporting it below
            return CheckpointSearch(await load_checkpoint(checkpointer, latest), ())
        candidates = [c for c in await checkpointer.list_checkpoints() if c <= latest]
        if latest not in candidates:
            skip(
                CheckpointNotFound(
                    f"the latest pointer at {checkpointer.location} names checkpoint {latest}, "
                    "which has no manifest",
                    path=checkpointer.manifest_path(latest),
                )
            )
    for checkpoint_id in reversed(candidates):
        try:
            recovered = await load_checkpoint(checkpointer, checkpoint_id)
        except CheckpointError as error:
            skip(error)
            continue
        found = RecoveredCheckpoint(recovered.manifest, recovered.artifacts, tuple(skipped))
        return CheckpointSearch(found, tuple(skipped))
    return CheckpointSearch(None, tuple(skipped))


async def load_latest_valid(
    checkpointer: Checkpointer,
    *,
    on_skip: Callable[[CheckpointError], None] | None = None,
) -> RecoveredCheckpoint | None:
    """The checkpoint to recover from: the latest, or the newest valid one before it.

    See :func:`search_latest_valid`, which this calls.

    :param on_skip: called with the reason each time a checkpoint is passed over (default:
        log a warning to ``laminar_sdk.checkpoint``).
    :returns: ``None`` when no checkpoint was ever completed (no latest pointer).
    :raises CheckpointError: when checkpoints exist but none of them is valid, listing why:
        starting from nothing would silently lose or repeat data.
    """
    search = await search_latest_valid(checkpointer, on_skip=on_skip)
    if search.recovered is None and search.skipped:
        # Something was skipped (the pointer, or every candidate) and nothing is left.
        reasons = "; ".join(str(error) for error in search.skipped)
        raise CheckpointError(
            f"no valid checkpoint at {checkpointer.location}: {reasons}. Restore the store "
            "from a backup, or set the bad checkpoints aside with `laminar checkpoints "
            "quarantine LOCATION ID...`; with none left the pipeline starts over"
        )
    return search.recovered


async def mark_committed(
    checkpointer: Checkpointer, epoch: int, *, query_id: str | None = None
) -> CheckpointManifest:
    """Record that every epoch up to ``epoch`` is committed: a new, latest checkpoint.

    The repair for a location that lost checkpoints another record proves (Spark's commit
    log): the next recovery resumes after ``epoch``. The checkpoint names no sink and no
    source offsets.

    :param query_id: the streaming query the epochs belong to (recovery checks it).
    :raises CheckpointError: when a valid checkpoint of ``epoch`` or later exists already.
    """
    search = await search_latest_valid(checkpointer, on_skip=lambda _: None)
    if search.recovered is not None and search.recovered.manifest.epoch >= epoch:
        newest = search.recovered.manifest
        raise CheckpointError(
            f"checkpoint {newest.checkpoint_id} at {checkpointer.location} already records "
            f"epoch {newest.epoch}, not older than {epoch}: nothing to mark"
        )
    manifest = CheckpointManifest.new(epoch, query_id=query_id)
    await checkpointer.save_manifest(manifest)
    await checkpointer.update_latest(manifest.checkpoint_id)
    return manifest
