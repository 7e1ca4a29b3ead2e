"""Throughput of the Spark bridge against a hand-written Python data source and native Spark.

Three ways to move the same rows (``id: int64, partition: int32, value: double``) through Spark
on ``local[2]``, each timed from query start to end, in one run:

- laminar: ``generator`` source -> ``format("laminar")`` -> ``null`` sink, through the bridge
  (offsets in Spark's log, the epoch protocol and a manifest per micro-batch);
- hand-written: a minimal Spark Python streaming data source making the same Arrow batches,
  written by a minimal Arrow stream writer that only counts them;
- native: ``spark.range`` -> parquet, Spark's own code, no Python.

Usage: ``python bench/spark_bridge.py [--rows N] [--batch-rows N]``; prints rows/s and ratios.
Targets (issue 4): laminar >= 0.9x hand-written and >= 0.8x native.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from laminar_sdk.spark import build_session

SCHEMA = "id long, partition int, value double"


class _Range(InputPartition):
    def __init__(self, partition: int, start: int, end: int) -> None:
        self.partition, self.start, self.end = partition, start, end


class HandWrittenReader(DataSourceStreamReader):
    """Two partitions of consecutive rows, ``batch_rows`` per micro-batch."""

    def __init__(self, options: dict[str, str]) -> None:
        self.rows = int(options["rows"]) // 2
        self.batch_rows = int(options["batch_rows"]) // 2

    def initialOffset(self) -> dict[str, int]:
        return {"next": 0}

    def latestOffset(self) -> dict[str, int]:
        return {"next": self.rows}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[_Range]:
        return [
            _Range(p, s, min(s + self.batch_rows, end["next"]))
            for p in (0, 1)
            for s in range(start["next"], end["next"], self.batch_rows)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _Range)
        ids = pa.array(range(partition.start * 2 + partition.partition, partition.end * 2, 2))
        yield pa.record_batch(
            [ids, pa.array([partition.partition] * len(ids), pa.int32()), ids.cast(pa.float64())],
            names=["id", "partition", "value"],
        )


class CountingWriter(DataSourceStreamArrowWriter):
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        for _ in iterator:
            pass
        return WriterCommitMessage()

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        pass


class HandWritten(DataSource):
    @classmethod
    def name(cls) -> str:
        return "handwritten"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: StructType) -> HandWrittenReader:
        return HandWrittenReader(dict(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> CountingWriter:
        return CountingWriter()


def _timed(start: Callable[[], None]) -> float:
    began = time.perf_counter()
    start()
    return time.perf_counter() - began


def run(spark: SparkSession, rows: int, batch_rows: int, work: Path) -> dict[str, float]:
    spark.dataSource.register(HandWritten)

    def laminar() -> None:
        query = (
            spark.readStream.format("laminar")
            .option("connector", "generator")
            .options(rows=str(rows // 2), partitions="2", batch_size="65536")
            .option("laminar.max.records.per.batch", str(batch_rows))
            .load()
            .writeStream.format("laminar")
            .option("connector", "null")
            .option("checkpointLocation", str(work / "laminar"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    def hand_written() -> None:
        query = (
            spark.readStream.format("handwritten")
            .options(rows=str(rows), batch_rows=str(batch_rows))
            .load()
            .writeStream.format("handwritten")
            .option("checkpointLocation", str(work / "handwritten"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    def native() -> None:
        (
            spark.range(rows, numPartitions=2)
            .selectExpr("id", "cast(id % 2 as int) as partition", "cast(id as double) as value")
            .write.mode("overwrite")
            .parquet(str(work / "native"))
        )

    return {
        "laminar": _timed(laminar),
        "hand-written": _timed(hand_written),
        "native": _timed(native),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--batch-rows", type=int, default=1_000_000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="laminar-bench-"))
    spark = build_session(**{"spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    try:
        seconds = run(spark, args.rows, args.batch_rows, work)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    for name, elapsed in seconds.items():
        print(f"{name:>12}: {elapsed:7.2f} s  {args.rows / elapsed / 1e6:6.2f} M rows/s")
    versus_hand_written = seconds["hand-written"] / seconds["laminar"]
    print(f"laminar / hand-written: {versus_hand_written:.2f}x (target >= 0.9x)")
    print(f"laminar / native:       {seconds['native'] / seconds['laminar']:.2f}x (target >= 0.8x)")


if __name__ == "__main__":
    main()
