"""The plugin's hooks: registration of the connectors, and their conformance test contexts."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from laminar_sdk import ConnectorRegistry, hookimpl

from laminar_plugin_delta._sink import DeltaSink

if TYPE_CHECKING:
    from laminar_plugin_delta.testing import DeltaSinkContext

CONNECTOR = "delta"
"""The name the connectors are registered under."""


@hookimpl
def laminar_register_connectors(registry: ConnectorRegistry) -> None:
    """Register the ``delta`` sink."""
    registry.add_sink(
        CONNECTOR,
        DeltaSink,
        config_keys=DeltaSink.CONFIG_KEYS,
        description=DeltaSink.DESCRIPTION,
    )


@hookimpl
def laminar_conformance_context(
    connector: str, role: str, workdir: Path
) -> DeltaSinkContext | None:
    """The test context of the ``delta`` sink; ``None`` for any other connector or role."""
    from laminar_plugin_delta import testing  # noqa: PLC0415 - imported for the kit only

    if connector != CONNECTOR:
        return None
    if role == "sink":
        return testing.DeltaSinkContext(workdir)
    return None
