"""The connector contract: provided defaults, value types and the error hierarchy."""

from __future__ import annotations

import inspect
import pickle

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

import laminar_sdk
from laminar_sdk import (
    CheckpointError,
    ConnectorConfig,
    ConnectorMetrics,
    DeliveryGuarantee,
    HealthState,
    HealthStatus,
    PartitionInfo,
    SinkConnector,
    SinkConnectorCapabilities,
    SourceBatch,
    SourceCheckpoint,
    SourceConnector,
    WriteResult,
)

SCHEMA = pa.schema([("id", pa.int64())])


class MinimalSource(SourceConnector):
    """Implements only the abstract methods, so every provided method keeps its default."""

    async def open(self, config: ConnectorConfig) -> None:
        pass

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


class RecordingSink(SinkConnector):
    """Implements only the abstract methods and records flushes."""

    def __init__(self) -> None:
        self.flushed = 0

    async def open(self, config: ConnectorConfig) -> None:
        pass

    async def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        return WriteResult(batch.num_rows)

    def schema(self) -> pa.Schema:
        return SCHEMA

    async def close(self) -> None:
        pass

    async def flush(self) -> None:
        self.flushed += 1


def test_source_defaults(run):
    source = MinimalSource()
    assert run(source.health_check()) == HealthStatus.unknown()
    assert source.metrics() == ConnectorMetrics()
    assert source.data_ready_notify() is None
    assert source.as_schema_provider() is None
    assert source.as_schema_inferable() is None
    assert source.as_schema_registry_aware() is None
    assert source.as_schema_evolvable() is None
    assert source.supports_replay() is True
    assert source.checkpoint_requested() is None


def test_sink_defaults(run):
    sink = RecordingSink()
    run(sink.begin_epoch(1))
    assert sink.flushed == 0
    run(sink.pre_commit(1))
    assert sink.flushed == 1, "pre_commit must default to flush()"
    run(sink.commit_epoch(1))
    run(sink.rollback_epoch(1))
    run(sink.rollback_epoch(1))  # idempotent by contract
    assert run(sink.health_check()).state is HealthState.UNKNOWN
    assert sink.metrics() == ConnectorMetrics(0, 0, 0, 0, {})
    assert sink.capabilities() == SinkConnectorCapabilities()
    assert sink.capabilities().names() == ()
    assert sink.as_schema_registry_aware() is None
    assert sink.as_schema_evolvable() is None


def test_abstract_methods_are_required():
    class NoPoll(SourceConnector):
        pass

    with pytest.raises(TypeError, match="poll_batch"):
        NoPoll()  # type: ignore[abstract]


def test_delivery_guarantee():
    assert DeliveryGuarantee.default() is DeliveryGuarantee.AT_LEAST_ONCE
    assert str(DeliveryGuarantee.AT_LEAST_ONCE) == "at-least-once"
    assert str(DeliveryGuarantee.EXACTLY_ONCE) == "exactly-once"
    for text in ("exactly-once", "EXACTLY_ONCE", "exactlyonce", " Exactly-Once "):
        assert DeliveryGuarantee.parse(text) is DeliveryGuarantee.EXACTLY_ONCE
    with pytest.raises(laminar_sdk.ConfigurationError, match="at-most-once.*exactly-once"):
        DeliveryGuarantee.parse("at-most-once")


def test_source_batch_and_partition_info():
    records = pa.record_batch([pa.array([1, 2, 3], pa.int64())], schema=SCHEMA)
    batch = SourceBatch(records, PartitionInfo("orders-3", "1042"))
    assert batch.num_rows == 3
    assert str(batch.partition) == "orders-3@1042"
    assert SourceBatch(records).partition is None
    assert WriteResult(3).bytes_written == 0


def test_capability_builders_return_new_values():
    base = SinkConnectorCapabilities()
    built = (
        base.with_exactly_once()
        .with_idempotent()
        .with_upsert()
        .with_changelog()
        .with_two_phase_commit()
        .with_schema_evolution()
        .with_partitioned()
    )
    assert base == SinkConnectorCapabilities(), "builders must not mutate"
    assert built.names() == (
        "exactly_once",
        "idempotent",
        "upsert",
        "changelog",
        "two_phase_commit",
        "schema_evolution",
        "partitioned",
    )
    assert base.with_two_phase_commit().names() == ("two_phase_commit",)


def test_health_status():
    assert HealthStatus.healthy().is_healthy
    degraded = HealthStatus.degraded("lag 10k records")
    assert not degraded.is_healthy
    assert str(degraded) == "degraded: lag 10k records"
    assert HealthStatus.unhealthy("broker down").state is HealthState.UNHEALTHY
    assert str(HealthStatus.unknown()) == "unknown"


text = st.text(max_size=20)


@given(
    offsets=st.dictionaries(text, text, max_size=5),
    epoch=st.integers(min_value=0, max_value=2**63),
    metadata=st.dictionaries(text, text, max_size=3),
)
def test_source_checkpoint_json_round_trip_is_lossless(offsets, epoch, metadata):
    checkpoint = SourceCheckpoint(offsets, epoch, metadata)
    text_form = checkpoint.to_json()
    restored = SourceCheckpoint.from_json(text_form)
    assert restored == checkpoint
    assert dict(restored.offsets) == offsets
    assert restored.to_json() == text_form, "the JSON form must be canonical"
    assert pickle.loads(pickle.dumps(checkpoint)) == checkpoint


def test_source_checkpoint_helpers():
    checkpoint = SourceCheckpoint({"0": "5"}, 3).with_offset("1", "9").with_epoch(4)
    assert checkpoint.get_offset("1") == "9"
    assert checkpoint.get_offset("2") is None
    assert checkpoint.epoch == 4
    assert SourceCheckpoint().is_empty
    assert not checkpoint.is_empty


@pytest.mark.parametrize(
    ("text_form", "reason"),
    [
        ('{"offsets": {"0": "5"}, "epoch": 1', "not valid JSON"),
        ("[1, 2]", "must be an object"),
        ('{"offsets": {"0": 5}, "epoch": 1, "metadata": {}}', "map str to str"),
        ('{"offsets": {}, "epoch": -1, "metadata": {}}', "non-negative"),
        ('{"offsets": {}, "epoch": "1", "metadata": {}}', "non-negative int"),
        ('{"offsets": {}, "epoch": 1, "metadata": {}, "extra": 1}', "newer SDK"),
        (b"\xff\xfe", "not valid JSON"),
    ],
)
def test_source_checkpoint_rejects_corrupt_json(text_form, reason):
    with pytest.raises(CheckpointError, match=reason):
        SourceCheckpoint.from_json(text_form)


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (laminar_sdk.ConnectionFailed("broker down"), True),
        (laminar_sdk.ReadError("fetch failed"), True),
        (laminar_sdk.WriteError("produce failed"), True),
        (laminar_sdk.Timeout("poll", timeout_s=5), True),
        (laminar_sdk.ConnectorIOError("disk full"), True),
        (laminar_sdk.ConfigurationError("bad", key="k"), False),
        (laminar_sdk.SerdeError("bad json"), False),
        (laminar_sdk.TransactionError("fenced"), False),
        (laminar_sdk.InvalidState("open", "closed"), False),
        (laminar_sdk.SchemaMismatch("id: int32 != int64"), False),
        (laminar_sdk.Closed("closed"), False),
        (laminar_sdk.Internal("bug"), False),
    ],
)
def test_error_hierarchy_and_transience(error, transient):
    assert isinstance(error, laminar_sdk.ConnectorError)
    assert isinstance(error, laminar_sdk.LaminarError)
    assert error.is_transient is transient


def test_invalid_state_names_both_states():
    error = laminar_sdk.InvalidState("epoch begun", "no epoch")
    assert (error.expected, error.actual) == ("epoch begun", "no epoch")
    assert str(error) == "invalid state: expected epoch begun, got no epoch"


def test_plugin_and_checkpoint_errors_are_laminar_errors_not_connector_errors():
    for error_type in (laminar_sdk.PluginError, laminar_sdk.CheckpointError):
        assert issubclass(error_type, laminar_sdk.LaminarError)
        assert not issubclass(error_type, laminar_sdk.ConnectorError)


class EveryCallSink(SinkConnector):
    """Records each contract method called on it and answers with a value of its own."""

    answers: dict[str, object]

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[object, ...]]] = []
        self.answers = {
            "write_batch": WriteResult(7),
            "schema": SCHEMA,
            "health_check": HealthStatus.healthy(),
            "metrics": ConnectorMetrics(records_total=3),
            "capabilities": SinkConnectorCapabilities().with_exactly_once(),
            "as_distributed_commit": object(),
            "as_schema_registry_aware": object(),
            "as_schema_evolvable": object(),
            "last_committed_epoch": 7,
        }

    def _answer(self, name: str, *arguments: object):
        self.calls.append((name, arguments))
        return self.answers.get(name)

    async def open(self, config):
        return self._answer("open", config)

    async def write_batch(self, batch):
        return self._answer("write_batch", batch)

    def schema(self):
        return self._answer("schema")

    async def close(self):
        return self._answer("close")

    async def begin_epoch(self, epoch):
        return self._answer("begin_epoch", epoch)

    async def pre_commit(self, epoch):
        return self._answer("pre_commit", epoch)

    async def commit_epoch(self, epoch):
        return self._answer("commit_epoch", epoch)

    async def rollback_epoch(self, epoch):
        return self._answer("rollback_epoch", epoch)

    async def flush(self):
        return self._answer("flush")

    async def last_committed_epoch(self):
        return self._answer("last_committed_epoch")

    async def health_check(self):
        return self._answer("health_check")

    def metrics(self):
        return self._answer("metrics")

    def capabilities(self):
        return self._answer("capabilities")

    def as_distributed_commit(self):
        return self._answer("as_distributed_commit")

    def as_schema_registry_aware(self):
        return self._answer("as_schema_registry_aware")

    def as_schema_evolvable(self):
        return self._answer("as_schema_evolvable")


def test_a_forwarding_sink_forwards_every_method_of_the_contract(run):
    inner = EveryCallSink()
    sink = laminar_sdk.ForwardingSink(inner)
    assert sink.wrapped is inner
    config = ConnectorConfig({"path": "x"})
    batch = pa.record_batch([pa.array([1], pa.int64())], schema=SCHEMA)
    arguments = {"open": (config,), "write_batch": (batch,)}
    methods = [
        name
        for name, member in vars(SinkConnector).items()
        if callable(member) and not name.startswith("_")
    ]
    assert len(methods) == 16, "the sink contract changed: extend EveryCallSink"
    methods.append(methods.pop(methods.index("close")))  # every call after close() is refused
    for name in methods:
        takes_epoch = "epoch" in inspect.signature(getattr(SinkConnector, name)).parameters
        given_arguments = arguments.get(name, (4,) if takes_epoch else ())
        result = getattr(sink, name)(*given_arguments)
        if hasattr(result, "__await__"):
            result = run(result)
        assert inner.calls[-1] == (name, given_arguments), f"{name} was not forwarded"
        assert result is inner.answers.get(name), f"{name} did not return the wrapped answer"
    assert len(inner.calls) == len(methods)


def test_every_connector_refuses_calls_after_close_without_writing_a_check(run):
    source, sink = MinimalSource(), RecordingSink()
    run(source.open(ConnectorConfig("minimal", {})))
    run(source.close())
    run(source.close())  # a second close() does nothing
    for call in (source.poll_batch(1), source.restore(SourceCheckpoint())):
        with pytest.raises(laminar_sdk.Closed, match=r"MinimalSource\.\w+\(\) called after close"):
            run(call)
    with pytest.raises(laminar_sdk.Closed, match=r"MinimalSource\.checkpoint\(\)"):
        source.checkpoint()
    with pytest.raises(laminar_sdk.Closed, match=r"MinimalSource\.open\(\)"):
        run(source.open(ConnectorConfig("minimal", {})))
    assert source.schema() == SCHEMA, "reading the schema stays allowed"
    assert source.metrics() == ConnectorMetrics()

    run(sink.close())
    calls = {
        "write_batch": sink.write_batch(pa.record_batch([[1]], schema=SCHEMA)),
        "begin_epoch": sink.begin_epoch(1),  # the base class's default, guarded too
        "pre_commit": sink.pre_commit(1),
        "commit_epoch": sink.commit_epoch(1),
        "rollback_epoch": sink.rollback_epoch(1),
        "flush": sink.flush(),
    }
    for name, call in calls.items():
        with pytest.raises(laminar_sdk.Closed, match=rf"RecordingSink\.{name}\(\)"):
            run(call)
    assert sink.flushed == 0


def test_close_may_still_flush_and_is_marked_closed_even_when_it_fails(run):
    class FlushingOnClose(RecordingSink):
        async def close(self) -> None:
            await self.flush()
            raise laminar_sdk.WriteError("the last flush failed")

    sink = FlushingOnClose()
    with pytest.raises(laminar_sdk.WriteError):
        run(sink.close())
    assert sink.flushed == 1, "close() itself may call the protocol"
    with pytest.raises(laminar_sdk.Closed):
        run(sink.flush())


def test_a_plain_method_where_the_contract_awaits_is_refused_when_the_class_is_defined():
    with pytest.raises(laminar_sdk.PluginError, match=r"close\(\.\.\.\)`: the runtime awaits"):

        class PlainClose(laminar_sdk.SinkConnector):
            def close(self):
                pass

    with pytest.raises(laminar_sdk.PluginError, match=r"`def checkpoint\(\.\.\.\)`, not `async"):

        class AsyncCheckpoint(laminar_sdk.SourceConnector):
            async def checkpoint(self):
                pass
