"""Delivery-guarantee validation, rule by rule."""

from __future__ import annotations

import pyarrow as pa
import pytest

from laminar_sdk import (
    ConfigurationError,
    ConnectorConfig,
    DeliveryGuarantee,
    DeliveryGuaranteeWarning,
    SinkConnector,
    SinkConnectorCapabilities,
    SourceBatch,
    SourceCheckpoint,
    SourceConnector,
    WriteResult,
    validate_delivery_guarantee,
)

SCHEMA = pa.schema([("id", pa.int64())])


class Source(SourceConnector):
    def __init__(self, *, replay: bool) -> None:
        self.replay = replay

    async def open(self, config: ConnectorConfig) -> None:
        raise AssertionError("validation must not open connectors")

    async def poll_batch(self, max_records: int) -> SourceBatch | None:
        return None

    def schema(self) -> pa.Schema:
        return SCHEMA

    def checkpoint(self) -> SourceCheckpoint:
        return SourceCheckpoint()

    async def restore(self, checkpoint: SourceCheckpoint) -> None:
        pass

    async def close(self) -> None:
        pass

    def supports_replay(self) -> bool:
        return self.replay


class Sink(SinkConnector):
    def __init__(self, *, exactly_once: bool) -> None:
        self.exactly_once = exactly_once

    async def open(self, config: ConnectorConfig) -> None:
        raise AssertionError("validation must not open connectors")

    async def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        return WriteResult(0)

    def schema(self) -> pa.Schema:
        return SCHEMA

    async def close(self) -> None:
        pass

    def capabilities(self) -> SinkConnectorCapabilities:
        caps = SinkConnectorCapabilities()
        return caps.with_exactly_once() if self.exactly_once else caps


EXACTLY = DeliveryGuarantee.EXACTLY_ONCE
AT_LEAST = DeliveryGuarantee.AT_LEAST_ONCE


def test_exactly_once_passes_when_every_rule_holds():
    validate_delivery_guarantee(
        EXACTLY,
        sources={"gen": Source(replay=True)},
        sinks={"files": Sink(exactly_once=True)},
        checkpointing_enabled=True,
    )


def test_exactly_once_requires_checkpointing():
    with pytest.raises(ConfigurationError, match="requires checkpointing") as info:
        validate_delivery_guarantee(
            EXACTLY,
            sources={"gen": Source(replay=True)},
            sinks={"files": Sink(exactly_once=True)},
            checkpointing_enabled=False,
        )
    assert info.value.key == "delivery"


def test_exactly_once_requires_replayable_sources_and_names_the_one_that_is_not():
    with pytest.raises(ConfigurationError, match="source 'socket' does not"):
        validate_delivery_guarantee(
            EXACTLY,
            sources={"gen": Source(replay=True), "socket": Source(replay=False)},
            sinks={"files": Sink(exactly_once=True)},
            checkpointing_enabled=True,
        )


def test_exactly_once_requires_exactly_once_sinks_and_names_the_one_that_is_not():
    with pytest.raises(ConfigurationError, match="sink 'console' does not"):
        validate_delivery_guarantee(
            EXACTLY,
            sources={"gen": Source(replay=True)},
            sinks={"files": Sink(exactly_once=True), "console": Sink(exactly_once=False)},
            checkpointing_enabled=True,
        )


def test_at_least_once_with_a_non_replayable_source_warns_and_names_it():
    with pytest.warns(DeliveryGuaranteeWarning, match="source 'socket' cannot replay"):
        validate_delivery_guarantee(
            AT_LEAST,
            sources={"socket": Source(replay=False)},
            sinks={"console": Sink(exactly_once=False)},
            checkpointing_enabled=True,
        )


def test_at_least_once_with_replayable_sources_is_silent():
    # filterwarnings=error turns any warning into a failure here.
    validate_delivery_guarantee(
        AT_LEAST,
        sources={"gen": Source(replay=True)},
        sinks={"console": Sink(exactly_once=False)},
        checkpointing_enabled=False,
    )
