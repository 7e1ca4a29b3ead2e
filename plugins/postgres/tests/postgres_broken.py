"""Deliberately broken variants of the PostgreSQL connectors, as one plugin module.

Each ``broken-postgres-*`` connector has one bug that the conformance kit's quick profile must
catch. They reuse the plugin's internals (they are test doubles), and its test contexts.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from laminar_sdk import ConnectorConfig, ConnectorRegistry, SourceBatch, crash_point, hookimpl

from laminar_plugin_postgres import PostgresCdcSource, PostgresSink, PostgresTwoPhaseSink
from laminar_plugin_postgres._pgoutput import lsn_text
from laminar_plugin_postgres._tables import finish_prepared
from laminar_plugin_postgres.testing import PostgresCdcContext, PostgresSinkContext


class MarkerApart(PostgresSink):
    """Commits the epoch's rows, then records the marker in a transaction of its own."""

    async def commit_epoch(self, epoch: int) -> None:
        writer = self._lifecycle.require("commit_epoch")
        current = writer.epochs.committing(epoch)
        if current is None or current.held is None or not current.held.in_transaction:
            await super().commit_epoch(epoch)
            return
        writer.epochs.finish(epoch)
        await writer.session.execute("COMMIT")
        crash_point("rows-committed")
        await writer.markers.record_whole(writer.session, epoch)


class CommitPreparedBlindly(PostgresTwoPhaseSink):
    """Runs ``COMMIT PREPARED`` for every named transaction, committed before or not."""

    async def commit_aggregated(self, epoch: int, descriptors: Sequence[str]) -> None:
        writer = self._lifecycle.require("commit_aggregated")
        for gid in descriptors:
            if gid:
                await finish_prepared(writer.session, gid, commit=True)
        await writer.markers.finish_prepared_epoch(writer.session, epoch)


class SlotAdvancedAtRead(PostgresCdcSource):
    """Advances the slot past every change as soon as it returned it."""

    async def poll_batch(self, max_records: int) -> SourceBatch | None:
        batch = await super().poll_batch(max_records)
        reader = self._lifecycle.require("poll_batch")
        if batch is not None and reader.position.lsn:
            await reader.session.execute(
                "SELECT pg_replication_slot_advance(%s, %s::pg_lsn)",
                (reader.settings.slot, lsn_text(reader.position.lsn)),
            )
        return batch


_SINKS = {
    "broken-postgres-marker-apart": (MarkerApart, "append"),
    "broken-postgres-commit-prepared-blindly": (CommitPreparedBlindly, "two-phase"),
}


@hookimpl
def laminar_register_connectors(registry: ConnectorRegistry) -> None:
    for name, (sink, _) in _SINKS.items():
        registry.add_sink(name, sink, config_keys=sink.CONFIG_KEYS)
    registry.add_source(
        "broken-postgres-slot-advanced-at-read",
        SlotAdvancedAtRead,
        config_keys=SlotAdvancedAtRead.CONFIG_KEYS,
    )


class _RenamedSinkContext(PostgresSinkContext):
    def __init__(self, workdir: Path, mode: str, connector: str) -> None:
        super().__init__(workdir, mode)
        self._connector = connector

    def config(self) -> ConnectorConfig:
        return ConnectorConfig(self._connector, super().config().properties)


@hookimpl
def laminar_conformance_context(connector: str, role: str, workdir: Path) -> object | None:
    if connector in _SINKS and role == "sink":
        return _RenamedSinkContext(workdir, _SINKS[connector][1], connector)
    if connector == "broken-postgres-slot-advanced-at-read" and role == "source":
        return PostgresCdcContext()
    return None
