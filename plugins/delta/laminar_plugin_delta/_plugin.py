"""The plugin's hooks: registration of the connectors, and their conformance test contexts."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from laminar_sdk import ConnectorRegistry, hookimpl

from laminar_plugin_delta._sink import DeltaSink
from laminar_plugin_delta._source import DeltaSource

if TYPE_CHECKING:
    from laminar_plugin_delta.testing import DeltaSinkContext, DeltaSourceContext

CONNECTOR = "delta"
"""The name both connectors are registered under (a source and a sink)."""


@hookimpl
def laminar_register_connectors(registry: ConnectorRegistry) -> None:
    """Register the ``delta`` source and the ``delta`` sink."""
    registry.add_source(
        CONNECTOR,
        DeltaSource,
        config_keys=DeltaSource.CONFIG_KEYS,
        description=DeltaSource.DESCRIPTION,
    )
    registry.add_sink(
        CONNECTOR,
        DeltaSink,
        config_keys=DeltaSink.CONFIG_KEYS,
        description=DeltaSink.DESCRIPTION,
    )


@hookimpl
def laminar_conformance_context(
    connector: str, role: str, workdir: Path
) -> DeltaSinkContext | DeltaSourceContext | None:
    """Test contexts for the ``delta`` sink and source; ``None`` for any other connector."""
    from laminar_plugin_delta import testing  # noqa: PLC0415 - imported for the kit only

    if connector != CONNECTOR:
        return None
    if role == "sink":
        return testing.DeltaSinkContext(workdir)
    if role == "source":
        return testing.DeltaSourceContext(workdir)
    return None
