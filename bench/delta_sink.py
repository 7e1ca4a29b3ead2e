"""Throughput of laminar's ``delta`` sink on Spark against Delta's own Spark connector.

Both pipelines run in this process's Spark session (``local[2]``), from the same source rows —
laminar's ``generator`` (``format("laminar")``, two partitions, ``id int64, partition int32,
value double``) in micro-batches of ``--batch-rows`` rows — each into a new Delta table:

- **laminar**: ``writeStream.format("laminar")`` into the ``delta`` sink (plugins/delta),
  exactly once: Spark's write tasks write the Parquet data files in parallel (pyarrow's
  writer, each file fsynced) and the driver commits each micro-batch as one Delta transaction
  (delta-rs) recording it as the transaction version of the app id ``laminar-<sink.id>``;
- **delta-spark**: ``foreachBatch`` appending each micro-batch with Delta's own Spark connector
  (``df.write.format("delta")``, the JVM's Parquet writer), with Delta's idempotent-write
  options ``txnAppId`` and ``txnVersion`` (the micro-batch id): exactly once as well.

Delta's connector is the one ``plugins/delta/tests/delta_spark.py`` loads (its jars resolved
with ``mvn`` once into the laminar cache directory). Delta builds it for Spark 4.0 to 4.2; on
Spark 4.3 its idempotent append fails from the second micro-batch on (``NoSuchMethodError``
on ``LogicalRDD.<init>``, see that module), so on a Spark newer than Delta's newest build this
bench refuses to start unless ``--delta-writes plain`` (appends without ``txnAppId``: at
least once, and spared the look-up of the table's transaction versions) is given; run it under
PySpark 4.2 for the exactly-once comparison.

Delta's connector rebuilds the table's state (a Spark job) before each idempotent append, to
look up its transaction versions: the bench gives that job as many partitions as cores
(``spark.databricks.delta.snapshotPartitions``, ``--delta-snapshot-partitions``; Delta's
default, 50, makes each append about three times slower on ``local[2]``). Run it with the
JVM's default options: ``SPARK_SUBMIT_OPTS="-XX:TieredStopAtLevel=1"`` (the tests' setting)
slows Delta's writer, in the JVM, more than laminar's (1.5x against 1.3x in one run); the
header says what was set.

The bench first runs both pipelines once on a twentieth of the rows, untimed (JIT and Python
workers warm), then ``--repeat`` rounds of both in turn, the order alternating; each
pipeline's median counts. After each round both tables are read back with ``deltalake``: each
must hold every id exactly once, and record its last micro-batch as its transaction version.
Print the machine's load with the figures: a busy machine bends them.

Usage::

    python bench/delta_sink.py [--rows 4000000] [--batch-rows 1000000] [--repeat 3]
        [--partition-by partition] [--delta-writes idempotent|plain]
        [--delta-snapshot-partitions 2]

Prints each pipeline's median time and rows/s, where their micro-batches spent it (Spark's
phases), and the ratio. Target: the laminar pipeline >= 0.8x Delta's own connector.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pyarrow.compute as pc
import pyspark
from _rounds import Timing, median_rounds, timed_in_turn
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from laminar_sdk.spark import build_session

# Delta's Spark connector, as the delta plugin's tests load it (plugins/delta/tests).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins" / "delta" / "tests"))
from delta_spark import DELTA_VERSION, delta_session_conf, delta_spark_build

TARGET = 0.8
PARTITIONS = 2
SOURCE_BATCH_ROWS = "65536"  # rows per generator poll, as bench/spark_bridge.py's
SINK_ID = "bench"
DELTA_APP_ID = "bench-delta-spark"
SCHEMA = "id int64, partition int32, value double"
VARIANTS = ("laminar", "delta-spark")
SNAPSHOT_PARTITIONS = "spark.databricks.delta.snapshotPartitions"


def generated(spark: SparkSession, rows: int, batch_rows: int) -> DataFrame:
    """The generator's ``rows`` rows, ``batch_rows`` at most per micro-batch."""
    return (
        spark.readStream.format("laminar")
        .option("connector", "generator")
        .option("rows", str(rows // PARTITIONS))
        .option("partitions", str(PARTITIONS))
        .option("batch_size", SOURCE_BATCH_ROWS)
        .option("laminar.max.records.per.batch", str(batch_rows))
        .load()
    )


def laminar_pipeline(
    spark: SparkSession, rows: int, args: argparse.Namespace, table: Path, state: Path
) -> StreamingQuery:
    """The generator into the ``delta`` sink, exactly once."""
    partitioning = {"partition_by": args.partition_by} if args.partition_by else {}
    query = (
        generated(spark, rows, args.batch_rows)
        .writeStream.format("laminar")
        .option("connector", "delta")
        .option("path", str(table))
        .option("sink.id", SINK_ID)
        .option("schema", SCHEMA)
        .option("table.create", "true")
        .options(**partitioning)
        .option("laminar.delivery", "exactly-once")
        .option("checkpointLocation", str(state))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return query


def delta_spark_pipeline(
    spark: SparkSession, rows: int, args: argparse.Namespace, table: Path, state: Path
) -> StreamingQuery:
    """The generator into Delta's connector in ``foreachBatch`` (idempotent unless ``plain``)."""
    idempotent = args.delta_writes == "idempotent"

    def append(batch: DataFrame, batch_id: int) -> None:
        writer = batch.write.format("delta").mode("append")
        if args.partition_by:
            writer = writer.partitionBy(args.partition_by)
        if idempotent:
            writer = writer.option("txnAppId", DELTA_APP_ID).option("txnVersion", str(batch_id))
        writer.save(str(table))

    query = (
        generated(spark, rows, args.batch_rows)
        .writeStream.foreachBatch(append)
        .option("checkpointLocation", str(state))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return query


def check_table(name: str, table: Path, rows: int, app_id: str | None, last_batch: int) -> str:
    """What the table holds, in a line; exits unless every id is there once (and the txn)."""
    delta = DeltaTable(str(table))
    ids = delta.to_pyarrow_table(columns=["id"]).column("id")
    distinct = pc.count_distinct(ids).as_py()
    version = delta.transaction_version(app_id) if app_id else None
    line = (
        f"{name}: {len(ids):,} rows, {distinct:,} distinct ids, {len(delta.file_uris())} data "
        f"files, {delta.version() + 1} table versions"
        + (f", transaction version {version}" if app_id else "")
    )
    wrong_txn = app_id is not None and version != last_batch
    if len(ids) != rows or distinct != rows or wrong_txn:
        expected = f"{rows:,} rows, each id once" + (
            f", transaction version {last_batch}" if app_id else ""
        )
        raise SystemExit(f"FAILED: {line}; expected {expected}")
    return line


class Phases:
    """Spark's phases (``durationMs``) of each pipeline's micro-batches that read rows."""

    def __init__(self) -> None:
        self.ms: dict[str, dict[str, list[int]]] = {}
        self.batches: dict[str, int] = {}

    def record(self, name: str, query: StreamingQuery) -> int:
        """Keep ``query``'s phases; the id of its last micro-batch with rows."""
        with_rows = [p for p in query.recentProgress if p["numInputRows"]]
        for progress in with_rows:
            for phase, ms in progress["durationMs"].items():
                self.ms.setdefault(name, {}).setdefault(phase, []).append(int(ms))
        self.batches[name] = len(with_rows)
        return int(with_rows[-1]["batchId"]) if with_rows else -1

    def medians(self, name: str) -> str:
        """The median ms of each phase (``getBatch`` and tiny ones left out), longest first."""
        medians = {p: statistics.median(ms) for p, ms in self.ms.get(name, {}).items()}
        shown = sorted(
            ((p, ms) for p, ms in medians.items() if p != "getBatch" and ms >= 1),
            key=lambda item: -item[1],
        )
        return ", ".join(f"{phase} {ms:.0f}" for phase, ms in shown)


def run_round(
    spark: SparkSession,
    args: argparse.Namespace,
    rows: int,
    directory: Path,
    phases: Phases,
    *,
    first: int = 0,
    show: bool = False,
) -> dict[str, Timing]:
    """Both pipelines once, in turn starting with the ``first``-th; both tables checked.

    :param show: print what each table holds.
    """
    directory.mkdir(parents=True, exist_ok=True)
    last_batch: dict[str, int] = {}
    starts = {"laminar": laminar_pipeline, "delta-spark": delta_spark_pipeline}

    def pipeline(name: str) -> Callable[[], None]:
        def timed() -> None:
            query = starts[name](spark, rows, args, directory / name, directory / f"{name}-state")
            last_batch[name] = phases.record(name, query)

        return timed

    timings = timed_in_turn([(name, pipeline(name)) for name in VARIANTS], first)
    app_ids = {
        "laminar": f"laminar-{SINK_ID}",
        "delta-spark": DELTA_APP_ID if args.delta_writes == "idempotent" else None,
    }
    for name in VARIANTS:
        line = check_table(name, directory / name, rows, app_ids[name], last_batch[name])
        if show:
            print(f"  {line}", flush=True)
    return timings


def bench_session(snapshot_partitions: int) -> SparkSession:
    """``local[2]`` with Delta's connector (its jars, extension and catalog).

    :param snapshot_partitions: the partitions of Delta's state reconstruction (0: Delta's
        default, 50).
    """
    conf = {"spark.ui.showConsoleProgress": "false"}
    if snapshot_partitions:
        conf[SNAPSHOT_PARTITIONS] = str(snapshot_partitions)
    spark = build_session(**delta_session_conf(), **conf)
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main() -> None:
    """Parse the arguments, run the rounds, print every figure and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--batch-rows", type=int, default=1_000_000, help="per micro-batch")
    parser.add_argument("--repeat", type=int, default=3, help="timed rounds of both")
    parser.add_argument("--partition-by", default="", help="a column to partition both tables by")
    parser.add_argument(
        "--delta-snapshot-partitions",
        type=int,
        default=PARTITIONS,
        help="partitions of Delta's state reconstruction (default: as many as cores; 0: Delta's "
        "default, 50, three times slower per idempotent append on local[2])",
    )
    parser.add_argument(
        "--delta-writes",
        choices=("idempotent", "plain"),
        default="idempotent",
        help="Delta's appends with txnAppId/txnVersion (exactly once), or without them",
    )
    args = parser.parse_args()
    if min(args.rows, args.batch_rows, args.repeat) < 1 or args.rows % PARTITIONS:
        parser.error(f"--rows (a multiple of {PARTITIONS}), --batch-rows, --repeat: >= 1")
    build = delta_spark_build()
    spark_minor = ".".join(pyspark.__version__.split(".")[:2])
    if build != spark_minor and args.delta_writes == "idempotent":
        raise SystemExit(
            f"delta-spark {DELTA_VERSION} has no build for Spark {spark_minor}; its Spark {build} "
            f"build cannot make idempotent appends (txnAppId) on Spark {pyspark.__version__} "
            "(NoSuchMethodError on LogicalRDD.<init>; plugins/delta/tests/delta_spark.py). Run "
            f"this bench under PySpark {build} (pip install pyspark=={build}.0 delta-spark=="
            f"{DELTA_VERSION}), or pass --delta-writes plain to time Delta's appends without "
            "txnAppId (at least once)"
        )
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    work = Path(tempfile.mkdtemp(prefix="laminar-bench-delta-"))
    spark = bench_session(args.delta_snapshot_partitions)
    try:
        writes = (
            "idempotent (txnAppId/txnVersion)" if args.delta_writes == "idempotent" else "plain"
        )
        print(
            f"Spark {spark.version} on {spark.sparkContext.master}, {os.cpu_count()} cores; "
            f"delta-spark {DELTA_VERSION} (its Spark {build} build), {writes} appends, "
            f"{SNAPSHOT_PARTITIONS}={args.delta_snapshot_partitions or 'default'}; "
            f"{args.rows:,} rows in micro-batches of {args.batch_rows:,}"
            + (f", tables partitioned by {args.partition_by}" if args.partition_by else "")
            + f"; SPARK_SUBMIT_OPTS={os.environ.get('SPARK_SUBMIT_OPTS', '')!r}"
            + f"; load {os.getloadavg()}",
            flush=True,
        )
        if "TieredStopAtLevel=1" in os.environ.get("SPARK_SUBMIT_OPTS", ""):
            print(
                "note: the JVM compiles with C1 only (-XX:TieredStopAtLevel=1, the tests' setting),"
                " which slows Delta's writer more than laminar's; unset SPARK_SUBMIT_OPTS",
                flush=True,
            )
        warm_up = max(PARTITIONS, args.rows // 20 // PARTITIONS * PARTITIONS)
        print(f"warming up (untimed, {warm_up:,} rows)...", flush=True)
        saved, args.batch_rows = args.batch_rows, max(1, args.batch_rows // 20)
        run_round(spark, args, warm_up, work / "warm-up", Phases(), show=True)
        args.batch_rows = saved
        phases = Phases()
        seconds = median_rounds(
            lambda number, directory: run_round(
                spark, args, args.rows, directory, phases, first=number, show=number == 0
            ),
            args.repeat,
            work,
            args.rows,
        )
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"micro-batches per run: {phases.batches}")
    print("Spark's phases of the micro-batches, median ms (addBatch: the tasks and the commit):")
    for name in VARIANTS:
        print(f"{name:>12}: {phases.medians(name)}")
    ratio = seconds["delta-spark"] / seconds["laminar"]
    verdict = "met" if ratio >= TARGET else "MISSED"
    print(f"(load {os.getloadavg()})")
    print(
        f"laminar delta sink / Delta's Spark connector: {ratio:.2f}x "
        f"(target >= {TARGET}x: {verdict}; laminar exactly once, Delta {writes})"
    )


if __name__ == "__main__":
    main()
