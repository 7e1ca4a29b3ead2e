"""Opening and closing connectors inside Spark's Python workers."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from laminar_sdk._connector import SinkConnector, SourceConnector
from laminar_sdk._spark.options import BridgeOptions, connector_registry

logger = logging.getLogger("laminar_sdk.spark")


@contextlib.asynccontextmanager
async def opened_source(options: BridgeOptions) -> AsyncIterator[SourceConnector]:
    """The source ``options`` name, opened for the block and closed after it.

    :raises ConfigurationError: for bad configuration.
    :raises PluginError: when the plugin's factory or ``open`` fails, naming it.
    """
    source, _ = await connector_registry().open_source(options.connector, options.properties)
    try:
        yield source
    finally:
        await _close(source, options)


@contextlib.asynccontextmanager
async def opened_sink(options: BridgeOptions) -> AsyncIterator[SinkConnector]:
    """The sink ``options`` name, opened for the block and closed after it (see above)."""
    sink, _ = await connector_registry().open_sink(options.connector, options.properties)
    try:
        yield sink
    finally:
        await _close(sink, options)


async def _close(connector: SourceConnector | SinkConnector, options: BridgeOptions) -> None:
    # A failing close must not fail a micro-batch whose work is done (or hide why it failed).
    try:
        await connector.close()
    except Exception:
        logger.exception("closing %s connector %r failed", options.role, options.connector)
