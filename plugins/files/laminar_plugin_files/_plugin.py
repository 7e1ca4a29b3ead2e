"""The plugin's hooks: registration of the connectors, and their conformance test contexts."""

from __future__ import annotations

from pathlib import Path

from laminar_sdk import ConnectorRegistry, hookimpl

from laminar_plugin_files._contexts import FilesSinkContext, FilesSourceContext
from laminar_plugin_files._sink import FilesSink
from laminar_plugin_files._source import FilesSource

CONNECTOR = "files"
"""The name both connectors are registered under (a source and a sink)."""


@hookimpl
def laminar_register_connectors(registry: ConnectorRegistry) -> None:
    """Register the ``files`` source and the ``files`` sink."""
    registry.add_source(
        CONNECTOR,
        FilesSource,
        config_keys=FilesSource.CONFIG_KEYS,
        description=FilesSource.DESCRIPTION,
    )
    registry.add_sink(
        CONNECTOR,
        FilesSink,
        config_keys=FilesSink.CONFIG_KEYS,
        description=FilesSink.DESCRIPTION,
    )


@hookimpl
def laminar_conformance_context(
    connector: str, role: str, workdir: Path
) -> FilesSinkContext | FilesSourceContext | None:
    """Test contexts for the ``files`` sink and source; ``None`` for any other connector."""
    if connector != CONNECTOR:
        return None
    if role == "sink":
        return FilesSinkContext(workdir)
    if role == "source":
        return FilesSourceContext(workdir)
    return None
