"""The epoch writer's process and protocol, without Spark: what it commits, declines, skips.

A real writer process is started the way a write task starts it (:meth:`TaskStream.open`),
serving the ``memory`` sink; a ``sleep`` process stands in for Spark's JVM, whose end kills
the writer.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from spark_pipelines import ids_batch

from laminar_sdk._plugins.registry import ConnectorRole
from laminar_sdk._spark.epoch_writer import (
    TaskStream,
    WriterAddress,
    WriterStart,
    drop_epoch,
    finished_by_writer,
)
from laminar_sdk._spark.options import BridgeOptions, parse_options
from laminar_sdk.reference import IDS_SCHEMA, MemorySink

QUERY = "5f0c3a53-query"


class Writer:
    """How the tests reach one writer: its address, and what a task starts it with."""

    def __init__(self, root: Path, sink: Path, jvm: subprocess.Popen[bytes]) -> None:
        self.sink = sink
        self.jvm = jvm
        self.options = memory_options(root, sink)
        self.address = WriterAddress.of(str(root), QUERY, self.options)
        assert len(self.address.socket) > 108

    def stream(self, epoch: int, task: str, *firsts: int, close: bool = True) -> None:
        """Stream task ``task``'s share of ``epoch``: 10 ids from each of ``firsts``.

        As a write task does: each batch written to the task's file, and the writer told.
        """
        start = WriterStart(self.options, IDS_SCHEMA, QUERY, self.address.socket, self.jvm.pid)
        path = self.sink.parent / f"{task}-{epoch}.arrow"
        stream = TaskStream.open(self.address, start, epoch, task, path)
        assert stream is not None, "no writer started"
        with pa.OSFile(str(path), "wb") as file, pa.ipc.new_stream(file, IDS_SCHEMA) as ipc:
            for first in firsts:
                ipc.write_batch(ids_batch(first, 10))
                stream.written(file)
        if close:
            stream.close(10 * len(firsts))
        else:
            stream.abandon()


def memory_options(root: Path, sink: Path) -> BridgeOptions:
    return parse_options(
        {
            "connector": "memory",
            "path": str(sink),
            "checkpointLocation": str(root / "checkpoint"),
            "laminar.delivery": "exactly-once",
        },
        ConnectorRole.SINK,
    )


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[Writer]:
    # Longer than a Unix socket's address holds: the writer is reached all the same.
    root = tmp_path / ("hand-off-directory-" * 6)
    root.mkdir(mode=0o700)
    jvm = subprocess.Popen(["sleep", "600"])  # a stand-in for Spark's JVM
    yield Writer(root, tmp_path / "sink", jvm)
    jvm.kill()  # the writer dies with it
    jvm.wait()


def test_the_writer_commits_the_epoch_its_tasks_streamed(writer: Writer) -> None:
    writer.stream(0, "0-0-a", 0, 10)
    writer.stream(0, "1-0-b", 20)

    result = finished_by_writer(writer.address, 0, {"0-0-a": 20, "1-0-b": 10})

    assert result is not None
    assert (result.epoch, result.rows, result.skipped) == (0, 30, False)
    assert sorted(MemorySink.committed_ids(writer.sink)) == list(range(30))


def test_a_failed_attempt_makes_the_writer_roll_back_and_decline(writer: Writer) -> None:
    writer.stream(0, "0-0-a", 0, close=False)  # the attempt failed mid-write
    writer.stream(0, "0-1-b", 0, 10)  # its retry

    assert finished_by_writer(writer.address, 0, {"0-1-b": 20}) is None
    assert MemorySink.committed_ids(writer.sink) == []
    assert not list((writer.sink / "_staging").glob("epoch-0/*")), "the epoch was not rolled back"


def test_a_task_the_writer_never_took_makes_it_decline(writer: Writer) -> None:
    writer.stream(0, "0-0-a", 0)

    assert finished_by_writer(writer.address, 0, {"0-0-a": 10, "1-0-b": 10}) is None
    assert MemorySink.committed_ids(writer.sink) == []


def test_a_redelivered_epoch_is_skipped_and_the_next_one_committed(writer: Writer) -> None:
    writer.stream(0, "0-0-a", 0)
    assert finished_by_writer(writer.address, 0, {"0-0-a": 10}) is not None

    writer.stream(0, "0-0-c", 0)  # Spark runs micro-batch 0 again after a crash
    again = finished_by_writer(writer.address, 0, {"0-0-c": 10})
    writer.stream(1, "0-0-d", 10)
    following = finished_by_writer(writer.address, 1, {"0-0-d": 10})

    assert again is not None
    assert again.skipped
    assert following is not None
    assert not following.skipped
    assert sorted(MemorySink.committed_ids(writer.sink)) == list(range(20))


def test_an_aborted_epoch_is_rolled_back(writer: Writer) -> None:
    writer.stream(0, "0-0-a", 0)

    drop_epoch(writer.address, 0)

    assert finished_by_writer(writer.address, 0, {"0-0-a": 10}) is None, "the epoch was dropped"
    assert MemorySink.committed_ids(writer.sink) == []


def test_the_writer_dies_with_the_jvm_and_the_commit_runs_without_it(writer: Writer) -> None:
    writer.stream(0, "0-0-a", 0)

    writer.jvm.kill()
    writer.jvm.wait()

    assert finished_by_writer(writer.address, 0, {"0-0-a": 10}) is None
    assert MemorySink.committed_ids(writer.sink) == [], "a dead writer committed nothing"


def test_other_sink_options_reach_another_writer(tmp_path: Path) -> None:
    one = WriterAddress.of("/tmp/x", QUERY, memory_options(tmp_path, tmp_path / "a"))
    other = WriterAddress.of("/tmp/x", QUERY, memory_options(tmp_path, tmp_path / "b"))
    same = WriterAddress.of("/tmp/x", QUERY, memory_options(tmp_path, tmp_path / "a"))

    assert one != other
    assert one == same
