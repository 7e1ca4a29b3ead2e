"""The epoch coordinator and the in-process pipeline: exactly once through every crash point."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from runtime_testing import CrashAt

from laminar_sdk import (
    ConfigurationError,
    ConnectionFailed,
    ConnectorConfig,
    ConnectorRef,
    DeliveryGuarantee,
    EpochCoordinator,
    Pipeline,
    PipelineSpec,
    ProtocolStep,
    RetryPolicy,
    SchemaMismatch,
    SinkConnector,
    Timeout,
    WriteResult,
    load_connector_registry,
    open_checkpointer,
)
from laminar_sdk.faults import SimulatedCrash
from laminar_sdk.reference import IDS_SCHEMA, MemorySink

ROWS_PER_PARTITION = 250
PARTITIONS = 2
ALL_IDS = list(range(ROWS_PER_PARTITION * PARTITIONS))


def spec(sink_path: Path, *, guarantee=DeliveryGuarantee.EXACTLY_ONCE) -> PipelineSpec:
    return PipelineSpec(
        source=ConnectorRef(
            "generator",
            {"rows": str(ROWS_PER_PARTITION), "partitions": str(PARTITIONS), "batch_size": "40"},
        ),
        sinks={"out": ConnectorRef("memory", {"path": str(sink_path)})},
        guarantee=guarantee,
        max_records_per_epoch=120,
        poll_records=40,
    )


@pytest.fixture(scope="module")
def registry():
    return load_connector_registry()


def run_pipeline(registry, sink_path, checkpoints, **kwargs):
    pipeline = Pipeline(spec(sink_path), registry, open_checkpointer(str(checkpoints)), **kwargs)
    return asyncio.run(pipeline.run())


def test_every_record_arrives_once_in_epochs(registry, tmp_path):
    report = run_pipeline(registry, tmp_path / "out", tmp_path / "ckpt")
    assert sorted(MemorySink.committed_ids(tmp_path / "out")) == ALL_IDS
    assert report.rows == len(ALL_IDS)
    assert [e.epoch for e in report.epochs] == list(range(len(report.epochs)))
    assert len(report.epochs) == -(-len(ALL_IDS) // 120)
    again = run_pipeline(registry, tmp_path / "out", tmp_path / "ckpt")
    assert again.epochs == (), "a finished source resumes at its end: nothing more to do"
    assert sorted(MemorySink.committed_ids(tmp_path / "out")) == ALL_IDS


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(step=st.sampled_from(list(ProtocolStep)), epoch=st.integers(min_value=0, max_value=4))
def test_a_crash_at_any_step_of_any_epoch_loses_and_repeats_nothing(
    registry, tmp_path_factory, step, epoch
):
    base = tmp_path_factory.mktemp("crash")
    crash = CrashAt(step, epoch)
    with pytest.raises(SimulatedCrash):
        run_pipeline(registry, base / "out", base / "ckpt", observer=crash)
    assert crash.fired
    run_pipeline(registry, base / "out", base / "ckpt")
    assert sorted(MemorySink.committed_ids(base / "out")) == ALL_IDS


def test_crash_after_the_decision_is_committed_by_recovery_not_replayed(registry, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(SimulatedCrash):
        run_pipeline(registry, out, tmp_path / "ckpt", observer=CrashAt(ProtocolStep.COMMIT, 1))
    assert len(MemorySink.committed_ids(out)) == 120, "epoch 1 is decided but not published"
    recorded = []
    run_pipeline(registry, out, tmp_path / "ckpt", on_epoch=lambda r: recorded.append(r.epoch))
    assert recorded[0] == 2, "epoch 1 was finished by recovery, not written again"
    assert sorted(MemorySink.committed_ids(out)) == ALL_IDS


def test_torn_latest_manifest_falls_back_to_the_one_before(registry, tmp_path, caplog):
    checkpoints = tmp_path / "ckpt"
    with pytest.raises(SimulatedCrash):
        run_pipeline(
            registry, tmp_path / "out", checkpoints, observer=CrashAt(ProtocolStep.DONE, 2)
        )
    store = open_checkpointer(str(checkpoints))
    latest = asyncio.run(store.read_latest())
    manifest = checkpoints / store.manifest_path(latest)
    manifest.write_bytes(manifest.read_bytes()[:-20])  # a torn write
    run_pipeline(registry, tmp_path / "out", checkpoints)
    assert "skipping checkpoint" in caplog.text, "the bad checkpoint is reported, not ignored"
    assert sorted(MemorySink.committed_ids(tmp_path / "out")) == ALL_IDS


def test_a_redelivered_committed_epoch_is_skipped_without_touching_sinks(registry, tmp_path):
    async def scenario():
        sink, _ = await registry.open_sink("memory", {"path": str(tmp_path / "out")})
        coordinator = EpochCoordinator(open_checkpointer(str(tmp_path / "ckpt")), {"out": sink})
        await coordinator.recover()
        batch = batch_in_schema([7, 8])
        first = await coordinator.run_epoch(0, [batch], {})
        again = await coordinator.run_epoch(0, [batch_in_schema([9])], {})
        return first, again

    first, again = asyncio.run(scenario())
    assert (first.rows, first.skipped) == (2, False)
    assert (again.rows, again.skipped) == (0, True)
    assert MemorySink.committed_ids(tmp_path / "out") == [7, 8]


def batch_in_schema(ids):
    columns = {
        field.name: pa.array(ids if field.name == "id" else [0] * len(ids), field.type)
        for field in IDS_SCHEMA
    }
    return pa.record_batch(list(columns.values()), schema=IDS_SCHEMA)


class FlakySink(SinkConnector):
    """Fails ``commit_epoch`` with a transient error a given number of times; keeps ids."""

    failures_left = 0
    write_delay_s = 0.0
    committed: list[int] = []  # noqa: RUF012 - shared on purpose: instances die with each run
    opened = False

    async def open(self, config: ConnectorConfig) -> None:
        FlakySink.opened = True
        self.pending: list[int] = []

    async def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        await asyncio.sleep(FlakySink.write_delay_s)
        self.pending += batch.column("id").to_pylist()
        return WriteResult(batch.num_rows)

    def schema(self) -> pa.Schema:
        return IDS_SCHEMA

    async def commit_epoch(self, epoch: int) -> None:
        if FlakySink.failures_left:
            FlakySink.failures_left -= 1
            raise ConnectionFailed("destination briefly unreachable")
        FlakySink.committed += self.pending
        self.pending = []

    async def rollback_epoch(self, epoch: int) -> None:
        self.pending = []

    async def close(self) -> None:
        pass


@pytest.fixture
def flaky_registry():
    FlakySink.failures_left, FlakySink.write_delay_s, FlakySink.committed = 0, 0.0, []
    FlakySink.opened = False
    registry = load_connector_registry()
    registry.add_sink("flaky", FlakySink)
    return registry


def flaky_spec(**sink_properties):
    return PipelineSpec(
        source=ConnectorRef("generator", {"rows": "100", "batch_size": "50"}),
        sinks={"out": ConnectorRef("flaky", sink_properties)},
        max_records_per_epoch=50,
    )


def test_transient_commit_errors_are_retried_with_backoff(flaky_registry, tmp_path, caplog):
    FlakySink.failures_left = 2
    policy = RetryPolicy(attempts=3, backoff_s=0.01)
    pipeline = Pipeline(
        flaky_spec(), flaky_registry, open_checkpointer(str(tmp_path)), policy=policy
    )
    asyncio.run(pipeline.run())
    assert sorted(FlakySink.committed) == list(range(100))
    assert caplog.text.count("commit_epoch failed") == 2


def test_a_call_that_hangs_is_cut_off_and_named(flaky_registry, tmp_path):
    FlakySink.write_delay_s = 5
    policy = RetryPolicy(call_timeout_s=0.1)
    pipeline = Pipeline(
        flaky_spec(), flaky_registry, open_checkpointer(str(tmp_path)), policy=policy
    )
    with pytest.raises(Timeout, match="sink 'out': write_batch did not finish within 0.1s"):
        asyncio.run(pipeline.run())
    assert FlakySink.committed == []


def test_guarantee_is_checked_before_anything_opens(flaky_registry, tmp_path):
    exactly_once = PipelineSpec(
        source=ConnectorRef("generator", {"rows": "10"}),
        sinks={"out": ConnectorRef("flaky")},
        guarantee=DeliveryGuarantee.EXACTLY_ONCE,
    )
    pipeline = Pipeline(exactly_once, flaky_registry, open_checkpointer(str(tmp_path)))
    with pytest.raises(ConfigurationError, match="sink 'out \\(flaky\\)' does not"):
        asyncio.run(pipeline.run())
    assert not FlakySink.opened


def test_unknown_option_fails_before_anything_opens(flaky_registry, tmp_path):
    pipeline = Pipeline(flaky_spec(colour="blue"), flaky_registry, open_checkpointer(str(tmp_path)))
    with pytest.raises(ConfigurationError, match="unknown config key 'colour'"):
        asyncio.run(pipeline.run())
    assert not FlakySink.opened


def test_schema_mismatch_between_source_and_sink_names_both_and_commits_nothing(registry, tmp_path):
    mismatched = PipelineSpec(
        source=ConnectorRef("generator", {"rows": "10", "schema": "wide"}),
        sinks={"out": ConnectorRef("memory", {"path": str(tmp_path / "out")})},
    )
    pipeline = Pipeline(mismatched, registry, open_checkpointer(str(tmp_path / "ckpt")))
    with pytest.raises(SchemaMismatch, match="sink 'out' expects schema \\(id: int64"):
        asyncio.run(pipeline.run())
    assert MemorySink.committed_ids(tmp_path / "out") == []
