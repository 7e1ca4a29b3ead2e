"""The SDK's reference connectors adopt the conformance suites, as any plugin would."""

from __future__ import annotations

from laminar_conformance.sink import SinkSuite
from laminar_conformance.source import SourceSuite


class TestMemorySink(SinkSuite):
    connector = "memory"


class TestNullSink(SinkSuite):
    connector = "null"


class TestMemorySource(SourceSuite):
    connector = "memory"


class TestGeneratorSource(SourceSuite):
    connector = "generator"
