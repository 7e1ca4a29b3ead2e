"""Deliberately broken variants of the Delta Lake connectors, as one plugin module.

Each ``broken-delta-*`` connector has one bug that the conformance kit's quick profile must
catch. They reuse the plugin's internals (they are test doubles), and its test contexts; none
marks a crash point of its own: the kit must find where they touch the table by itself.
"""

from __future__ import annotations

from pathlib import Path

from deltalake import CommitProperties, DeltaTable, Transaction
from laminar_sdk import ConnectorConfig, ConnectorRegistry, hookimpl

from laminar_plugin_delta import DeltaSink
from laminar_plugin_delta._sink import _Settings
from laminar_plugin_delta._staging import StagedEpoch
from laminar_plugin_delta.testing import DeltaSinkContext


class EpochNotChecked(DeltaSink):
    """Commits every epoch it is given with its transaction id, trusting delta-rs to skip one
    the table holds (it does not: delta-rs #2580)."""

    def _commit(self, settings: _Settings, table: DeltaTable, staged: StagedEpoch) -> None:
        table.create_write_transaction(
            [f.add_action() for f in staged.files],
            mode="append",
            schema=table.schema(),
            commit_properties=CommitProperties(
                app_transactions=[Transaction(settings.app_id, staged.epoch)]
            ),
        )


class VersionRecordedApart(DeltaSink):
    """Checks the epoch, appends its files in one commit, records the epoch in a second."""

    def _commit(self, settings: _Settings, table: DeltaTable, staged: StagedEpoch) -> None:
        recorded = table.transaction_version(settings.app_id)
        if recorded is not None and recorded >= staged.epoch:
            return
        table.create_write_transaction(
            [f.add_action() for f in staged.files], mode="append", schema=table.schema()
        )
        table.update_incremental()
        table.create_write_transaction(
            [],
            mode="append",
            schema=table.schema(),
            commit_properties=CommitProperties(
                app_transactions=[Transaction(settings.app_id, staged.epoch)]
            ),
        )


_SINKS = {
    "broken-delta-epoch-not-checked": EpochNotChecked,
    "broken-delta-version-recorded-apart": VersionRecordedApart,
}


@hookimpl
def laminar_register_connectors(registry: ConnectorRegistry) -> None:
    for name, sink in _SINKS.items():
        registry.add_sink(name, sink, config_keys=sink.CONFIG_KEYS)


class _RenamedSinkContext(DeltaSinkContext):
    def __init__(self, workdir: Path, connector: str) -> None:
        super().__init__(workdir)
        self._connector = connector

    def config(self) -> ConnectorConfig:
        return ConnectorConfig(self._connector, super().config().properties)


@hookimpl
def laminar_conformance_context(connector: str, role: str, workdir: Path) -> object | None:
    if connector in _SINKS and role == "sink":
        return _RenamedSinkContext(workdir, connector)
    return None
