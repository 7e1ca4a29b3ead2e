"""Source positions that survive a restart: :class:`SourceCheckpoint`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from laminar_sdk._contract.errors import CheckpointError


def _str_map_copy(value: Mapping[str, str], what: str) -> dict[str, str]:
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise CheckpointError(
                f"SourceCheckpoint {what} must map str to str; got {key!r}: {item!r}"
            )
    return dict(value)


@dataclass(frozen=True, slots=True)
class SourceCheckpoint:
    """Where a source stands: enough to resume *after* the last record it returned.

    ``offsets`` maps a partition id to the connector's own encoding of the position in it (a
    Kafka offset, a file name and byte position, ...). ``epoch`` is the epoch the checkpoint
    belongs to. ``metadata`` carries anything else the connector needs to resume.

    The checkpoint travels in Spark's offset log as JSON, so :meth:`to_json` is canonical (keys
    sorted, no whitespace): equal checkpoints give equal text, and
    ``SourceCheckpoint.from_json(cp.to_json()) == cp`` for every checkpoint.
    """

    offsets: Mapping[str, str] = field(default_factory=dict)
    epoch: int = 0
    metadata: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.epoch, bool) or not isinstance(self.epoch, int) or self.epoch < 0:
            raise CheckpointError(
                f"SourceCheckpoint epoch must be a non-negative int, got {self.epoch!r}"
            )
        object.__setattr__(self, "offsets", _str_map_copy(self.offsets, "offsets"))
        object.__setattr__(self, "metadata", _str_map_copy(self.metadata, "metadata"))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SourceCheckpoint):
            return NotImplemented
        return (
            self.epoch == other.epoch
            and dict(self.offsets) == dict(other.offsets)
            and dict(self.metadata) == dict(other.metadata)
        )

    def __hash__(self) -> int:
        return hash(self.to_json())

    def __repr__(self) -> str:
        return (
            f"SourceCheckpoint(offsets={dict(self.offsets)!r}, epoch={self.epoch!r}, "
            f"metadata={dict(self.metadata)!r})"
        )

    @property
    def is_empty(self) -> bool:
        """``True`` when no partition has a recorded position (a source that never read)."""
        return not self.offsets

    def get_offset(self, partition: str) -> str | None:
        """The recorded position of ``partition``, or ``None`` when it has none."""
        return self.offsets.get(partition)

    def with_offset(self, partition: str, offset: str) -> SourceCheckpoint:
        """Return a copy with ``partition`` at ``offset``."""
        return SourceCheckpoint({**self.offsets, partition: offset}, self.epoch, self.metadata)

    def with_epoch(self, epoch: int) -> SourceCheckpoint:
        """Return a copy that belongs to ``epoch``."""
        return SourceCheckpoint(self.offsets, epoch, self.metadata)

    def to_dict(self) -> dict[str, Any]:
        """A plain, JSON-ready dictionary."""
        return {
            "offsets": dict(self.offsets),
            "epoch": self.epoch,
            "metadata": dict(self.metadata),
        }

    def to_json(self) -> str:
        """Canonical JSON text (sorted keys, no whitespace)."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SourceCheckpoint:
        """Rebuild a checkpoint from :meth:`to_dict` output.

        :raises CheckpointError: naming the field that is missing or of the wrong type.
        """
        unknown = set(data) - {"offsets", "epoch", "metadata"}
        if unknown:
            raise CheckpointError(
                f"SourceCheckpoint has unknown field(s) {sorted(unknown)}: "
                "was it written by a newer SDK?"
            )
        offsets = data.get("offsets", {})
        metadata = data.get("metadata", {})
        if not isinstance(offsets, Mapping) or not isinstance(metadata, Mapping):
            raise CheckpointError("SourceCheckpoint offsets and metadata must be JSON objects")
        return cls(offsets, data.get("epoch", 0), metadata)

    @classmethod
    def from_json(cls, text: str | bytes) -> SourceCheckpoint:
        """Parse :meth:`to_json` output.

        :raises CheckpointError: when the text is not a valid checkpoint (truncated, corrupted,
            wrong types), with the reason.
        """
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError) as error:
            raise CheckpointError(f"SourceCheckpoint is not valid JSON: {error}") from error
        if not isinstance(data, dict):
            raise CheckpointError(
                f"SourceCheckpoint JSON must be an object, got {type(data).__name__}"
            )
        return cls.from_dict(data)
