"""The delta plugin adopts the conformance suites, as any plugin would."""

from __future__ import annotations

from laminar_conformance.sink import SinkSuite
from laminar_conformance.source import SourceSuite


class TestDeltaSink(SinkSuite):
    connector = "delta"


class TestDeltaSource(SourceSuite):
    connector = "delta"
