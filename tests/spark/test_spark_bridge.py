"""The Spark bridge, end to end: format("laminar") on both sides of a streaming query."""

from __future__ import annotations

import asyncio
import pickle
import threading
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark import TaskContext
from pyspark.errors import AnalysisException, StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.datasource import CaseInsensitiveDict
from pyspark.sql.types import StructType
from spark_pipelines import committed_epochs, expected_ids, ids_batch, run_exactly_once

from laminar_sdk import InvalidState, WriteError
from laminar_sdk._spark import datasource, handoff
from laminar_sdk._spark.arrow import schema_differences, spark_schema
from laminar_sdk._spark.connectors import run
from laminar_sdk._spark.writer import (
    ArrowBatchesMessage,
    HandedOffBatchesMessage,
    LaminarStreamWriter,
)
from laminar_sdk.reference import IDS_SCHEMA, MemorySink
from laminar_sdk.spark import LaminarDataSource

pytestmark = pytest.mark.spark


def test_generator_to_memory_sink_is_exactly_once(spark: SparkSession, tmp_path: Path) -> None:
    run_exactly_once(spark, tmp_path, rows=40)

    assert sorted(MemorySink.committed_ids(tmp_path / "sink")) == expected_ids(40)
    # 80 rows at most 25 per micro-batch: four epochs, each committed once.
    assert committed_epochs(tmp_path) == [f"epoch-{e}" for e in range(4)]


def test_a_restarted_query_resumes_without_duplicates(spark: SparkSession, tmp_path: Path) -> None:
    run_exactly_once(spark, tmp_path, rows=20)
    # The same checkpoint, and the source has grown: only the new rows are written.
    run_exactly_once(spark, tmp_path, rows=35)

    assert sorted(MemorySink.committed_ids(tmp_path / "sink")) == expected_ids(35)


def _writer_options(tmp_path: Path) -> CaseInsensitiveDict:
    # The commit's own path; the epoch writer's is tested in test_epoch_writer_process.py.
    return CaseInsensitiveDict(
        connector="memory",
        path=str(tmp_path / "sink"),
        checkpointLocation=str(tmp_path / "checkpoint"),
        **{"laminar.delivery": "exactly-once", "laminar.epoch.writer": "false"},
    )


def _ids_writer(tmp_path: Path) -> LaminarStreamWriter:
    """A new writer instance of a stream of ids into the memory sink, as Spark makes one."""
    schema: StructType = spark_schema(IDS_SCHEMA, "generator")
    return LaminarDataSource(_writer_options(tmp_path)).streamWriter(schema, overwrite=False)


def test_a_redelivered_micro_batch_is_committed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What Spark does when it re-runs a micro-batch the sink committed before its own commit
    # log said so: the same batch id through a new writer instance, in a new process. The
    # memory sink as a seed-contract sink (one writer per epoch, no distributed commit).
    monkeypatch.setattr(MemorySink, "as_distributed_commit", lambda self: None)
    writer = _ids_writer(tmp_path)
    first = writer.write(iter([ids_batch(0, 5), ids_batch(5, 5)]))
    second = writer.write(iter([ids_batch(10, 3)]))

    for _ in range(2):
        _ids_writer(tmp_path).commit([first, second], 0)

    assert sorted(MemorySink.committed_ids(tmp_path / "sink")) == list(range(13))
    assert committed_epochs(tmp_path) == ["epoch-0"]


def test_unknown_source_connector_fails_at_load(spark: SparkSession) -> None:
    reader = spark.readStream.format("laminar").option("connector", "nope")

    with pytest.raises(AnalysisException, match="no source connector named 'nope'.*generator"):
        reader.load()


def test_unknown_source_option_fails_at_load_naming_the_key(spark: SparkSession) -> None:
    reader = spark.readStream.format("laminar").option("connector", "generator").option("rowz", "5")

    with pytest.raises(AnalysisException, match="unknown config key 'rowz'; did you mean 'rows'"):
        reader.load()


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("connector", "nope", "no sink connector named 'nope'"),
        ("pth", "x", "memory: unknown config key 'pth'; did you mean 'path'"),
    ],
)
def test_bad_sink_options_fail_the_query_before_any_data_is_written(
    spark: SparkSession, tmp_path: Path, option: str, value: str, message: str
) -> None:
    stream = (
        spark.readStream.format("laminar")
        .option("connector", "generator")
        .option("rows", "5")
        .load()
    )
    query = (
        stream.writeStream.format("laminar")
        .option("connector", "memory")
        .option("path", str(tmp_path / "sink"))
        .option(option, value)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )

    with pytest.raises(StreamingQueryException, match=message):
        query.awaitTermination(60)
    assert MemorySink.committed_ids(tmp_path / "sink") == []


def test_a_stream_whose_columns_do_not_fit_the_sink_fails_before_writing(
    spark: SparkSession, tmp_path: Path
) -> None:
    stream = spark.readStream.format("rate").load()
    query = (
        stream.writeStream.format("laminar")
        .option("connector", "memory")
        .option("path", str(tmp_path / "sink"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )

    with pytest.raises(
        StreamingQueryException,
        match=r"sink 'memory' cannot take this stream: missing column\(s\) 'id', 'partition' of "
        r"\(id, partition, value\); column\(s\) 'timestamp' not in \(id, partition, value\)",
    ):
        query.awaitTermination(60)


@pytest.mark.parametrize(
    ("actual", "problems"),
    [
        (["id", "partition", "value"], ["column(s) 'value' not in (id, partition)"]),
        (["id"], ["missing column(s) 'partition' of (id, partition)"]),
        (["partition", "id"], ["columns in the order (partition, id), expected (id, partition)"]),
        (["id", "partition"], []),
    ],
)
def test_a_schema_that_does_not_fit_names_the_columns_missing_or_extra(
    actual: list[str], problems: list[str]
) -> None:
    expected = pa.schema([("id", pa.int64()), ("partition", pa.int32())])
    given = pa.schema(
        [
            (name, expected.field(name).type if name in expected.names else pa.string())
            for name in actual
        ]
    )
    assert schema_differences(expected, given) == problems


def test_a_write_task_ships_its_batches_compressed_and_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The commit message crosses the JVM on its way to the committing worker, copied several
    # times: its size is what a micro-batch waits for.
    monkeypatch.setattr(MemorySink, "as_distributed_commit", lambda self: None)
    batches = [ids_batch(0, 20_000), ids_batch(20_000, 5)]

    message = _ids_writer(tmp_path).write(iter(batches))

    assert isinstance(message, ArrowBatchesMessage)
    assert list(message.batches()) == batches
    assert len(message.payload) < sum(batch.nbytes for batch in batches) / 4


@pytest.fixture
def handoff_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The driver's hand-off directory, in the test's directory; the memory sink one-instance."""
    monkeypatch.setattr(MemorySink, "as_distributed_commit", lambda self: None)
    root = tmp_path / "handoff"
    monkeypatch.setattr(handoff, "default_root", lambda: root)
    return root


def test_a_write_task_on_the_drivers_machine_hands_its_batches_over_in_a_file(
    tmp_path: Path, handoff_root: Path, in_task: Callable[..., TaskContext]
) -> None:
    writer = _ids_writer(tmp_path)
    in_task(0, partition=0)
    first = writer.write(iter([ids_batch(0, 20_000), ids_batch(20_000, 5)]))
    in_task(0, partition=1)
    second = writer.write(iter([ids_batch(20_005, 3)]))
    in_task(0, partition=1, attempt=1)
    writer.write(iter([ids_batch(20_005, 3)]))  # an attempt Spark drops: its file is left
    TaskContext._setTaskContext(None)

    assert isinstance(first, HandedOffBatchesMessage)
    assert Path(first.path).parent == handoff_root / "query-q-1" / "batch-0"
    assert len(pickle.dumps(first)) < 500, "a file name, not data"
    assert first.rows == 20_005
    _ids_writer(tmp_path).commit([first, second], 0)

    assert sorted(MemorySink.committed_ids(tmp_path / "sink")) == list(range(20_008))
    assert committed_epochs(tmp_path) == ["epoch-0"]
    assert [p.name for p in handoff_root.iterdir()] == ["driver-token"], "every file removed"


def test_the_commit_runner_gets_a_writer_without_opening_the_sink(
    tmp_path: Path, handoff_root: Path, in_task: Callable[..., TaskContext], monkeypatch
) -> None:
    # Opening a sink there would fence the epoch writer's instance (a Kafka producer with the
    # same transactional id); the tasks' messages say which commit the micro-batch takes.
    message = _handed_off(tmp_path, in_task)
    opened: list[str] = []
    monkeypatch.setattr(datasource, "_checked_sink", lambda *args: opened.append("checked"))
    source = LaminarDataSource(_writer_options(tmp_path))
    schema = spark_schema(IDS_SCHEMA, "generator")
    runner = {"__name__": "pyspark.sql.worker.python_streaming_sink_runner"}
    exec("def call(function):\n    return function()", runner)

    writer = runner["call"](lambda: source.streamWriter(schema, overwrite=False))
    writer.commit([message], 0)

    assert opened == [], "the sink was opened to check it"
    assert sorted(MemorySink.committed_ids(tmp_path / "sink")) == list(range(5))


def test_a_write_task_that_does_not_see_the_drivers_token_sends_its_batches(
    tmp_path: Path, handoff_root: Path, in_task: Callable[..., TaskContext]
) -> None:
    writer = _ids_writer(tmp_path)
    (handoff_root / "driver-token").write_text("another machine's")  # what the task reads
    in_task(0, partition=0)

    message = writer.write(iter([ids_batch(0, 5)]))

    assert isinstance(message, ArrowBatchesMessage)
    assert list(message.batches()) == [ids_batch(0, 5)]


def _handed_off(tmp_path: Path, in_task: Callable[..., TaskContext]) -> HandedOffBatchesMessage:
    """What one write task of micro-batch 0 hands over: five ids, in a file."""
    in_task(0, partition=0)
    message = _ids_writer(tmp_path).write(iter([ids_batch(0, 5)]))
    TaskContext._setTaskContext(None)
    assert isinstance(message, HandedOffBatchesMessage)
    return message


def test_an_aborted_micro_batch_leaves_no_hand_off_file(
    tmp_path: Path, handoff_root: Path, in_task: Callable[..., TaskContext]
) -> None:
    message = _handed_off(tmp_path, in_task)

    _ids_writer(tmp_path).abort([message, None], 0)

    assert not Path(message.path).exists()
    assert MemorySink.committed_ids(tmp_path / "sink") == []


def test_a_commit_whose_hand_off_file_is_gone_fails_naming_it(
    tmp_path: Path, handoff_root: Path, in_task: Callable[..., TaskContext]
) -> None:
    message = _handed_off(tmp_path, in_task)
    other = _handed_off(tmp_path, in_task)
    Path(message.path).unlink()

    with pytest.raises(InvalidState, match="hand-off file .* is gone"):
        _ids_writer(tmp_path).commit([message, other], 0)
    assert MemorySink.committed_ids(tmp_path / "sink") == []
    assert not Path(other.path).exists(), "a failed commit removes its files too"


def test_a_task_that_cannot_write_its_hand_off_file_fails_naming_the_directory(
    tmp_path: Path, handoff_root: Path, in_task: Callable[..., TaskContext]
) -> None:
    writer = _ids_writer(tmp_path)
    (handoff_root / "query-q-1").write_text("")  # where the micro-batch's directory goes
    in_task(0, partition=0)

    with pytest.raises(WriteError, match=f"cannot hand micro-batch 0's records .* {handoff_root}"):
        writer.write(iter([ids_batch(0, 5)]))


def test_bridge_calls_in_a_worker_share_one_loop_and_leave_no_task_behind() -> None:
    # Spark calls the bridge once per micro-batch in the same Python worker: a new loop per
    # call started (and joined) new threads for every blocking store call each time.
    # (The pool may start a second thread when the first has not yet marked itself idle, so
    # the check is that the first call's thread outlives it, not that the second reuses it.)
    async def leave_a_task_behind() -> tuple[asyncio.Task[None], asyncio.AbstractEventLoop, int]:
        left = asyncio.create_task(asyncio.sleep(3600))
        thread = await asyncio.to_thread(threading.get_ident)
        return left, asyncio.get_running_loop(), thread

    first, first_loop, first_thread = run(leave_a_task_behind())
    second, second_loop, _ = run(leave_a_task_behind())

    assert first.cancelled()
    assert second.cancelled()
    assert first_loop is second_loop, "one loop per process"
    alive = {thread.ident for thread in threading.enumerate()}
    assert first_thread in alive, "the loop's worker thread is kept, not joined after the call"
