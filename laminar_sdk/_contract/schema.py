"""Optional schema capabilities a connector may offer, after LaminarDB's schema traits.

A connector offers one by implementing the interface and returning ``self`` from the matching
``as_schema_*`` method of :class:`~laminar_sdk.SourceConnector` or
:class:`~laminar_sdk.SinkConnector`.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from laminar_sdk._contract.config import ConnectorConfig

DESTINATION_METADATA_KEY = b"laminar.destination"
"""The Arrow schema metadata key under which a sink's schema names its destination."""


def with_destination(schema: pa.Schema, destination: str) -> pa.Schema:
    """``schema``, naming where the sink writes (``table public.orders``) in its metadata.

    Return a sink's :meth:`~laminar_sdk.SinkConnector.schema` this way when its columns come
    from the destination (a table's): when a stream does not fit them, the runtime's error
    names the destination besides the sink.
    """
    metadata = {**(schema.metadata or {}), DESTINATION_METADATA_KEY: destination.encode()}
    return schema.with_metadata(metadata)


def sink_described(connector: str, schema: pa.Schema) -> str:
    """``sink 'NAME'``, with the destination its schema names (:func:`with_destination`)."""
    destination = (schema.metadata or {}).get(DESTINATION_METADATA_KEY)
    named = f" ({destination.decode(errors='replace')})" if destination else ""
    return f"sink {connector!r}{named}"


@dataclass(frozen=True, slots=True)
class InferenceConfig:
    """How to infer a schema from samples.

    :param format: the encoding of the samples (``json``, ``csv``, ...).
    :param max_samples: the most records to read for inference.
    :param type_hints: field name to the Arrow type to use instead of inferring one.
    """

    format: str = "json"
    max_samples: int = 1000
    type_hints: dict[str, pa.DataType] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class InferredSchema:
    """The result of inference: the schema, how many samples it rests on, and warnings."""

    schema: pa.Schema
    sample_count: int
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RegisteredSchema:
    """A schema as a schema registry holds it."""

    schema_id: int
    subject: str
    version: int
    schema: pa.Schema


class SchemaChangeKind(enum.Enum):
    """The kinds of change :meth:`SchemaEvolvable.diff_schemas` reports."""

    COLUMN_ADDED = "column-added"
    COLUMN_REMOVED = "column-removed"
    TYPE_CHANGED = "type-changed"
    NULLABILITY_CHANGED = "nullability-changed"


@dataclass(frozen=True, slots=True)
class SchemaChange:
    """One difference between two schemas: the column and its old and new field."""

    kind: SchemaChangeKind
    column: str
    old: pa.Field | None = None
    new: pa.Field | None = None


class EvolutionVerdict(enum.Enum):
    """Whether a set of schema changes can be applied."""

    COMPATIBLE = "compatible"
    REQUIRES_MIGRATION = "requires-migration"
    INCOMPATIBLE = "incompatible"


class SchemaProvider(ABC):
    """A connector that knows its schema from the external system before reading a record.

    For example from a table's DDL or a file's footer.
    """

    @abstractmethod
    async def provide_schema(self, config: ConnectorConfig) -> pa.Schema:
        """Return the schema the external system declares for ``config``."""

    def is_authoritative(self) -> bool:
        """Whether the provided schema is final (``True``) or a hint a user may override."""
        return True


class SchemaInferable(ABC):
    """A connector whose schema is inferred by sampling records."""

    @abstractmethod
    async def sample_records(
        self, config: ConnectorConfig, inference: InferenceConfig
    ) -> Sequence[bytes]:
        """Read up to ``inference.max_samples`` raw records; open and close what it needs."""

    @abstractmethod
    async def infer_from_samples(
        self, samples: Sequence[bytes], inference: InferenceConfig
    ) -> InferredSchema:
        """Infer a schema from raw records returned by :meth:`sample_records`."""


class SchemaRegistryAware(ABC):
    """A connector that reads and writes schemas in a schema registry."""

    @abstractmethod
    async def fetch_schema(self, subject: str) -> RegisteredSchema:
        """The latest schema registered under ``subject``."""

    @abstractmethod
    async def fetch_schema_by_id(self, schema_id: int) -> RegisteredSchema:
        """The schema with the registry id ``schema_id``."""

    @abstractmethod
    async def check_compatibility(self, subject: str, schema: pa.Schema) -> bool:
        """Whether ``schema`` may be registered under ``subject`` by the subject's rules."""

    @abstractmethod
    async def register_schema(self, subject: str, schema: pa.Schema) -> int:
        """Register ``schema`` under ``subject``; return its registry id."""


class SchemaEvolvable(ABC):
    """A connector that can follow its schema as it changes."""

    @abstractmethod
    def diff_schemas(self, old: pa.Schema, new: pa.Schema) -> list[SchemaChange]:
        """The changes that turn ``old`` into ``new``, by column name."""

    @abstractmethod
    def evaluate_evolution(self, changes: Sequence[SchemaChange]) -> EvolutionVerdict:
        """Whether the connector can apply ``changes``."""

    @abstractmethod
    async def apply_evolution(self, old: pa.Schema, changes: Sequence[SchemaChange]) -> pa.Schema:
        """Apply ``changes`` to the external system; return the schema now in force."""

    @abstractmethod
    def schema_version(self) -> int:
        """A number that grows by one with every applied evolution (starting at 1)."""
