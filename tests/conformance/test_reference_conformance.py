"""The SDK's reference connectors adopt the conformance suites, as any plugin would.

The memory sink's whole suite runs through ``laminar conformance run`` instead
(tests/conformance/test_conformance_cli.py), which checks its report as well: a class here
would run the same checks a second time.
"""

from __future__ import annotations

from laminar_conformance.sink import SinkSuite
from laminar_conformance.source import SourceSuite


class TestNullSink(SinkSuite):
    connector = "null"


class TestMemorySource(SourceSuite):
    connector = "memory"


class TestGeneratorSource(SourceSuite):
    connector = "generator"
