"""The checkpoint manifest: what one checkpoint holds, stored as checksummed JSON.

The fields follow LaminarDB's ``CheckpointManifestV2``; the per-sink epoch status follows its
``sink_commit_statuses``. The JSON is this SDK's own format (:data:`MANIFEST_VERSION`): never
pickle, keys sorted, and a ``manifest_sha256`` over the canonical text so that a flipped byte
is found even where the JSON still parses.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from laminar_sdk._checkpointing.errors import CheckpointCorrupted, UnsupportedManifestVersion
from laminar_sdk._checkpointing.ids import (
    CheckpointId,
    parse_artifact_path,
    validate_operator,
)
from laminar_sdk._contract.checkpoint import SourceCheckpoint
from laminar_sdk._contract.errors import CheckpointError

MANIFEST_VERSION = 1
"""The manifest format this SDK writes and the only one it reads."""

MANIFEST_PATH_UNKNOWN = "<manifest>"

_SHA256_PATTERN = re.compile(r"[0-9a-f]{64}")
_FIELDS = frozenset(
    {
        "version",
        "checkpoint_id",
        "epoch",
        "timestamp_ms",
        "operators",
        "source_offsets",
        "sink_statuses",
        "parent_id",
        "watermark",
        "total_size_bytes",
        "manifest_sha256",
        "sink_commit_descriptors",
        "query_id",
    }
)


def sha256_hex(data: bytes) -> str:
    """The lower-case hex SHA-256 digest of ``data``, as stored in manifests."""
    return hashlib.sha256(data).hexdigest()


def _canonical(document: Mapping[str, Any]) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


class SinkEpochStatus(StrEnum):
    """Where a sink stands on the epoch of a checkpoint.

    A manifest is first stored with its sinks ``PENDING`` (after their ``pre_commit``); once
    the latest pointer names it, the commit is decided, and a sink moves to ``COMMITTED`` when
    its ``commit_epoch`` returned. Recovery finishes the commit of every sink still
    ``PENDING`` in the latest valid manifest, and rolls back the epoch after it. ``FAILED`` is
    for a sink whose commit can never succeed and needs an operator.
    """

    PENDING = "pending"
    COMMITTED = "committed"
    FAILED = "failed"

    def can_become(self, status: SinkEpochStatus) -> bool:
        """Whether a sink in this status may move to ``status`` (only forward, or stay)."""
        return status is self or self is SinkEpochStatus.PENDING


def _non_negative_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CheckpointError(f"{what} must be a non-negative int, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class PartitionSnapshotEntry:
    """One stored snapshot or delta of one operator partition.

    :param partition_id: the partition.
    :param is_delta: ``True`` for an incremental delta, ``False`` for a full snapshot.
    :param path: where the artifact is, relative to the store (as returned by the store's
        ``save_snapshot`` / ``save_delta`` layout); it may be in a parent checkpoint.
    :param size_bytes: the artifact's length.
    :param sha256: the artifact's hex SHA-256, as returned by ``save_snapshot``; checked on
        every load.
    """

    partition_id: int
    is_delta: bool
    path: str
    size_bytes: int
    sha256: str

    def __post_init__(self) -> None:
        _non_negative_int(self.partition_id, "partition_id")
        _non_negative_int(self.size_bytes, "size_bytes")
        if not isinstance(self.is_delta, bool):
            raise CheckpointError(f"is_delta must be a bool, got {self.is_delta!r}")
        parts = parse_artifact_path(self.path)
        if (parts.partition, parts.is_delta) != (self.partition_id, self.is_delta):
            kind = "delta" if self.is_delta else "snapshot"
            raise CheckpointError(
                f"artifact path {self.path!r} is not the {kind} of partition {self.partition_id}"
            )
        if not isinstance(self.sha256, str) or not _SHA256_PATTERN.fullmatch(self.sha256):
            raise CheckpointError(
                f"sha256 of {self.path!r} must be 64 lower-case hex digits, got {self.sha256!r}"
            )

    @property
    def operator(self) -> str:
        """The operator the artifact belongs to (from its path)."""
        return parse_artifact_path(self.path).operator

    def to_dict(self) -> dict[str, Any]:
        """A plain, JSON-ready dictionary."""
        return {
            "partition_id": self.partition_id,
            "is_delta": self.is_delta,
            "path": self.path,
            "size_bytes": self.size_bytes,
            "sha256": self.sha256,
        }


def _frozen_operators(
    operators: Mapping[str, tuple[PartitionSnapshotEntry, ...]],
) -> Mapping[str, tuple[PartitionSnapshotEntry, ...]]:
    frozen: dict[str, tuple[PartitionSnapshotEntry, ...]] = {}
    for operator, entries in operators.items():
        validate_operator(operator)
        by_partition: dict[int, PartitionSnapshotEntry] = {}
        for entry in entries:
            if not isinstance(entry, PartitionSnapshotEntry):
                raise CheckpointError(
                    f"operator {operator!r}: expected PartitionSnapshotEntry, got {entry!r}"
                )
            if entry.operator != operator:
                raise CheckpointError(
                    f"operator {operator!r} lists {entry.path!r}, an artifact of another operator"
                )
            if entry.partition_id in by_partition:
                raise CheckpointError(
                    f"operator {operator!r} lists partition {entry.partition_id} twice"
                )
            by_partition[entry.partition_id] = entry
        frozen[operator] = tuple(by_partition[p] for p in sorted(by_partition))
    return MappingProxyType(dict(sorted(frozen.items())))


def _check_names(mapping: Mapping[str, Any], what: str) -> None:
    for name in mapping:
        if not isinstance(name, str) or not name:
            raise CheckpointError(f"{what} names must be non-empty strings, got {name!r}")


def _frozen_descriptors(
    descriptors: Mapping[str, tuple[str, ...]], statuses: Mapping[str, SinkEpochStatus]
) -> Mapping[str, tuple[str, ...]]:
    _check_names(descriptors, "sink")
    frozen: dict[str, tuple[str, ...]] = {}
    for sink, names in sorted(descriptors.items()):
        if sink not in statuses:
            raise CheckpointError(
                f"sink {sink!r} has commit descriptors but no status in this checkpoint"
            )
        if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
            raise CheckpointError(
                f"the commit descriptors of sink {sink!r} must be a list of strings, got {names!r}"
            )
        frozen[sink] = tuple(names)
    return MappingProxyType(frozen)


@dataclass(frozen=True, slots=True)
class CheckpointManifest:
    """What one checkpoint holds: per-operator state artifacts, source positions and sinks.

    Immutable; the ``with_*`` methods return changed copies. Build the first version with
    :meth:`new`, save it with ``Checkpointer.save_manifest`` while the sinks are ``PENDING``,
    then save ``manifest.with_sink_status(sink, SinkEpochStatus.COMMITTED)`` after each
    sink's ``commit_epoch``: a store accepts a second save of a checkpoint only when it moves
    sinks forward and changes nothing else.

    :param checkpoint_id: the checkpoint's id (time-sortable).
    :param epoch: the epoch (Spark ``batchId``) the checkpoint completes.
    :param timestamp_ms: when the checkpoint was taken, milliseconds since the Unix epoch.
    :param operators: operator name to its partition artifacts.
    :param source_offsets: source name to the position to resume *after* (the source's
        :class:`SourceCheckpoint`), stored as that checkpoint's JSON object.
    :param sink_statuses: sink name to its :class:`SinkEpochStatus` for this epoch.
    :param parent_id: the checkpoint this one's deltas apply to, for incremental checkpoints.
    :param watermark: the global event-time watermark at the checkpoint, if any.
    :param sink_commit_descriptors: for each sink whose write tasks staged the epoch in
        parallel (a ``DistributedCommitSink``), the commit descriptors of the tasks that
        succeeded, in order: what ``commit_aggregated`` publishes, also when recovery finishes
        the commit. Recorded with the sink ``PENDING`` and never changed afterwards.
    :param query_id: the engine's id of the streaming query whose epochs these are (Spark's
        query id), when the engine has one: a checkpoint location serves one query, whose
        epoch numbers it records.
    """

    checkpoint_id: CheckpointId
    epoch: int
    timestamp_ms: int
    operators: Mapping[str, tuple[PartitionSnapshotEntry, ...]] = field(default_factory=dict)
    source_offsets: Mapping[str, SourceCheckpoint] = field(default_factory=dict)
    sink_statuses: Mapping[str, SinkEpochStatus] = field(default_factory=dict)
    parent_id: CheckpointId | None = None
    watermark: int | None = None
    sink_commit_descriptors: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    query_id: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.checkpoint_id, CheckpointId):
            raise CheckpointError(
                f"checkpoint_id must be a CheckpointId, got {self.checkpoint_id!r}"
            )
        if self.parent_id is not None and not isinstance(self.parent_id, CheckpointId):
            raise CheckpointError(f"parent_id must be a CheckpointId, got {self.parent_id!r}")
        _non_negative_int(self.epoch, "epoch")
        _non_negative_int(self.timestamp_ms, "timestamp_ms")
        if self.watermark is not None and (
            isinstance(self.watermark, bool) or not isinstance(self.watermark, int)
        ):
            raise CheckpointError(f"watermark must be an int or None, got {self.watermark!r}")
        _check_names(self.source_offsets, "source")
        _check_names(self.sink_statuses, "sink")
        for name, checkpoint in self.source_offsets.items():
            if not isinstance(checkpoint, SourceCheckpoint):
                raise CheckpointError(
                    f"source {name!r}: expected a SourceCheckpoint, got {checkpoint!r}"
                )
        set_attribute = object.__setattr__
        set_attribute(self, "operators", _frozen_operators(self.operators))
        set_attribute(
            self, "source_offsets", MappingProxyType(dict(sorted(self.source_offsets.items())))
        )
        set_attribute(
            self,
            "sink_statuses",
            MappingProxyType(
                {name: SinkEpochStatus(s) for name, s in sorted(self.sink_statuses.items())}
            ),
        )
        set_attribute(
            self,
            "sink_commit_descriptors",
            _frozen_descriptors(self.sink_commit_descriptors, self.sink_statuses),
        )
        if self.query_id is not None and (not isinstance(self.query_id, str) or not self.query_id):
            raise CheckpointError(
                f"query_id must be a non-empty string or None, got {self.query_id!r}"
            )

    # Equal manifests have equal ids, and the mappings inside are read-only.
    def __hash__(self) -> int:
        return hash((self.checkpoint_id, self.epoch))

    @classmethod
    def new(
        cls,
        epoch: int,
        *,
        checkpoint_id: CheckpointId | None = None,
        parent_id: CheckpointId | None = None,
        watermark: int | None = None,
        query_id: str | None = None,
    ) -> CheckpointManifest:
        """An empty manifest for ``epoch``, with a fresh id and the current time."""
        return cls(
            checkpoint_id=checkpoint_id or CheckpointId.new(),
            epoch=epoch,
            timestamp_ms=time.time_ns() // 1_000_000,
            parent_id=parent_id,
            watermark=watermark,
            query_id=query_id,
        )

    @property
    def version(self) -> int:
        """The manifest format version (:data:`MANIFEST_VERSION`)."""
        return MANIFEST_VERSION

    @property
    def total_size_bytes(self) -> int:
        """The size of every artifact the manifest lists."""
        return sum(entry.size_bytes for _, entry in self.partitions())

    def partitions(self) -> Iterator[tuple[str, PartitionSnapshotEntry]]:
        """Every ``(operator, entry)``, by operator then partition."""
        for operator, entries in self.operators.items():
            for entry in entries:
                yield operator, entry

    def artifact_paths(self) -> frozenset[str]:
        """The paths of every artifact the manifest lists."""
        return frozenset(entry.path for _, entry in self.partitions())

    def with_partition(self, operator: str, entry: PartitionSnapshotEntry) -> CheckpointManifest:
        """Return a copy that lists ``entry`` under ``operator`` (replacing its partition)."""
        kept = [e for e in self.operators.get(operator, ()) if e.partition_id != entry.partition_id]
        return replace(self, operators={**self.operators, operator: (*kept, entry)})

    def with_source_offset(self, source: str, checkpoint: SourceCheckpoint) -> CheckpointManifest:
        """Return a copy in which ``source`` resumes after ``checkpoint``."""
        return replace(self, source_offsets={**self.source_offsets, source: checkpoint})

    def with_sink_status(self, sink: str, status: SinkEpochStatus) -> CheckpointManifest:
        """Return a copy with ``sink`` in ``status``.

        :raises CheckpointError: when the sink would move backwards (committed to pending).
        """
        current = self.sink_statuses.get(sink)
        status = SinkEpochStatus(status)
        if current is not None and not current.can_become(status):
            raise CheckpointError(
                f"sink {sink!r} of checkpoint {self.checkpoint_id} is {current}; "
                f"it cannot become {status}"
            )
        return replace(self, sink_statuses={**self.sink_statuses, sink: status})

    def with_sink_commit_descriptors(
        self, sink: str, descriptors: Sequence[str]
    ) -> CheckpointManifest:
        """Return a copy recording ``descriptors`` as what ``sink`` commits for the epoch.

        :raises CheckpointError: when ``sink`` has no status in the manifest yet (set it
            first, ``PENDING``).
        """
        return replace(
            self,
            sink_commit_descriptors={**self.sink_commit_descriptors, sink: tuple(descriptors)},
        )

    def is_update_of(self, previous: CheckpointManifest) -> bool:
        """Whether this manifest only moves ``previous``'s sinks forward (a legal re-save)."""
        if replace(self, sink_statuses=previous.sink_statuses) != previous:
            return False
        if self.sink_statuses.keys() != previous.sink_statuses.keys():
            return False
        return all(
            previous.sink_statuses[sink].can_become(status)
            for sink, status in self.sink_statuses.items()
        )

    # JSON ---------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A plain, JSON-ready dictionary (without the checksum :meth:`to_json` adds).

        ``sink_commit_descriptors`` and ``query_id`` appear only when set, so a manifest
        without them has the same text as before they existed.
        """
        document: dict[str, Any] = {
            "version": MANIFEST_VERSION,
            "checkpoint_id": str(self.checkpoint_id),
            "epoch": self.epoch,
            "timestamp_ms": self.timestamp_ms,
            "operators": {
                operator: {
                    "partitions": [entry.to_dict() for entry in entries],
                    "total_bytes": sum(entry.size_bytes for entry in entries),
                }
                for operator, entries in self.operators.items()
            },
            "source_offsets": {
                name: checkpoint.to_dict() for name, checkpoint in self.source_offsets.items()
            },
            "sink_statuses": {name: str(status) for name, status in self.sink_statuses.items()},
            "parent_id": None if self.parent_id is None else str(self.parent_id),
            "watermark": self.watermark,
            "total_size_bytes": self.total_size_bytes,
        }
        if self.sink_commit_descriptors:
            document["sink_commit_descriptors"] = {
                name: list(descriptors)
                for name, descriptors in self.sink_commit_descriptors.items()
            }
        if self.query_id is not None:
            document["query_id"] = self.query_id
        return document

    def to_json(self) -> bytes:
        """The stored form: indented JSON with sorted keys and a ``manifest_sha256``."""
        document = self.to_dict()
        document["manifest_sha256"] = sha256_hex(_canonical(document))
        return json.dumps(document, sort_keys=True, indent=2).encode() + b"\n"

    @classmethod
    def from_json(
        cls, data: bytes | str, *, path: str = MANIFEST_PATH_UNKNOWN
    ) -> CheckpointManifest:
        """Parse :meth:`to_json` output, checking its version and checksum.

        :param path: where the text came from, for messages.
        :raises UnsupportedManifestVersion: for a version this SDK does not read.
        :raises CheckpointCorrupted: when the text is truncated, corrupted or malformed,
            naming ``path`` and the reason.
        """
        try:
            document = json.loads(data)
        except (ValueError, UnicodeDecodeError) as error:
            raise _corrupted(
                path, f"is not valid JSON ({error}): truncated or corrupted"
            ) from error
        if not isinstance(document, dict):
            raise _corrupted(path, "is not a JSON object")
        version = document.get("version")
        if version != MANIFEST_VERSION or isinstance(version, bool):
            raise UnsupportedManifestVersion(
                f"manifest {path} has format version {version!r}, but this SDK reads only "
                f"version {MANIFEST_VERSION}: it was written by another SDK release, or it is "
                "corrupted; open it with the SDK release that wrote it",
                path=path,
                version=version,
            )
        stored_sum = document.pop("manifest_sha256", None)
        if stored_sum != sha256_hex(_canonical(document)):
            raise _corrupted(path, "fails its manifest_sha256 check")
        try:
            manifest = cls._from_dict(document)
        except (CheckpointError, KeyError, TypeError, ValueError, AttributeError) as error:
            raise _corrupted(path, f"is malformed: {error}") from error
        if document.get("total_size_bytes") != manifest.total_size_bytes:
            raise _corrupted(path, "has a total_size_bytes that does not add up")
        return manifest

    @classmethod
    def _from_dict(cls, document: Mapping[str, Any]) -> CheckpointManifest:
        unknown = set(document) - _FIELDS
        if unknown:
            raise CheckpointError(f"unknown field(s) {sorted(unknown)}")
        parent = document.get("parent_id")
        operators = {
            operator: tuple(PartitionSnapshotEntry(**entry) for entry in body["partitions"])
            for operator, body in document.get("operators", {}).items()
        }
        return cls(
            checkpoint_id=CheckpointId.parse(document["checkpoint_id"]),
            epoch=document["epoch"],
            timestamp_ms=document["timestamp_ms"],
            operators=operators,
            source_offsets={
                name: SourceCheckpoint.from_dict(body)
                for name, body in document.get("source_offsets", {}).items()
            },
            sink_statuses={
                name: SinkEpochStatus(status)
                for name, status in document.get("sink_statuses", {}).items()
            },
            parent_id=None if parent is None else CheckpointId.parse(parent),
            watermark=document.get("watermark"),
            # A list each (the type is checked when the manifest is built).
            sink_commit_descriptors=document.get("sink_commit_descriptors", {}),
            query_id=document.get("query_id"),
        )


def _corrupted(path: str, reason: str) -> CheckpointCorrupted:
    return CheckpointCorrupted(
        f"manifest {path} {reason}; recovery passes over this checkpoint to an older one. "
        "`laminar checkpoints verify LOCATION` lists every bad file, and "
        "`laminar checkpoints quarantine LOCATION ID` sets a checkpoint aside",
        path=path,
    )
