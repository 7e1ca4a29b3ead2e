"""Throughput of the Spark bridge against a hand-written Python data source and native Spark.

Three ways to move the same rows (``id: int64, partition: int32, value: double``) through Spark
on ``local[2]`` into files, each timed from query start to end, in one run:

- laminar: ``generator`` source (two partitions) -> ``format("laminar")`` -> a laminar sink,
  through the bridge: offsets in Spark's log, partitions read in parallel tasks
  (``read_range``), each write task staging its share, one distributed commit per micro-batch
  with its manifest;
- hand-written: a minimal Spark Python streaming data source making the same Arrow batches in
  two partitions, and a minimal Arrow stream writer doing the sink's I/O: one file per task
  (parquet for ``files``, Arrow IPC for ``memory``, nothing for ``null``), moved into place at
  the commit;
- native: Spark's own ``rate-micro-batch`` source (two partitions, every row in one
  micro-batch) -> the same columns -> parquet, with a checkpoint location; no Python.

The sink (``--sink``) is ``files`` (the ``laminar-plugin-files`` sink, writing parquet) when that
plugin is installed, else ``memory`` (Arrow IPC files); ``null`` writes nothing (and is written
through the driver, as it is not a distributed-commit sink).

Each pipeline first runs once on a twentieth of the rows, untimed: the JVM's JIT and Spark's
Python workers (with the modules they import) are warm for all three when the timed runs start,
so none pays the session's start-up for the others. Then the three run in turn, ``--repeat``
times (each round starting with the next one), and each one's median time counts (a shared
machine's load comes and goes).

Usage: ``python bench/spark_bridge.py [--rows N] [--batch-rows N] [--sink files|memory|null]
[--repeat N]``; prints every time, rows/s and ratios. Targets (issue 4), at 10M rows: laminar
>= 0.9x hand-written and >= 0.8x native.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from _rounds import median_rounds, timed_in_turn
from pyspark import TaskContext
from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from laminar_sdk.spark import build_session

SCHEMA = "id long, partition int, value double"
ARROW_SCHEMA = pa.schema([("id", pa.int64()), ("partition", pa.int32()), ("value", pa.float64())])
"""The batches Spark exchanges for ``SCHEMA`` (every column nullable)."""
SINKS = ("files", "memory", "null")


@dataclass
class _Range(InputPartition):
    partition: int
    start: int
    end: int


class HandWrittenReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Two partitions of consecutive rows, at most ``batch_rows`` per micro-batch."""

    def __init__(self, options: dict[str, str]) -> None:
        self.rows = int(options["rows"]) // 2
        self.batch_size = int(options["batch_size"])
        self.batch_rows = int(options["batch_rows"])

    def initialOffset(self) -> dict[str, int]:
        return {"next": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.batch_rows)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        per_partition = self.rows
        if not isinstance(limit, ReadAllAvailable):
            assert isinstance(limit, ReadMaxRows)
            per_partition = limit.max_rows // 2
        return {"next": min(self.rows, start["next"] + per_partition)}

    def prepareForTriggerAvailableNow(self) -> None:
        pass  # every row is there from the start

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[_Range]:
        return [_Range(p, start["next"], end["next"]) for p in (0, 1) if end != start]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _Range)
        for first in range(partition.start, partition.end, self.batch_size):
            stop = min(partition.end, first + self.batch_size)
            ids = pa.array(range(first * 2 + partition.partition, stop * 2, 2), pa.int64())
            yield pa.RecordBatch.from_arrays(
                [
                    ids,
                    pa.repeat(pa.scalar(partition.partition, pa.int32()), len(ids)),
                    ids.cast(pa.float64()),
                ],
                schema=ARROW_SCHEMA,
            )


@dataclass(frozen=True)
class _Written(WriterCommitMessage):
    staged: str | None


class HandWrittenWriter(DataSourceStreamArrowWriter):
    """One file per task in a staging directory, moved into the output at the commit."""

    def __init__(self, sink: str, out: Path) -> None:
        self.sink = sink
        self.out = out

    def write(self, iterator: Iterator[pa.RecordBatch]) -> _Written:
        if self.sink == "null":
            for _ in iterator:
                pass
            return _Written(None)
        context = TaskContext.get()
        assert context is not None
        staging = self.out / "_staging"
        staging.mkdir(parents=True, exist_ok=True)
        path = staging / f"part-{context.partitionId()}-{uuid.uuid4().hex}.{self.sink}"
        if self.sink == "files":
            with pq.ParquetWriter(str(path), ARROW_SCHEMA) as parquet:
                for batch in iterator:
                    parquet.write_batch(batch)
        else:
            with pa.OSFile(str(path), "wb") as file, pa.ipc.new_file(file, ARROW_SCHEMA) as ipc:
                for batch in iterator:
                    ipc.write_batch(batch)
        return _Written(str(path))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        epoch = self.out / f"epoch-{batchId}"
        epoch.mkdir(parents=True, exist_ok=True)
        for message in messages:
            if isinstance(message, _Written) and message.staged is not None:
                os.replace(message.staged, epoch / Path(message.staged).name)


class HandWritten(DataSource):
    @classmethod
    def name(cls) -> str:
        return "handwritten"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: StructType) -> HandWrittenReader:
        return HandWrittenReader(dict(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> HandWrittenWriter:
        return HandWrittenWriter(self.options["sink"], Path(self.options["out"]))


def _laminar_sink_options(sink: str, out: Path) -> dict[str, str]:
    if sink == "files":
        return {"connector": "files", "path": str(out), "format": "parquet"}
    if sink == "memory":
        return {"connector": "memory", "path": str(out)}
    return {"connector": "null"}


def run(
    spark: SparkSession, rows: int, batch_rows: int, sink: str, work: Path, *, first: int = 0
) -> dict[str, float]:
    """Run the three pipelines once each, into ``work``; their wall-clock seconds, by name.

    :param first: which pipeline starts (the order rotates from run to run, so none is always
        the one after the machine's quietest or busiest moment).
    """
    spark.dataSource.register(HandWritten)
    batch_size = "65536"

    def laminar() -> None:
        query = (
            spark.readStream.format("laminar")
            .option("connector", "generator")
            .options(rows=str(rows // 2), partitions="2", batch_size=batch_size)
            .option("laminar.max.records.per.batch", str(batch_rows))
            .load()
            .writeStream.format("laminar")
            .options(**_laminar_sink_options(sink, work / "laminar-out"))
            .option("checkpointLocation", str(work / "laminar"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    def hand_written() -> None:
        query = (
            spark.readStream.format("handwritten")
            .options(rows=str(rows), batch_rows=str(batch_rows), batch_size=batch_size)
            .load()
            .writeStream.format("handwritten")
            .options(sink=sink, out=str(work / "handwritten-out"))
            .option("checkpointLocation", str(work / "handwritten"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    def native() -> None:
        query = (
            spark.readStream.format("rate-micro-batch")
            .options(rowsPerBatch=str(rows), numPartitions="2")
            .load()
            .selectExpr(
                "value as id",
                "cast(value % 2 as int) as partition",
                "cast(value as double) as value",
            )
            .writeStream.format("parquet")
            .option("path", str(work / "native-out"))
            .option("checkpointLocation", str(work / "native"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    pipelines = [("laminar", laminar), ("hand-written", hand_written), ("native", native)]
    return timed_in_turn(pipelines, first)


def main() -> None:
    """Parse the arguments, run the benchmark and print rows/s and ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--batch-rows", type=int, default=2_500_000)
    parser.add_argument("--repeat", type=int, default=3)
    files_installed = importlib.util.find_spec("laminar_plugin_files") is not None
    parser.add_argument("--sink", choices=SINKS, default="files" if files_installed else "memory")
    args = parser.parse_args()
    if args.sink == "files" and not files_installed:
        parser.error("--sink files needs the files plugin: pip install laminar-plugin-files")
    work = Path(tempfile.mkdtemp(prefix="laminar-bench-"))
    spark = build_session(**{"spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    print(
        f"{args.rows:,} rows, micro-batches of {args.batch_rows:,} rows, sink {args.sink}, "
        f"on {spark.sparkContext.master}",
        flush=True,
    )
    try:
        warmup = max(4, args.rows // 20)
        run(spark, warmup, max(2, args.batch_rows // 20), args.sink, work / "warmup")
        seconds = median_rounds(
            lambda number, directory: run(
                spark, args.rows, args.batch_rows, args.sink, directory, first=number
            ),
            args.repeat,
            work,
            args.rows,
        )
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    versus_hand_written = seconds["hand-written"] / seconds["laminar"]
    print(f"laminar / hand-written: {versus_hand_written:.2f}x (target >= 0.9x)")
    print(f"laminar / native:       {seconds['native'] / seconds['laminar']:.2f}x (target >= 0.8x)")


if __name__ == "__main__":
    main()
