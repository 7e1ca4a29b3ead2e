"""Laminar SDK: write source and sink connector plugins for exactly-once Spark pipelines.

The public API is what this module exports; everything in ``_``-prefixed modules is internal.
"""

from __future__ import annotations

from laminar_sdk._checkpointing.checkpointer import Checkpointer
from laminar_sdk._checkpointing.errors import (
    CheckpointConflict,
    CheckpointCorrupted,
    CheckpointNotFound,
    CheckpointStoreError,
    UnsupportedManifestVersion,
)
from laminar_sdk._checkpointing.file_store import FileCheckpointer
from laminar_sdk._checkpointing.ids import CheckpointId
from laminar_sdk._checkpointing.manifest import (
    MANIFEST_VERSION,
    CheckpointManifest,
    PartitionSnapshotEntry,
    SinkEpochStatus,
)
from laminar_sdk._checkpointing.memory_store import MemoryCheckpointer
from laminar_sdk._checkpointing.recovery import (
    RecoveredCheckpoint,
    load_checkpoint,
    load_latest_valid,
    verify_checkpoint,
)
from laminar_sdk._checkpointing.registry import (
    CHECKPOINTER_ENTRY_POINT_GROUP,
    CheckpointerFactory,
    installed_checkpointers,
    open_checkpointer,
    store_for_location,
)
from laminar_sdk._checkpointing.retention import PruneResult, prune_checkpoints
from laminar_sdk._contract.checkpoint import SourceCheckpoint
from laminar_sdk._contract.config import (
    REDACTED,
    ConfigKeySpec,
    ConnectorConfig,
    PathKind,
    parse_bool,
    redact_secrets,
)
from laminar_sdk._contract.connector import SinkConnector, SourceConnector
from laminar_sdk._contract.crash_points import crash_point
from laminar_sdk._contract.durable import (
    create_file_atomically,
    fsync_path,
    make_dirs,
    write_file_atomically,
)
from laminar_sdk._contract.epochs import EpochPhase, EpochTracker, OpenEpoch
from laminar_sdk._contract.errors import (
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
from laminar_sdk._contract.forwarding import ForwardingSink
from laminar_sdk._contract.parallel import (
    DistributedCommitSink,
    PartitionRange,
    RangeReadableSource,
    share_records,
)
from laminar_sdk._contract.schema import (
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
    with_destination,
)
from laminar_sdk._contract.state import StateStore
from laminar_sdk._contract.types import (
    ConnectorMetrics,
    DeliveryGuarantee,
    HealthState,
    HealthStatus,
    PartitionInfo,
    SinkConnectorCapabilities,
    SourceBatch,
    WriteResult,
)
from laminar_sdk._plugins.hookspecs import hookimpl, hookspec
from laminar_sdk._plugins.loading import (
    ALLOWLIST_VARIABLE,
    DENYLIST_VARIABLE,
    PLUGIN_ENTRY_POINT_GROUP,
    FoundEntryPoint,
    load_connector_registry,
    load_plugins,
)
from laminar_sdk._plugins.registry import ConnectorRegistry, ConnectorRole, ConnectorSpec
from laminar_sdk._runtime.coordinator import (
    EpochCoordinator,
    EpochResult,
    ProtocolStep,
    RetryPolicy,
    StepObserver,
    stage_task,
)
from laminar_sdk._runtime.delivery import DeliveryGuaranteeWarning, validate_delivery_guarantee
from laminar_sdk._runtime.pipeline import ConnectorRef, Pipeline, PipelineReport, PipelineSpec
from laminar_sdk._spark.temporary_files import spark_temporary_files_in

__all__ = [
    "ALLOWLIST_VARIABLE",
    "CHECKPOINTER_ENTRY_POINT_GROUP",
    "DENYLIST_VARIABLE",
    "MANIFEST_VERSION",
    "PLUGIN_ENTRY_POINT_GROUP",
    "REDACTED",
    "CheckpointConflict",
    "CheckpointCorrupted",
    "CheckpointError",
    "CheckpointId",
    "CheckpointManifest",
    "CheckpointNotFound",
    "CheckpointStoreError",
    "Checkpointer",
    "CheckpointerFactory",
    "Closed",
    "ConfigKeySpec",
    "ConfigurationError",
    "ConnectionFailed",
    "ConnectorConfig",
    "ConnectorError",
    "ConnectorIOError",
    "ConnectorMetrics",
    "ConnectorRef",
    "ConnectorRegistry",
    "ConnectorRole",
    "ConnectorSpec",
    "DeliveryGuarantee",
    "DeliveryGuaranteeWarning",
    "DistributedCommitSink",
    "EpochCoordinator",
    "EpochPhase",
    "EpochResult",
    "EpochTracker",
    "EvolutionVerdict",
    "FileCheckpointer",
    "ForwardingSink",
    "FoundEntryPoint",
    "HealthState",
    "HealthStatus",
    "InferenceConfig",
    "InferredSchema",
    "Internal",
    "InvalidState",
    "LaminarError",
    "MemoryCheckpointer",
    "OpenEpoch",
    "PartitionInfo",
    "PartitionRange",
    "PartitionSnapshotEntry",
    "PathKind",
    "Pipeline",
    "PipelineReport",
    "PipelineSpec",
    "PluginError",
    "ProtocolStep",
    "PruneResult",
    "RangeReadableSource",
    "ReadError",
    "RecoveredCheckpoint",
    "RegisteredSchema",
    "RetryPolicy",
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
    "SinkEpochStatus",
    "SourceBatch",
    "SourceCheckpoint",
    "SourceConnector",
    "StateStore",
    "StepObserver",
    "Timeout",
    "TransactionError",
    "UnsupportedManifestVersion",
    "WriteError",
    "WriteResult",
    "crash_point",
    "create_file_atomically",
    "fsync_path",
    "hookimpl",
    "hookspec",
    "installed_checkpointers",
    "load_checkpoint",
    "load_connector_registry",
    "load_latest_valid",
    "load_plugins",
    "make_dirs",
    "open_checkpointer",
    "parse_bool",
    "prune_checkpoints",
    "redact_secrets",
    "share_records",
    "spark_temporary_files_in",
    "stage_task",
    "store_for_location",
    "validate_delivery_guarantee",
    "verify_checkpoint",
    "with_destination",
    "write_file_atomically",
]
