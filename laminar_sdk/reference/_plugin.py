"""Registration of the reference connectors, through the same hook as any third-party plugin."""

from __future__ import annotations

from laminar_sdk import ConnectorRegistry, hookimpl
from laminar_sdk.reference._generator import GeneratorSource
from laminar_sdk.reference._memory import MemorySink, MemorySource
from laminar_sdk.reference._null import NullSink


@hookimpl
def laminar_register_connectors(registry: ConnectorRegistry) -> None:
    """Register ``generator`` and ``memory`` (sources), ``memory`` and ``null`` (sinks)."""
    registry.add_source(
        "generator",
        GeneratorSource,
        config_keys=GeneratorSource.CONFIG_KEYS,
        description=GeneratorSource.DESCRIPTION,
    )
    registry.add_source(
        "memory",
        MemorySource,
        config_keys=MemorySource.CONFIG_KEYS,
        description=MemorySource.DESCRIPTION,
    )
    registry.add_sink(
        "memory", MemorySink, config_keys=MemorySink.CONFIG_KEYS, description=MemorySink.DESCRIPTION
    )
    registry.add_sink(
        "null", NullSink, config_keys=NullSink.CONFIG_KEYS, description=NullSink.DESCRIPTION
    )
