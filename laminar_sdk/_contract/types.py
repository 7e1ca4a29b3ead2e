"""Value types exchanged between connectors and the runtime."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import pyarrow as pa

from laminar_sdk._contract.errors import ConfigurationError


class DeliveryGuarantee(enum.Enum):
    """End-to-end delivery semantics a pipeline promises.

    ``AT_LEAST_ONCE`` (the default) may deliver a record again after a crash;
    ``EXACTLY_ONCE`` delivers every record once, and requires every source to support replay,
    every sink to declare ``exactly_once`` and checkpointing to be enabled.
    """

    AT_LEAST_ONCE = "at-least-once"
    EXACTLY_ONCE = "exactly-once"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def default(cls) -> DeliveryGuarantee:
        """The guarantee used when none is configured: ``AT_LEAST_ONCE``."""
        return cls.AT_LEAST_ONCE

    @classmethod
    def parse(cls, text: str) -> DeliveryGuarantee:
        """Parse ``at-least-once`` / ``exactly-once`` (also ``_`` or no separator, any case).

        :raises ConfigurationError: for any other text, listing the accepted values.
        """
        normalized = text.strip().lower().replace("_", "-")
        aliases = {"atleastonce": "at-least-once", "exactlyonce": "exactly-once"}
        normalized = aliases.get(normalized, normalized)
        for member in cls:
            if member.value == normalized:
                return member
        accepted = ", ".join(member.value for member in cls)
        raise ConfigurationError(
            f"unknown delivery guarantee {text!r}: use one of {accepted}", key="delivery"
        )


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """A source partition and the position reached in it.

    Both parts are free-form strings whose meaning belongs to the connector (a Kafka
    partition number and offset, a file path and byte position, ...). Printed as ``id@offset``.
    """

    id: str
    offset: str

    def __str__(self) -> str:
        return f"{self.id}@{self.offset}"


@dataclass(frozen=True, slots=True)
class SourceBatch:
    """Records a source returned from one :meth:`SourceConnector.poll_batch` call."""

    records: pa.RecordBatch
    partition: PartitionInfo | None = None

    @property
    def num_rows(self) -> int:
        """How many records the batch holds."""
        return int(self.records.num_rows)


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What one :meth:`SinkConnector.write_batch` call accepted."""

    records_written: int
    bytes_written: int = 0


@dataclass(frozen=True, slots=True)
class SinkConnectorCapabilities:
    """What a sink promises. Every flag defaults to ``False`` (the conservative claim).

    The conformance kit holds a sink to every flag it sets: claiming a capability the sink
    does not keep is a failure, not a skip. Build values with the ``with_*`` methods, each of
    which returns a new value::

        SinkConnectorCapabilities().with_exactly_once().with_two_phase_commit()
    """

    exactly_once: bool = False
    """Epochs are committed atomically; a committed epoch re-delivered after a crash is
    recognised and skipped; a rolled-back epoch leaves no trace."""
    idempotent: bool = False
    """Writing the same records twice leaves the destination as writing them once."""
    upsert: bool = False
    """Records are written as insert-or-update by key."""
    changelog: bool = False
    """The sink understands changelog (insert / retract) records."""
    two_phase_commit: bool = False
    """``pre_commit`` prepares without making anything visible; ``commit_epoch`` publishes."""
    schema_evolution: bool = False
    """The sink accepts additive schema changes between epochs."""
    partitioned: bool = False
    """The sink accepts writes from several partitions of one epoch in parallel."""

    def with_exactly_once(self) -> SinkConnectorCapabilities:
        """Return a copy that declares exactly-once delivery."""
        return replace(self, exactly_once=True)

    def with_idempotent(self) -> SinkConnectorCapabilities:
        """Return a copy that declares idempotent writes."""
        return replace(self, idempotent=True)

    def with_upsert(self) -> SinkConnectorCapabilities:
        """Return a copy that declares upsert writes."""
        return replace(self, upsert=True)

    def with_changelog(self) -> SinkConnectorCapabilities:
        """Return a copy that declares changelog support."""
        return replace(self, changelog=True)

    def with_two_phase_commit(self) -> SinkConnectorCapabilities:
        """Return a copy that declares two-phase commit."""
        return replace(self, two_phase_commit=True)

    def with_schema_evolution(self) -> SinkConnectorCapabilities:
        """Return a copy that declares schema evolution."""
        return replace(self, schema_evolution=True)

    def with_partitioned(self) -> SinkConnectorCapabilities:
        """Return a copy that declares partitioned writes."""
        return replace(self, partitioned=True)

    def names(self) -> tuple[str, ...]:
        """The names of the capabilities that are set, in declaration order."""
        return tuple(name for name in self.__dataclass_fields__ if getattr(self, name))


class HealthState(enum.Enum):
    """The four states a connector's health can be in."""

    HEALTHY = "healthy"
    DEGRADED = "degraded"
    UNHEALTHY = "unhealthy"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class HealthStatus:
    """A connector's health, with the reason when it is not healthy.

    Build with :meth:`healthy`, :meth:`degraded`, :meth:`unhealthy` or :meth:`unknown`.
    """

    state: HealthState
    reason: str | None = None

    @classmethod
    def healthy(cls) -> HealthStatus:
        """The connector works normally."""
        return cls(HealthState.HEALTHY)

    @classmethod
    def degraded(cls, reason: str) -> HealthStatus:
        """The connector works, but not fully (e.g. high lag, one replica down)."""
        return cls(HealthState.DEGRADED, reason)

    @classmethod
    def unhealthy(cls, reason: str) -> HealthStatus:
        """The connector does not work."""
        return cls(HealthState.UNHEALTHY, reason)

    @classmethod
    def unknown(cls) -> HealthStatus:
        """The connector has not said (the default)."""
        return cls(HealthState.UNKNOWN)

    @property
    def is_healthy(self) -> bool:
        """``True`` only in the healthy state."""
        return self.state is HealthState.HEALTHY

    def __str__(self) -> str:
        return self.state.value if self.reason is None else f"{self.state.value}: {self.reason}"


@dataclass(frozen=True, slots=True)
class ConnectorMetrics:
    """Counters a connector reports; all default to zero.

    ``lag`` is how far a source is behind the newest data it knows of, in records (``0`` for a
    sink or when unknown). ``custom`` holds connector-specific figures by name.
    """

    records_total: int = 0
    bytes_total: int = 0
    errors_total: int = 0
    lag: int = 0
    custom: Mapping[str, float] = field(default_factory=dict)
