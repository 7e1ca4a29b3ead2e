"""The plugin's hooks: registration of the connectors, and their conformance test contexts."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from laminar_sdk import ConnectorRegistry, hookimpl

from laminar_plugin_files._sink import FilesSink
from laminar_plugin_files._source import FilesSource

if TYPE_CHECKING:
    from laminar_plugin_files.testing import FilesSinkContext, FilesSourceContext

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
    from laminar_plugin_files import testing  # noqa: PLC0415 - imported for the kit only

    if connector != CONNECTOR:
        return None
    if role == "sink":
        return testing.FilesSinkContext(workdir)
    if role == "source":
        return testing.FilesSourceContext(workdir)
    return None
