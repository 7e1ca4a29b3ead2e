"""The plugin's hook implementations: registration, and test contexts for the conformance kit."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from laminar_sdk import ConnectorRegistry, hookimpl

from laminar_plugin_kafka._config import PASSTHROUGH_PREFIX
from laminar_plugin_kafka._sink import KafkaSink
from laminar_plugin_kafka._source import KafkaSource

if TYPE_CHECKING:
    from laminar_plugin_kafka.testing import KafkaSinkContext, KafkaSourceContext

CONNECTOR = "kafka"
"""The name both connectors are registered under."""


@hookimpl
def laminar_register_connectors(registry: ConnectorRegistry) -> None:
    """Register the ``kafka`` source and sink; ``kafka.*`` keys pass through to librdkafka."""
    registry.add_source(
        CONNECTOR,
        KafkaSource,
        config_keys=KafkaSource.CONFIG_KEYS,
        description=KafkaSource.DESCRIPTION,
        config_prefixes=(PASSTHROUGH_PREFIX,),
    )
    registry.add_sink(
        CONNECTOR,
        KafkaSink,
        config_keys=KafkaSink.CONFIG_KEYS,
        description=KafkaSink.DESCRIPTION,
        config_prefixes=(PASSTHROUGH_PREFIX,),
    )


@hookimpl
def laminar_conformance_context(
    connector: str, role: str, workdir: Path
) -> KafkaSinkContext | KafkaSourceContext | None:
    """A fresh topic on the kit's Kafka broker, for the ``kafka`` source or sink.

    The broker comes from ``laminar_conformance.services.kafka_service()`` — the cluster
    named by ``LAMINAR_KAFKA_BOOTSTRAP``, a container, or a local broker — started once per
    process on first use. The kit is imported only then, so the plugin loads without it.
    """
    from laminar_plugin_kafka import testing  # noqa: PLC0415 - imported for the kit only

    if connector != CONNECTOR:
        return None
    if role == "sink":
        return testing.KafkaSinkContext(workdir)
    if role == "source":
        return testing.KafkaSourceContext()
    return None
