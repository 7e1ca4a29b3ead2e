"""Checkpoint ids, operator names, and where each file of a checkpoint lives in a store.

The layout, relative to the store's location (LaminarDB's V2 object-store layout)::

    _latest                                   the id of the latest complete checkpoint
    {checkpoint_id}/manifest.json             the CheckpointManifest, JSON
    {checkpoint_id}/operators/{operator}/partition-{n}.snap    a full state snapshot
    {checkpoint_id}/operators/{operator}/partition-{n}.delta   an incremental delta

Every name that becomes part of a path is checked here, so no id, operator or artifact path
can point outside the store (``..``, ``/``, absolute paths, NUL, empty names are refused).
"""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
from dataclasses import dataclass
from typing import NamedTuple

from laminar_sdk._contract.errors import CheckpointError

LATEST_PATH = "_latest"
"""Where the latest pointer lives, relative to the store's location."""

MANIFEST_NAME = "manifest.json"

_MAX_PARTITION = 2**32 - 1
_OPERATOR_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}")
_UUID_PATTERN = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
_ARTIFACT_PATTERN = re.compile(
    r"(?P<id>[^/]+)/operators/(?P<operator>[^/]+)/partition-(?P<partition>0|[1-9][0-9]{0,9})"
    r"\.(?P<kind>snap|delta)"
)

# UUIDv7 ids made in this process increase strictly, even within one millisecond (RFC 9562,
# method 3: the sub-millisecond bits count up). Ids from different processes are ordered by
# their millisecond only.
_id_lock = threading.Lock()
_last_id_ms = 0
_last_id_counter = 0


@dataclass(frozen=True, slots=True, order=True)
class CheckpointId:
    """A checkpoint's identifier: a UUIDv7, so ids sort by creation time.

    ``str(id)`` is the canonical lower-case hyphenated form used in paths; comparing ids
    (``<``) compares their creation times. Make one with :meth:`new`, read one back with
    :meth:`parse`.
    """

    value: uuid.UUID

    def __post_init__(self) -> None:
        if not isinstance(self.value, uuid.UUID) or self.value.version != 7:
            raise CheckpointError(
                f"a checkpoint id must be a UUIDv7, got {self.value!r}; "
                "make ids with CheckpointId.new()"
            )

    @classmethod
    def new(cls) -> CheckpointId:
        """A fresh id, later than every id this process made before."""
        global _last_id_ms, _last_id_counter  # noqa: PLW0603 - the per-process sequence
        with _id_lock:
            now_ms = time.time_ns() // 1_000_000
            if now_ms > _last_id_ms:
                _last_id_ms, _last_id_counter = now_ms, 0
            else:  # same millisecond, or the clock stepped back: keep counting up
                _last_id_counter += 1
                if _last_id_counter > 0xFFF:
                    _last_id_ms, _last_id_counter = _last_id_ms + 1, 0
            ms, counter = _last_id_ms, _last_id_counter
        random_bits = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
        value = (ms << 80) | (0x7 << 76) | (counter << 64) | (0b10 << 62) | random_bits
        return cls(uuid.UUID(int=value))

    @classmethod
    def parse(cls, text: str) -> CheckpointId:
        """Read an id back from its canonical text (as in paths and the latest pointer).

        :raises CheckpointError: when ``text`` is not a canonical UUIDv7, naming it.
        """
        if not isinstance(text, str) or not _UUID_PATTERN.fullmatch(text):
            raise CheckpointError(
                f"{text!r} is not a checkpoint id (a lower-case hyphenated UUIDv7); "
                "list the valid ids with `laminar checkpoints list LOCATION`"
            )
        return cls(uuid.UUID(text))

    @property
    def timestamp_ms(self) -> int:
        """When the id was made, in milliseconds since the Unix epoch."""
        return self.value.int >> 80

    def __str__(self) -> str:
        return str(self.value)

    def __repr__(self) -> str:
        return f"CheckpointId('{self.value}')"


def validate_operator(operator: str) -> str:
    """Return ``operator`` when it is a safe path component, else raise.

    :raises CheckpointError: naming the operator, unless it is 1-200 letters, digits, ``.``,
        ``_`` or ``-``, not starting with ``.`` or ``-``.
    """
    if not isinstance(operator, str) or not _OPERATOR_PATTERN.fullmatch(operator):
        raise CheckpointError(
            f"operator name {operator!r} cannot be stored: use 1-200 letters, digits, '.', "
            "'_' or '-', starting with a letter, digit or '_'"
        )
    return operator


def validate_partition(partition: int) -> int:
    """Return ``partition`` when it is an int in ``0 .. 2**32-1``, else raise CheckpointError."""
    if isinstance(partition, bool) or not isinstance(partition, int):
        raise CheckpointError(f"partition must be an int, got {partition!r}")
    if not 0 <= partition <= _MAX_PARTITION:
        raise CheckpointError(f"partition must be in 0..{_MAX_PARTITION}, got {partition}")
    return partition


class ArtifactPath(NamedTuple):
    """The parts of an artifact's path."""

    checkpoint_id: CheckpointId
    operator: str
    partition: int
    is_delta: bool


def artifact_path(
    checkpoint_id: CheckpointId, operator: str, partition: int, *, delta: bool
) -> str:
    """The path of a snapshot (``delta=False``) or delta of one operator partition."""
    validate_operator(operator)
    validate_partition(partition)
    suffix = "delta" if delta else "snap"
    return f"{checkpoint_id}/operators/{operator}/partition-{partition}.{suffix}"


def parse_artifact_path(path: str) -> ArtifactPath:
    """Split an artifact path made by :func:`artifact_path` into its parts.

    :raises CheckpointError: when ``path`` is anything else (which is how paths that would
        escape the store are refused).
    """
    match = _ARTIFACT_PATTERN.fullmatch(path) if isinstance(path, str) else None
    if match is None:
        raise CheckpointError(
            f"{path!r} is not a checkpoint artifact path "
            "({checkpoint_id}/operators/{operator}/partition-{n}.snap|.delta)"
        )
    return ArtifactPath(
        CheckpointId.parse(match["id"]),
        validate_operator(match["operator"]),
        validate_partition(int(match["partition"])),
        match["kind"] == "delta",
    )


def manifest_path(checkpoint_id: CheckpointId) -> str:
    """The path of a checkpoint's manifest."""
    return f"{checkpoint_id}/{MANIFEST_NAME}"


def checkpoint_of(path: str) -> CheckpointId | None:
    """The checkpoint a stored path belongs to, or ``None`` for paths outside every checkpoint."""
    head, sep, _ = path.partition("/")
    if not sep or not _UUID_PATTERN.fullmatch(head):
        return None
    return CheckpointId.parse(head)


def validate_stored_path(path: str) -> str:
    """Return ``path`` when it names a file inside one checkpoint's directory, else raise.

    Unlike :func:`parse_artifact_path` this accepts any file name (a store's leftovers from
    an interrupted write, for instance), but still nothing outside the checkpoint.
    """
    parts = path.split("/") if isinstance(path, str) else []
    if (
        len(parts) < 2
        or checkpoint_of(path) is None
        or any(part in {"", ".", ".."} or "\\" in part or "\0" in part for part in parts)
    ):
        raise CheckpointError(f"{path!r} is not a path inside a checkpoint")
    return path
