"""The delta plugin adopts the conformance suites, as any plugin would."""

from __future__ import annotations

from laminar_conformance.sink import SinkSuite


class TestDeltaSink(SinkSuite):
    connector = "delta"
