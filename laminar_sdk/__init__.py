"""Laminar SDK: write source and sink connector plugins for exactly-once Spark pipelines.

The public API is what this module exports; everything in ``_``-prefixed modules is internal.
"""

from __future__ import annotations

from laminar_sdk._checkpoint import SourceCheckpoint
from laminar_sdk._config import REDACTED, ConfigKeySpec, ConnectorConfig, parse_bool
from laminar_sdk._connector import SinkConnector, SourceConnector
from laminar_sdk._delivery import DeliveryGuaranteeWarning, validate_delivery_guarantee
from laminar_sdk._errors import (
    CheckpointError,
    Closed,
    ConfigurationError,
    ConnectionFailed,
    ConnectorError,
    ConnectorIOError,
    Internal,
    InvalidState,
    LaminarError,
    PluginError,
    ReadError,
    SchemaMismatch,
    SerdeError,
    Timeout,
    TransactionError,
    WriteError,
)
from laminar_sdk._hookspecs import hookimpl, hookspec
from laminar_sdk._plugins import (
    ALLOWLIST_VARIABLE,
    DENYLIST_VARIABLE,
    PLUGIN_ENTRY_POINT_GROUP,
    load_connector_registry,
    load_plugins,
)
from laminar_sdk._registry import ConnectorRegistry, ConnectorRole, ConnectorSpec
from laminar_sdk._schema import (
    EvolutionVerdict,
    InferenceConfig,
    InferredSchema,
    RegisteredSchema,
    SchemaChange,
    SchemaChangeKind,
    SchemaEvolvable,
    SchemaInferable,
    SchemaProvider,
    SchemaRegistryAware,
)
from laminar_sdk._types import (
    ConnectorMetrics,
    DeliveryGuarantee,
    HealthState,
    HealthStatus,
    PartitionInfo,
    SinkConnectorCapabilities,
    SourceBatch,
    WriteResult,
)

__all__ = [
    "ALLOWLIST_VARIABLE",
    "DENYLIST_VARIABLE",
    "PLUGIN_ENTRY_POINT_GROUP",
    "REDACTED",
    "CheckpointError",
    "Closed",
    "ConfigKeySpec",
    "ConfigurationError",
    "ConnectionFailed",
    "ConnectorConfig",
    "ConnectorError",
    "ConnectorIOError",
    "ConnectorMetrics",
    "ConnectorRegistry",
    "ConnectorRole",
    "ConnectorSpec",
    "DeliveryGuarantee",
    "DeliveryGuaranteeWarning",
    "EvolutionVerdict",
    "HealthState",
    "HealthStatus",
    "InferenceConfig",
    "InferredSchema",
    "Internal",
    "InvalidState",
    "LaminarError",
    "PartitionInfo",
    "PluginError",
    "ReadError",
    "RegisteredSchema",
    "SchemaChange",
    "SchemaChangeKind",
    "SchemaEvolvable",
    "SchemaInferable",
    "SchemaMismatch",
    "SchemaProvider",
    "SchemaRegistryAware",
    "SerdeError",
    "SinkConnector",
    "SinkConnectorCapabilities",
    "SourceBatch",
    "SourceCheckpoint",
    "SourceConnector",
    "Timeout",
    "TransactionError",
    "WriteError",
    "WriteResult",
    "hookimpl",
    "hookspec",
    "load_connector_registry",
    "load_plugins",
    "parse_bool",
    "validate_delivery_guarantee",
]
