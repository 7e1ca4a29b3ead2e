"""The cost of the read log: a polled source through laminar, against the same polls unlogged.

A source that is not range-readable is polled once per micro-batch by Spark's planning process,
which writes the records to the read log (the laminar checkpoint location, here the ``file``
store on local disk, fsynced) before Spark records the micro-batch; the tasks then read the
log's slices. Until the read log, the bridge handed the polled records straight to Spark (a
``SimpleDataSourceStreamReader``: Spark keeps them in the driver's block manager, serves them
as one partition, and re-polls for a re-run — which is what broke exact replay). Both are
timed here, side by side in one run, reading the same ``generator`` rows (``id: int64,
partition: int32, value: double``) with the same ``poll_batch`` calls into Spark's ``noop``
sink:

- logged: ``format("laminar")`` with ``generator-polled`` — the reference generator without
  range reads, installed as a plugin the way a third-party polled source is;
- unlogged: a minimal Python data source whose ``SimpleDataSourceStreamReader`` opens the same
  generator through the SDK, restores it and polls it exactly as the bridge does, and returns
  the batches without logging them;
- ranges (for reference): ``format("laminar")`` with the range-readable ``generator``.

Each pipeline first runs once on a twentieth of the rows, untimed; then the three run in turn,
``--repeat`` times, and each one's median counts.

Usage: ``python bench/read_log.py [--rows N] [--batch-rows N] [--repeat N]``; prints every
time, rows/s and the ratio logged / unlogged.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
from _plugins import install_plugin
from _rounds import Timing, median_rounds, timed_in_turn
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from laminar_sdk import SourceCheckpoint, load_connector_registry
from laminar_sdk.spark import build_session

POLLED_PLUGIN = """
from laminar_sdk import hookimpl
from laminar_sdk.reference import GeneratorSource


class PolledGenerator(GeneratorSource):
    def as_range_readable(self):
        return None


@hookimpl
def laminar_register_connectors(registry):
    registry.add_source(
        "generator-polled", PolledGenerator, config_keys=GeneratorSource.CONFIG_KEYS
    )
"""


def install_polled_generator(site: Path) -> None:
    """Install ``generator-polled`` where this process and Spark's Python workers import from."""
    (site / "polled_generator.py").write_text(textwrap.dedent(POLLED_PLUGIN))
    install_plugin(site, "laminar-bench-polled", "polled_generator")


class UnloggedReader(SimpleDataSourceStreamReader, SupportsTriggerAvailableNow):
    """The generator polled as the bridge polls it, the records handed to Spark unlogged."""

    def __init__(self, options: dict[str, str]) -> None:
        self._properties = {key: options[key] for key in ("rows", "partitions", "batch_size")}
        self._max_records = int(options["max_records"])

    def initialOffset(self) -> dict[str, object]:
        return SourceCheckpoint().to_dict()

    def read(self, start: dict[str, object]) -> tuple[Iterator[pa.RecordBatch], dict[str, object]]:
        batches, end = asyncio.run(self._poll(SourceCheckpoint.from_dict(start)))
        return iter(batches), end.to_dict() if batches else start

    def readBetweenOffsets(self, start: dict, end: dict) -> Iterator[pa.RecordBatch]:
        raise AssertionError("no re-run in a benchmark")

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    async def _poll(self, start: SourceCheckpoint) -> tuple[list[pa.RecordBatch], SourceCheckpoint]:
        source, _ = await load_connector_registry().open_source("generator", self._properties)
        try:
            await source.restore(start)
            batches: list[pa.RecordBatch] = []
            remaining = self._max_records
            while remaining > 0:
                polled = await source.poll_batch(remaining)
                if polled is None or not polled.num_rows:
                    break
                batches.append(polled.records)
                remaining -= polled.num_rows
            return batches, source.checkpoint()
        finally:
            await source.close()


class Unlogged(DataSource):
    @classmethod
    def name(cls) -> str:
        return "unlogged"

    def schema(self) -> str:
        return "id long, partition int, value double"

    def simpleStreamReader(self, schema: StructType) -> UnloggedReader:
        return UnloggedReader(dict(self.options))


def run(
    spark: SparkSession, rows: int, batch_rows: int, work: Path, *, first: int = 0
) -> dict[str, Timing]:
    """Run the three pipelines once each; their timings, by name."""
    generator = {"rows": str(rows // 2), "partitions": "2", "batch_size": "65536"}

    def laminar(connector: str, name: str) -> Callable[[], None]:
        def pipeline() -> None:
            query = (
                spark.readStream.format("laminar")
                .option("connector", connector)
                .options(**generator)
                .option("laminar.max.records.per.batch", str(batch_rows))
                .option("checkpointLocation", str(work / name))
                .load()
                .writeStream.format("noop")
                .option("checkpointLocation", str(work / name))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()

        return pipeline

    def unlogged() -> None:
        query = (
            spark.readStream.format("unlogged")
            .options(**generator, max_records=str(batch_rows))
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", str(work / "unlogged"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    pipelines = [
        ("logged", laminar("generator-polled", "logged")),
        ("unlogged", unlogged),
        ("ranges", laminar("generator", "ranges")),
    ]
    return timed_in_turn(pipelines, first)


def main() -> None:
    """Parse the arguments, run the benchmark and print rows/s and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--batch-rows", type=int, default=500_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="laminar-bench-"))
    install_polled_generator(Path(tempfile.mkdtemp(prefix="site-", dir=work)))
    spark = build_session(**{"spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(Unlogged)
    print(
        f"{args.rows:,} rows, micro-batches of {args.batch_rows:,} rows, into noop, "
        f"on {spark.sparkContext.master}",
        flush=True,
    )
    try:
        run(spark, max(4, args.rows // 20), max(2, args.batch_rows // 20), work / "warmup")
        seconds = median_rounds(
            lambda number, directory: run(
                spark, args.rows, args.batch_rows, directory, first=number
            ),
            args.repeat,
            work,
            args.rows,
        )
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"logged / unlogged: {seconds['unlogged'] / seconds['logged']:.2f}x")


if __name__ == "__main__":
    main()
