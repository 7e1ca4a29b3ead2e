"""Apache Kafka connectors for Laminar: the ``kafka`` source and the ``kafka`` sink.

Installed, the plugin registers through the ``laminar_sdk.plugins`` entry point (``kafka``):

- ``kafka`` source (:class:`KafkaSource`) — topics read as Arrow batches (read committed),
  resumable from exact per-partition offsets, range-readable for parallel reads on Spark;
- ``kafka`` sink (:class:`KafkaSink`) — each epoch one Kafka transaction, exactly once across
  crashes (or at-least-once with an idempotent producer).

Every ``kafka.*`` configuration key is passed to librdkafka without its prefix. For the
conformance kit the plugin also gives test contexts, which take their broker from
``laminar_conformance.services.kafka_service()`` (the kit is imported only when asked).
"""

from __future__ import annotations

from laminar_plugin_kafka._plugin import laminar_conformance_context, laminar_register_connectors
from laminar_plugin_kafka._records import HEADERS_TYPE
from laminar_plugin_kafka._sink import KafkaSink
from laminar_plugin_kafka._source import KafkaSource

__all__ = [
    "HEADERS_TYPE",
    "KafkaSink",
    "KafkaSource",
    "laminar_conformance_context",
    "laminar_register_connectors",
]
