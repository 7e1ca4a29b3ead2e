"""The ``kafka`` connectors adopt the conformance kit's suites, as any plugin would."""

from __future__ import annotations

from laminar_conformance.sink import SinkSuite
from laminar_conformance.source import SourceSuite


class TestKafkaSink(SinkSuite):
    connector = "kafka"


class TestKafkaSource(SourceSuite):
    connector = "kafka"
