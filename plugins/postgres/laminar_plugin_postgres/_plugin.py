"""The plugin's hook implementations: registration, and test contexts for the conformance kit."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from laminar_sdk import ConnectorRegistry, hookimpl

from laminar_plugin_postgres._cdc import PostgresCdcSource
from laminar_plugin_postgres._keyset import PostgresKeysetSource
from laminar_plugin_postgres._sink import PostgresSink, PostgresTwoPhaseSink, PostgresUpsertSink

if TYPE_CHECKING:
    from laminar_plugin_postgres.testing import (
        PostgresCdcContext,
        PostgresSinkContext,
        PostgresSourceContext,
    )

CONNECTOR = "postgres"
"""The name of the sink and of the keyset source."""

TWO_PHASE_CONNECTOR = "postgres-2pc"
"""The name of the sink that commits through ``PREPARE TRANSACTION``."""

UPSERT_CONNECTOR = "postgres-upsert"
"""The name of the upsert sink."""

CDC_CONNECTOR = "postgres-cdc"
"""The name of the change-data-capture source."""


@hookimpl
def laminar_register_connectors(registry: ConnectorRegistry) -> None:
    """Register the ``postgres`` sink and source, ``postgres-2pc``, ``-upsert`` and ``-cdc``.

    What a sink offers (exactly once, two-phase commit, upserts, a distributed commit) must be
    known before its configuration is read, so each way of writing is a connector of its own.
    """
    registry.add_sink(
        CONNECTOR,
        PostgresSink,
        config_keys=PostgresSink.CONFIG_KEYS,
        description=PostgresSink.DESCRIPTION,
    )
    registry.add_sink(
        TWO_PHASE_CONNECTOR,
        PostgresTwoPhaseSink,
        config_keys=PostgresTwoPhaseSink.CONFIG_KEYS,
        description=PostgresTwoPhaseSink.DESCRIPTION,
    )
    registry.add_sink(
        UPSERT_CONNECTOR,
        PostgresUpsertSink,
        config_keys=PostgresUpsertSink.CONFIG_KEYS,
        description=PostgresUpsertSink.DESCRIPTION,
    )
    registry.add_source(
        CONNECTOR,
        PostgresKeysetSource,
        config_keys=PostgresKeysetSource.CONFIG_KEYS,
        description=PostgresKeysetSource.DESCRIPTION,
    )
    registry.add_source(
        CDC_CONNECTOR,
        PostgresCdcSource,
        config_keys=PostgresCdcSource.CONFIG_KEYS,
        description=PostgresCdcSource.DESCRIPTION,
    )


@hookimpl
def laminar_conformance_context(
    connector: str, role: str, workdir: Path
) -> PostgresSinkContext | PostgresSourceContext | PostgresCdcContext | None:
    """A fresh table on the kit's PostgreSQL server, for any of the plugin's connectors.

    The server comes from ``laminar_conformance.services.postgres_service()``, started once per
    process on first use.
    """
    from laminar_plugin_postgres import testing  # noqa: PLC0415 - imported for the kit only

    if (connector, role) == (CONNECTOR, "sink"):
        return testing.PostgresSinkContext(workdir)
    if (connector, role) == (TWO_PHASE_CONNECTOR, "sink"):
        return testing.PostgresSinkContext(workdir, mode="two-phase")
    if (connector, role) == (UPSERT_CONNECTOR, "sink"):
        return testing.PostgresSinkContext(workdir, mode="upsert")
    if (connector, role) == (CONNECTOR, "source"):
        return testing.PostgresSourceContext()
    if (connector, role) == (CDC_CONNECTOR, "source"):
        return testing.PostgresCdcContext()
    return None
