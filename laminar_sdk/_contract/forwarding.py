"""A sink that hands every call to another one: the base of wrappers that watch a few calls."""

from __future__ import annotations

import pyarrow as pa

from laminar_sdk._contract.config import ConnectorConfig
from laminar_sdk._contract.connector import SinkConnector
from laminar_sdk._contract.parallel import DistributedCommitSink
from laminar_sdk._contract.schema import SchemaEvolvable, SchemaRegistryAware
from laminar_sdk._contract.types import (
    ConnectorMetrics,
    HealthStatus,
    SinkConnectorCapabilities,
    WriteResult,
)


class ForwardingSink(SinkConnector):
    """Forwards every method of the sink contract, provided ones included, to :attr:`wrapped`.

    Subclass it to change or watch some calls of another sink — inject faults, count, log —
    and override only those; the rest behave exactly as the wrapped sink's, including its
    capabilities and its opt-in extensions (``as_distributed_commit`` and the schema
    interfaces). An override that still wants the wrapped behaviour calls it on
    :attr:`wrapped`, not through ``super()``.

    :param sink: the sink to forward to; opened and closed through this wrapper.
    """

    def __init__(self, sink: SinkConnector) -> None:
        self._wrapped = sink

    @property
    def wrapped(self) -> SinkConnector:
        """The sink every call is forwarded to."""
        return self._wrapped

    async def open(self, config: ConnectorConfig) -> None:
        """The wrapped sink's ``open``."""
        await self._wrapped.open(config)

    async def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        """The wrapped sink's ``write_batch``."""
        return await self._wrapped.write_batch(batch)

    def schema(self) -> pa.Schema:
        """The wrapped sink's schema."""
        return self._wrapped.schema()

    async def close(self) -> None:
        """The wrapped sink's ``close``."""
        await self._wrapped.close()

    async def begin_epoch(self, epoch: int) -> None:
        """The wrapped sink's ``begin_epoch``."""
        await self._wrapped.begin_epoch(epoch)

    async def pre_commit(self, epoch: int) -> None:
        """The wrapped sink's ``pre_commit``."""
        await self._wrapped.pre_commit(epoch)

    async def commit_epoch(self, epoch: int) -> None:
        """The wrapped sink's ``commit_epoch``."""
        await self._wrapped.commit_epoch(epoch)

    async def rollback_epoch(self, epoch: int) -> None:
        """The wrapped sink's ``rollback_epoch``."""
        await self._wrapped.rollback_epoch(epoch)

    async def flush(self) -> None:
        """The wrapped sink's ``flush``."""
        await self._wrapped.flush()

    async def last_committed_epoch(self) -> int | None:
        """The wrapped sink's ``last_committed_epoch``."""
        return await self._wrapped.last_committed_epoch()

    async def health_check(self) -> HealthStatus:
        """The wrapped sink's health."""
        return await self._wrapped.health_check()

    def metrics(self) -> ConnectorMetrics:
        """The wrapped sink's metrics."""
        return self._wrapped.metrics()

    def capabilities(self) -> SinkConnectorCapabilities:
        """The wrapped sink's capabilities."""
        return self._wrapped.capabilities()

    def as_distributed_commit(self) -> DistributedCommitSink | None:
        """The wrapped sink's distributed commit, if it offers one."""
        return self._wrapped.as_distributed_commit()

    def as_schema_registry_aware(self) -> SchemaRegistryAware | None:
        """The wrapped sink's schema-registry interface, if it offers one."""
        return self._wrapped.as_schema_registry_aware()

    def as_schema_evolvable(self) -> SchemaEvolvable | None:
        """The wrapped sink's schema-evolution interface, if it offers one."""
        return self._wrapped.as_schema_evolvable()
