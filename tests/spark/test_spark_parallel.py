"""The bridge's parallel path: range reads in tasks, staged writes, one distributed commit.

The reference ``generator`` and ``memory`` source are range-readable and the ``memory`` sink is
a distributed-commit sink, so the end-to-end tests here (and every Spark test writing to the
memory sink) run through the parallel path. The unit tests drive the bridge's reader and writer
directly, as Spark's workers do, with a task context where a task would have one.
"""

from __future__ import annotations

import asyncio
import json
import pickle
import re
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark import TaskContext
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.datasource import CaseInsensitiveDict
from pyspark.sql.datasource_internal import _streamReader
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from spark_pipelines import (
    MAX_RECORDS_PER_BATCH,
    committed_epochs,
    crash_children,
    expected_ids,
    ids_batch,
    run_exactly_once,
)

from laminar_sdk import (
    CheckpointManifest,
    ConfigurationError,
    DeliveryGuaranteeWarning,
    InvalidState,
    ProtocolStep,
    ReadError,
    open_checkpointer,
)
from laminar_sdk._cli.main import main
from laminar_sdk._spark import reader as reader_module
from laminar_sdk._spark.arrow import spark_schema
from laminar_sdk._spark.reader import LaminarPolledReader, LaminarRangeReader
from laminar_sdk._spark.writer import StagedTaskMessage
from laminar_sdk.reference import IDS_SCHEMA, GeneratorSource, MemorySink, MemorySource
from laminar_sdk.spark import LaminarDataSource

SCHEMA = spark_schema(IDS_SCHEMA, "memory")
JVM_STACKTRACE = "spark.sql.pyspark.jvmStacktrace.enabled"


def task_dirs(work: Path, epoch: int) -> list[Path]:
    directory = work / "sink" / "committed" / f"epoch-{epoch}"
    return sorted(path for path in directory.iterdir() if path.is_dir())


def staging_left(work: Path) -> list[str]:
    staging = work / "sink" / "_staging"
    return sorted(str(path.relative_to(staging)) for path in staging.rglob("*.arrow"))


def manifests(location: Path) -> list[CheckpointManifest]:
    store = open_checkpointer(str(location))

    async def load() -> list[CheckpointManifest]:
        return [await store.load_manifest(c) for c in await store.list_checkpoints()]

    return asyncio.run(load())


def latest_manifest(location: Path) -> CheckpointManifest:
    store = open_checkpointer(str(location))

    async def load() -> CheckpointManifest:
        latest = await store.read_latest()
        assert latest is not None
        return await store.load_manifest(latest)

    return asyncio.run(load())


def ids_of(directory: Path) -> list[int]:
    return [
        i
        for part in sorted(directory.glob("*.arrow"))
        for i in pa.ipc.open_file(pa.OSFile(str(part))).get_batch(0).column("id").to_pylist()
    ]


# End to end -------------------------------------------------------------------------------


@pytest.mark.spark
def test_partitions_are_read_in_tasks_and_each_task_stages_its_share(
    spark: SparkSession, tmp_path: Path
) -> None:
    run_exactly_once(spark, tmp_path, rows=40)

    assert sorted(MemorySink.committed_ids(tmp_path / "sink")) == expected_ids(40)
    assert committed_epochs(tmp_path) == [f"epoch-{e}" for e in range(4)]
    for epoch in range(4):
        tasks = task_dirs(tmp_path, epoch)
        # One read task per generator partition, writing in the same task: each task's
        # staging holds the ids of one partition (id % 2), and both partitions are there.
        assert len(tasks) == 2, f"epoch {epoch}: {tasks}"
        assert sorted({i % 2 for i in ids_of(task)} for task in tasks) == [{0}, {1}]
    records = manifests(tmp_path / "checkpoint" / "laminar")
    assert [m.epoch for m in records] == list(range(4))
    query_ids = {m.query_id for m in records}
    assert len(query_ids) == 1, "Spark's query id, recorded in every manifest"
    assert None not in query_ids
    for manifest in records:
        named = [json.loads(d)["task"] for d in manifest.sink_commit_descriptors["memory"]]
        assert sorted(f"task-{t}" for t in named) == [
            p.name for p in task_dirs(tmp_path, manifest.epoch)
        ]
    assert staging_left(tmp_path) == []


def run_with_laminar_checkpoint_apart(spark: SparkSession, work: Path, rows: int) -> None:
    """generator → memory, with the laminar checkpoint location outside Spark's."""
    query = (
        spark.readStream.format("laminar")
        .option("connector", "generator")
        .options(rows=str(rows), partitions="2")
        .option("laminar.delivery", "exactly-once")
        .load()
        .writeStream.format("laminar")
        .option("connector", "memory")
        .option("path", str(work / "sink"))
        .option("laminar.delivery", "exactly-once")
        .option("laminar.checkpoint.location", str(work / "laminar-checkpoint"))
        .option("checkpointLocation", str(work / "spark-checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(180), "the query did not finish in time"
    finally:
        query.stop()


@pytest.mark.spark
def test_a_deleted_spark_checkpoint_with_the_laminar_one_kept_is_refused(
    spark: SparkSession, tmp_path: Path
) -> None:
    run_with_laminar_checkpoint_apart(spark, tmp_path, rows=10)
    assert sorted(MemorySink.committed_ids(tmp_path / "sink")) == expected_ids(10)
    shutil.rmtree(tmp_path / "spark-checkpoint")

    # The laminar error is the cause of Spark's "Writing job failed": show the JVM's trace.
    spark.conf.set(JVM_STACKTRACE, "true")
    try:
        with pytest.raises(StreamingQueryException) as error:
            run_with_laminar_checkpoint_apart(spark, tmp_path, rows=15)
        message = str(error.value)
    finally:
        spark.conf.unset(JVM_STACKTRACE)

    assert "belong to streaming query" in message
    assert "Delete both" in message
    assert "laminar.checkpoint.location" in message
    assert sorted(MemorySink.committed_ids(tmp_path / "sink")) == expected_ids(10)


# Crashes ----------------------------------------------------------------------------------

ROWS = 30  # 60 rows: micro-batches 0 and 1 hold 25 rows, micro-batch 2 holds 10
CRASH_EPOCH = 1
STEPS = [
    pytest.param(ProtocolStep.MANIFEST, id="manifest"),
    pytest.param(ProtocolStep.COMMIT, id="commit"),
    pytest.param(ProtocolStep.COMMITTED_MANIFEST, id="committed-manifest"),
]


@pytest.fixture(scope="module")
def crashed(selected_params, tmp_path_factory: pytest.TempPathFactory) -> dict[ProtocolStep, Path]:
    """A pipeline killed at each selected step of micro-batch 1's distributed commit, by step."""
    selected = selected_params("step")
    works = {
        f"{step.value}:{CRASH_EPOCH}": tmp_path_factory.mktemp(f"crash-{step.value}")
        for step in selected
    }
    runs = crash_children(works, ROWS, timeout_s=240)
    for crash_at, run in runs.items():
        assert run.returncode != 0, f"{crash_at}: the child was not killed:\n{run.log[-3000:]}"
    return {step: works[f"{step.value}:{CRASH_EPOCH}"] for step in selected}


# Nightly (`tox -e full`) only: three Spark drivers each. CI kills the files sink's distributed
# commit midway in processes of its own (plugins/files/tests/test_files_crash.py), and a Spark
# pipeline in its commit in the quick-start demo's test (test_laminar_run.py).
@pytest.mark.spark
@pytest.mark.full
@pytest.mark.parametrize("step", STEPS)
def test_a_kill_in_the_distributed_commit_then_a_restart_is_exactly_once(
    spark: SparkSession, crashed: dict[ProtocolStep, Path], step: ProtocolStep
) -> None:
    work = crashed[step]
    decided = step is not ProtocolStep.MANIFEST
    latest = latest_manifest(work / "checkpoint" / "laminar")
    assert latest.epoch == (CRASH_EPOCH if decided else CRASH_EPOCH - 1)
    crashed_tasks = sorted(
        f"task-{json.loads(d)['task']}" for d in latest.sink_commit_descriptors["memory"]
    )
    staged_at_crash = staging_left(work)
    visible = 2 if step is ProtocolStep.COMMITTED_MANIFEST else 1
    assert len(MemorySink.committed_ids(work / "sink")) == visible * MAX_RECORDS_PER_BATCH

    run_exactly_once(spark, work, ROWS)

    assert sorted(MemorySink.committed_ids(work / "sink")) == expected_ids(ROWS)
    assert staging_left(work) == [], "the crashed run's and the re-run's staging is discarded"
    committed = [path.name for path in task_dirs(work, CRASH_EPOCH)]
    if decided:
        # The decision named the crashed run's tasks: those are published, not the re-run's.
        assert committed == crashed_tasks
    else:
        assert staged_at_crash, "the crashed run had staged micro-batch 1"
        assert not {name.split("/")[1] for name in staged_at_crash} & set(committed)


# The reader, as Spark's workers drive it --------------------------------------------------


def source_options(**options: str) -> CaseInsensitiveDict:
    return CaseInsensitiveDict(**options)


def test_spark_takes_the_parallel_reader_for_a_range_readable_source_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    source = LaminarDataSource(source_options(connector="generator", rows="5"))
    assert isinstance(_streamReader(source, SCHEMA), LaminarRangeReader)

    monkeypatch.setattr(GeneratorSource, "as_range_readable", lambda self: None)
    with pytest.raises(ConfigurationError, match="is polled") as error:
        _streamReader(source, SCHEMA)
    assert error.value.key == "laminar.checkpoint.location"
    assert ".option('checkpointLocation', DIR)" in str(error.value)
    polled = LaminarDataSource(
        source_options(connector="generator", rows="5", checkpointLocation=str(tmp_path))
    )
    assert isinstance(_streamReader(polled, SCHEMA), LaminarPolledReader)


def read_on_executor(
    reader: LaminarRangeReader | LaminarPolledReader, start: dict, end: dict
) -> list[int]:
    """What Spark does with a micro-batch: plan its partitions, ship each to a task, read."""
    shipped = pickle.loads(pickle.dumps(reader))
    ids = []
    for partition in reader.partitions(start, end):
        for batch in shipped.read(pickle.loads(pickle.dumps(partition))):
            assert batch.schema.equals(IDS_SCHEMA)
            ids += batch.column("id").to_pylist()
    return ids


def test_a_replayed_micro_batch_reads_the_same_records_after_more_were_appended(
    tmp_path: Path,
) -> None:
    MemorySource.append(tmp_path, range(6), partition=0)
    MemorySource.append(tmp_path, range(100, 104), partition=1)
    options = source_options(connector="memory", path=str(tmp_path))
    options["laminar.max.records.per.batch"] = "6"
    reader = _streamReader(LaminarDataSource(options), SCHEMA)
    assert isinstance(reader, LaminarRangeReader)
    assert reader.getDefaultReadLimit() == ReadMaxRows(6)
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, reader.getDefaultReadLimit())
        assert len(reader.partitions(start, end)) == 2, "one task per partition that moved"
        first = read_on_executor(reader, start, end)
        assert sorted(first) == [0, 1, 2, 100, 101, 102]
        everything = reader.latestOffset(end, ReadAllAvailable())
        assert reader.latestOffset(everything, ReadAllAvailable()) == everything
    finally:
        reader.stop()

    # After a restart, Spark re-runs the micro-batch from its offset log, with more appended.
    MemorySource.append(tmp_path, range(6, 9), partition=0)
    MemorySource.append(tmp_path, range(200, 202), partition=2)
    again = _streamReader(LaminarDataSource(options), SCHEMA)
    assert read_on_executor(again, start, end) == first
    assert sorted(read_on_executor(again, end, everything)) == [3, 4, 5, 103]


def _polled_micro_batch(tmp_path: Path) -> tuple[CaseInsensitiveDict, dict, dict, list[int]]:
    """A polled memory source's first micro-batch, planned and read: options, offsets, ids."""
    spool = tmp_path / "source"
    MemorySource.append(spool, range(6), partition=0)
    MemorySource.append(spool, range(100, 104), partition=1)
    options = source_options(
        connector="memory", path=str(spool), checkpointLocation=str(tmp_path / "checkpoint")
    )
    reader = _streamReader(LaminarDataSource(options), SCHEMA)
    assert isinstance(reader, LaminarPolledReader)
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    return options, start, end, read_on_executor(reader, start, end)


def test_a_polled_micro_batch_is_read_from_the_read_log_after_more_was_appended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(MemorySource, "as_range_readable", lambda self: None)
    options, start, end, first = _polled_micro_batch(tmp_path)
    spool = tmp_path / "source"
    assert sorted(first) == [0, 1, 2, 3, 4, 5, 100, 101, 102, 103]
    logged = sorted((tmp_path / "checkpoint" / "laminar" / "read-log").rglob("*.snap"))
    assert len(logged) == 1, "one slice for a small micro-batch"

    # After a restart, Spark re-runs the micro-batch from its offset log, with more appended:
    # its records come from the log, not from polling again.
    MemorySource.append(spool, range(6, 9), partition=0)
    MemorySource.append(spool, range(200, 202), partition=2)
    again = _streamReader(LaminarDataSource(options), SCHEMA)
    assert read_on_executor(again, start, end) == first
    following = again.latestOffset(end, ReadAllAvailable())
    assert sorted(read_on_executor(again, end, following)) == [6, 7, 8, 200, 201]
    assert again.latestOffset(following, ReadAllAvailable()) == following, "nothing new"

    # Spark committed the micro-batch: its entry is deleted, and only that one.
    again.commit(end)
    assert not logged[0].exists()
    assert sorted(read_on_executor(again, end, following)) == [6, 7, 8, 200, 201]


def _quarantine_command(error: str) -> list[str]:
    (command,) = re.findall(r"`laminar (checkpoints quarantine [^`]+)`", error)
    return shlex.split(command)


def test_a_damaged_read_log_entry_set_aside_is_read_again_from_a_replayable_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(MemorySource, "as_range_readable", lambda self: None)
    options, start, end, first = _polled_micro_batch(tmp_path)
    (logged,) = (tmp_path / "checkpoint" / "laminar" / "read-log").rglob("*.snap")
    data = bytearray(logged.read_bytes())
    data[len(data) // 2] ^= 0x01
    logged.write_bytes(bytes(data))
    MemorySource.append(tmp_path / "source", range(6, 9), partition=0)  # data kept arriving

    restarted = _streamReader(LaminarDataSource(options), SCHEMA)
    with pytest.raises(ReadError, match="corrupted") as corrupted:
        read_on_executor(restarted, start, end)
    # The command the error gives, as the operator runs it.
    assert main(_quarantine_command(str(corrupted.value))) == 0
    out = capsys.readouterr().out
    assert "set read-log entry" in out
    assert "reads its micro-batch again from the source" in out

    again = _streamReader(LaminarDataSource(options), SCHEMA)
    assert [type(p).__name__ for p in again.partitions(start, end)] == ["ReplayedInputPartition"]
    assert read_on_executor(again, start, end) == first, "the first run's records, once"
    following = again.latestOffset(end, ReadAllAvailable())
    assert sorted(read_on_executor(again, end, following)) == [6, 7, 8]
    again.commit(end)
    assert main(["checkpoints", "verify", str(tmp_path / "checkpoint" / "laminar")]) == 0


def test_a_gone_read_log_entry_of_a_source_that_cannot_replay_is_an_error_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(MemorySource, "as_range_readable", lambda self: None)
    monkeypatch.setattr(MemorySource, "supports_replay", lambda self: False)
    with pytest.warns(DeliveryGuaranteeWarning, match="cannot replay"):
        options, start, end, _ = _polled_micro_batch(tmp_path)
    shutil.rmtree(tmp_path / "checkpoint" / "laminar" / "read-log")

    with pytest.warns(DeliveryGuaranteeWarning, match="cannot replay"):
        restarted = _streamReader(LaminarDataSource(options), SCHEMA)
    with pytest.raises(ReadError, match="gone from the read log") as gone:
        restarted.partitions(start, end)

    assert "cannot replay (its supports_replay() is False)" in str(gone.value)
    assert "quarantine" not in str(gone.value)


def test_a_source_that_does_not_replay_the_same_records_delivers_none_of_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(MemorySource, "as_range_readable", lambda self: None)
    monkeypatch.setattr(reader_module, "REPLAY_PATIENCE_S", 0.2)
    options, start, end, _ = _polled_micro_batch(tmp_path)
    shutil.rmtree(tmp_path / "checkpoint" / "laminar" / "read-log")
    shutil.rmtree(tmp_path / "source" / "source" / "partition-1")  # four records are gone

    restarted = _streamReader(LaminarDataSource(options), SCHEMA)
    with pytest.raises(ReadError, match="did not replay the same records") as differs:
        read_on_executor(restarted, start, end)

    assert "returned 6 of the 10 record(s) its first run read" in str(differs.value)


# The writer, as Spark's workers drive it --------------------------------------------------


def sink_options(tmp_path: Path) -> CaseInsensitiveDict:
    return CaseInsensitiveDict(
        connector="memory",
        path=str(tmp_path / "sink"),
        checkpointLocation=str(tmp_path / "checkpoint"),
        **{"laminar.delivery": "exactly-once"},
    )


def test_write_tasks_stage_and_a_redelivered_micro_batch_commits_once(
    tmp_path: Path, in_task: Callable[..., TaskContext]
) -> None:
    writer = LaminarDataSource(sink_options(tmp_path)).streamWriter(SCHEMA, overwrite=False)
    in_task(0, partition=0)
    first = writer.write(iter([ids_batch(0, 5), ids_batch(5, 5)]))
    in_task(0, partition=1)
    second = writer.write(iter([ids_batch(10, 3)]))
    in_task(0, partition=1, attempt=1)
    retried = writer.write(iter([ids_batch(10, 3)]))  # a duplicate attempt Spark drops
    TaskContext._setTaskContext(None)
    assert isinstance(first, StagedTaskMessage)
    assert (first.rows, second.rows, first.query_id) == (10, 3, "q-1")
    assert len(pickle.dumps(first)) < 500, "a descriptor, not data"
    assert second.descriptor != retried.descriptor

    for _ in range(2):  # Spark re-runs the micro-batch's commit after a crash: a new writer
        again = LaminarDataSource(sink_options(tmp_path)).streamWriter(SCHEMA, overwrite=False)
        again.commit([first, second], 0)

    assert sorted(MemorySink.committed_ids(tmp_path / "sink")) == list(range(13))
    assert committed_epochs(tmp_path) == ["epoch-0"]
    assert staging_left(tmp_path) == [], "the dropped attempt's staging is discarded"


def test_a_distributed_write_outside_a_streaming_task_is_refused(tmp_path: Path) -> None:
    writer = LaminarDataSource(sink_options(tmp_path)).streamWriter(SCHEMA, overwrite=False)
    with pytest.raises(InvalidState, match="no streaming batch id"):
        writer.write(iter([ids_batch(0, 1)]))
