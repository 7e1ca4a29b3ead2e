"""Laminar on Spark against hand-written Spark Python data sources, side by side in one run.

Every pipeline runs on ``local[2]`` in this process's Spark session, with laminar's *default*
options unless a bench says otherwise. The baselines are hand-written Spark Python data
sources (``_handwritten.py``): what a Spark user would write for the same job, doing the same
file I/O. Five benches (``--only`` picks some):

- ``basic`` (issue 22, target >= 0.9x): a plugin written to the *basic* contract
  (``basic_files.py``: a polled source reading Parquet files, no range reads) moving
  ``--basic-rows`` rows from its files to its files, exactly once, (a) into its one-instance
  sink and (b) into its distributed-commit sink, against ``handwritten-parquet``: one task per
  source partition reading the same files, a task per write partition staging a Parquet file,
  renamed at the commit; with the median of Spark's phases of each pipeline's micro-batches
  (``latestOffset`` is a polled source's planning pass, ``addBatch`` the tasks and the commit);
- ``reads`` (issues 22 and 39, target >= 0.95x): laminar's ``generator`` (two partitions) into
  Spark's ``noop`` sink, against a minimal hand-written reader making the same Arrow columns
  (int64, int32, double) in two partitions; Spark's native ``rate-micro-batch`` printed for
  reference; then the same with short queries of ``--short-read-rows`` rows, whose time is
  mostly each query's fixed cost (finding, creating and planning the data source), printed
  as a ratio of its own;
- ``latency`` (issue 22, target: at most +50 ms at p50): the fixed cost of a micro-batch. A
  query of the ``basic`` pipelines runs continuously; one 1-row Parquet file at a time is
  added to the source directory and timed until its row is visible in the sink's published
  output (p50 and p95 of ``--latency-samples`` rows over ``--latency-rounds`` queries of
  each variant, in turn), with the median of Spark's phases of those micro-batches;
- ``memory`` (issue 22, target < 1 GiB): peak RSS of every Python process of the query while
  one micro-batch of ``--memory-bytes`` (4 GiB of 1 KiB rows by default, with
  ``laminar.max.bytes.per.batch`` raised to fit) goes through a one-instance sink that only
  counts (``bench-payload``),
  then how a backlog of ``--backlog-bytes`` of a polled source splits into micro-batches under
  the default byte budget;
- ``ranges`` (issue 4, target >= 0.9x hand-written): the range-readable ``generator`` into the
  distributed-commit ``files`` sink (Parquet), against the hand-written reader and writer; and
  native ``rate-micro-batch`` -> Parquet for reference.

The throughput benches first run every pipeline once on a twentieth of the rows, untimed (JIT
and Python workers warm), then ``--repeat`` rounds of all of them in turn, the order rotating;
each pipeline's median counts. Print the machine's load with the figures: they are ratios
measured side by side, but a busy machine still bends them.

Usage: ``python bench/spark_bridge.py [--only basic,reads,latency,memory,ranges] [--repeat N]
[--basic-rows N] [--read-rows N] [--short-read-rows N] [--range-rows N] [--latency-samples N]
[--latency-rounds N] [--memory-bytes SIZE] [--backlog-bytes SIZE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from _handwritten import HandWritten, HandWrittenParquet
from _memory import PeakRss, print_peaks
from _plugins import install_plugin
from _rounds import Timing, median_rounds, timed_in_turn
from basic_files import PARTITION_PREFIX, SCHEMA
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import DataStreamWriter
from pyspark.sql.streaming.query import StreamingQuery

from laminar_sdk.spark import build_session

BENCHES = ("basic", "reads", "latency", "memory", "ranges")
RATIO_TARGET = 0.9
READS_RATIO_TARGET = 0.95
LATENCY_TARGET_S = 0.050
RSS_TARGET_BYTES = 1 << 30
GENERATED_BATCH_ROWS = "65536"
FILES_PER_PARTITION = 6


@dataclass
class Outcome:
    """What one bench measured against its target, for the summary at the end."""

    lines: list[str] = field(default_factory=list)

    def ratio(self, what: str, value: float, target: float = RATIO_TARGET) -> None:
        verdict = "met" if value >= target else "MISSED"
        self.lines.append(f"{what}: {value:.2f}x (target >= {target}x: {verdict})")


def parse_size(text: str) -> int:
    """``4g``, ``512m``, ``100k`` or a byte count, in binary units."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    text = text.strip().lower()
    if text[-1:] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def write_parquet_input(directory: Path, rows: int, *, partitions: int = 2) -> int:
    """About ``rows`` rows in ``partitions`` source partitions of the ``bench-parquet`` layout.

    :returns: how many rows were written (a multiple of the files written).
    """
    per_file = max(1, rows // partitions // FILES_PER_PARTITION)
    next_id = 0
    for partition in range(partitions):
        part = directory / f"{PARTITION_PREFIX}{partition}"
        part.mkdir(parents=True)
        for number in range(FILES_PER_PARTITION):
            ids = pa.array(range(next_id, next_id + per_file), pa.int64())
            next_id += per_file
            columns = [ids, pa.repeat(pa.scalar(partition, pa.int32()), per_file), ids.cast("f8")]
            pq.write_table(pa.table(columns, schema=SCHEMA), part / f"{number:06d}.parquet")
    return next_id


def published_rows(directory: Path) -> int:
    """Rows in the Parquet files a sink published (its staging left out)."""
    return sum(
        pq.ParquetFile(path).metadata.num_rows
        for path in directory.rglob("*.parquet")
        if "_staging" not in path.parts
    )


def _end_offset(progress: Any) -> dict[str, Any]:  # noqa: ANN401 - Spark's progress object
    """The end offset of a micro-batch's (only) source, from Spark's progress report."""
    offset = progress["sources"][0]["endOffset"]
    return json.loads(offset) if isinstance(offset, str) else dict(offset)


def finish(query: StreamingQuery) -> int:
    """Wait for an available-now query; how many micro-batches it ran."""
    query.awaitTermination()
    return len({progress["batchId"] for progress in query.recentProgress})


class Phases:
    """Spark's phases (``durationMs``) of the micro-batches that read rows, per pipeline."""

    def __init__(self) -> None:
        self._ms: dict[str, dict[str, list[int]]] = {}

    def record(self, name: str, query: StreamingQuery, last: int | None = None) -> None:
        """Keep the phases of ``query``'s micro-batches with rows (its ``last`` ones only)."""
        with_rows = [p for p in query.recentProgress if p["numInputRows"]]
        for progress in with_rows[-last:] if last else with_rows:
            for phase, ms in progress["durationMs"].items():
                self._ms.setdefault(name, {}).setdefault(phase, []).append(int(ms))

    def medians(self, name: str) -> str:
        """The median of each phase ``name`` went through, in ms (``getBatch`` left out)."""
        return ", ".join(
            f"{phase} {statistics.median(ms):.0f}"
            for phase, ms in sorted(self._ms.get(name, {}).items())
            if phase != "getBatch"
        )


def laminar_query(
    spark: SparkSession,
    source: dict[str, str],
    sink: dict[str, str] | None,
    checkpoint: Path,
    **sdk: str,
) -> StreamingQuery:
    """``format("laminar")`` from ``source`` to ``sink`` (a laminar connector; None: noop)."""
    stream = (
        spark.readStream.format("laminar")
        .options(**source)
        .option("checkpointLocation", str(checkpoint))
        .options(**{f"laminar.{key.replace('_', '.')}": value for key, value in sdk.items()})
        .load()
    )
    writer = (
        stream.writeStream.format("noop")
        if sink is None
        else stream.writeStream.format("laminar").options(**sink)
    )
    return writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()


# -- (a) basic contract ------------------------------------------------------------------------


def bench_basic(spark: SparkSession, args: argparse.Namespace, work: Path) -> Outcome:
    """Basic-contract plugin, Parquet to Parquet, exactly once, against the hand-written one."""
    print(f"\n== basic: {args.basic_rows:,} rows, Parquet files -> Parquet files", flush=True)
    batches: dict[str, int] = {}
    slices: dict[str, list[int]] = {}
    phases = Phases()

    def run(rows: int, directory: Path, first: int = 0) -> dict[str, Timing]:
        source = directory / "input"
        rows = write_parquet_input(source, rows)
        laminar_in = {"connector": "bench-parquet", "path": str(source)}

        def laminar(sink: str, *, epoch_writer: bool = True) -> Callable[[], None]:
            name = sink if epoch_writer else f"{sink}, no epoch writer"

            def pipeline() -> None:
                out = directory / name
                options = {"connector": sink, "path": str(out), "laminar.delivery": "exactly-once"}
                options["laminar.epoch.writer"] = str(epoch_writer).lower()
                query = laminar_query(spark, laminar_in, options, directory / f"{name}-checkpoint")
                batches[name] = finish(query)
                phases.record(name, query)
                slices[name] = [
                    len(_end_offset(progress)["read_log"]["slices"])
                    for progress in query.recentProgress
                    if progress["numInputRows"]
                ]
                assert published_rows(out) == rows, f"{name}: {published_rows(out)} != {rows}"

            return pipeline

        def hand_written() -> None:
            out = directory / "handwritten"
            query = (
                spark.readStream.format("handwritten-parquet")
                .option("path", str(source))
                .load()
                .writeStream.format("handwritten-parquet")
                .options(format="parquet", out=str(out))
                .option("checkpointLocation", str(directory / "handwritten-checkpoint"))
                .trigger(availableNow=True)
                .start()
            )
            batches["hand-written"] = finish(query)
            phases.record("hand-written", query)
            assert published_rows(out) == rows

        pipelines = [
            ("laminar, one-instance sink", laminar("bench-parquet")),
            (
                "laminar, one-instance sink, no epoch writer",
                laminar("bench-parquet", epoch_writer=False),
            ),
            ("laminar, distributed sink", laminar("bench-parquet-staged")),
            ("hand-written", hand_written),
        ]
        return timed_in_turn(pipelines, first)

    run(max(6, args.basic_rows // 20), work / "warm-up")
    seconds = median_rounds(
        lambda number, directory: run(args.basic_rows, directory, number),
        args.repeat,
        work,
        args.basic_rows,
    )
    print(f"micro-batches per run: {batches}; read-log slices (tasks) of each: {slices}")
    print("Spark's phases of the micro-batches with rows (warm-up included), median ms:")
    for name in batches:
        print(f"{name:>28}: {phases.medians(name)}")
    outcome = Outcome()
    baseline = seconds["hand-written"]
    outcome.ratio(
        "basic, one-instance sink / hand-written", baseline / seconds["laminar, one-instance sink"]
    )
    outcome.ratio(
        "basic, one-instance sink without the epoch writer / hand-written",
        baseline / seconds["laminar, one-instance sink, no epoch writer"],
    )
    outcome.ratio(
        "basic, distributed sink / hand-written", baseline / seconds["laminar, distributed sink"]
    )
    return outcome


# -- (b) reads -----------------------------------------------------------------------------------


def bench_reads(spark: SparkSession, args: argparse.Namespace, work: Path) -> Outcome:
    """``generator`` into ``noop`` against a hand-written Arrow reader, and native Spark."""
    print(f"\n== reads: {args.read_rows:,} rows into noop, default options", flush=True)

    def run(rows: int, directory: Path, first: int = 0) -> dict[str, Timing]:
        def laminar() -> None:
            generator = {"connector": "generator", "rows": str(rows // 2), "partitions": "2"}
            generator["batch_size"] = GENERATED_BATCH_ROWS
            finish(laminar_query(spark, generator, None, directory / "laminar"))

        def hand_written() -> None:
            query = (
                spark.readStream.format("handwritten")
                .options(rows=str(rows), batch_size=GENERATED_BATCH_ROWS)
                .load()
                .writeStream.format("noop")
                .option("checkpointLocation", str(directory / "handwritten"))
                .trigger(availableNow=True)
                .start()
            )
            finish(query)

        def native() -> None:
            query = (
                _native_rows(spark, rows)
                .writeStream.format("noop")
                .option("checkpointLocation", str(directory / "native"))
                .trigger(availableNow=True)
                .start()
            )
            finish(query)

        pipelines = [("laminar", laminar), ("hand-written", hand_written), ("native", native)]
        return timed_in_turn(pipelines, first)

    run(max(4, args.read_rows // 20), work / "warm-up")
    seconds = median_rounds(
        lambda number, directory: run(args.read_rows, directory, number),
        args.repeat,
        work,
        args.read_rows,
    )
    outcome = Outcome()
    outcome.ratio(
        "reads, generator / hand-written",
        seconds["hand-written"] / seconds["laminar"],
        READS_RATIO_TARGET,
    )
    outcome.lines.append(
        f"reads, for reference: laminar / native {seconds['native'] / seconds['laminar']:.2f}x, "
        f"hand-written / native {seconds['native'] / seconds['hand-written']:.2f}x"
    )
    print(f"\n== reads, short queries: {args.short_read_rows:,} rows each", flush=True)
    short = median_rounds(
        lambda number, directory: run(args.short_read_rows, directory, number),
        args.repeat,
        work / "short",
        args.short_read_rows,
    )
    outcome.ratio(
        f"reads, {args.short_read_rows:,}-row queries, generator / hand-written",
        short["hand-written"] / short["laminar"],
        READS_RATIO_TARGET,
    )
    return outcome


def _native_rows(spark: SparkSession, rows: int) -> DataFrame:
    return (
        spark.readStream.format("rate-micro-batch")
        .options(rowsPerBatch=str(rows), numPartitions="2")
        .load()
        .selectExpr(
            "value as id", "cast(value % 2 as int) as partition", "cast(value as double) as value"
        )
    )


# -- (c) fixed cost ------------------------------------------------------------------------------


def bench_latency(spark: SparkSession, args: argparse.Namespace, work: Path) -> Outcome:
    """End-to-end latency of 1-row micro-batches: file in the source -> row published."""
    print(
        f"\n== latency: {args.latency_samples} 1-row micro-batches per variant, "
        "Parquet file added -> its row published",
        flush=True,
    )
    variants: dict[str, Callable[[Path, Path, Path], StreamingQuery]] = {
        "laminar, one-instance sink": lambda source, out, checkpoint: _continuous(
            spark.readStream.format("laminar")
            .options(connector="bench-parquet", path=str(source))
            .option("checkpointLocation", str(checkpoint))
            .load()
            .writeStream.format("laminar")
            .options(connector="bench-parquet", path=str(out))
            .option("laminar.delivery", "exactly-once"),
            checkpoint,
        ),
        "hand-written": lambda source, out, checkpoint: _continuous(
            spark.readStream.format("handwritten-parquet")
            .option("path", str(source))
            .load()
            .writeStream.format("handwritten-parquet")
            .options(format="parquet", out=str(out)),
            checkpoint,
        ),
    }
    samples: dict[str, list[float]] = {name: [] for name in variants}
    phases = Phases()
    per_round = max(1, -(-args.latency_samples // args.latency_rounds))
    for number in range(args.latency_rounds + 1):  # round 0 warms up, untimed
        names = list(variants)
        for name in names[number % 2 :] + names[: number % 2]:
            directory = work / f"{number}-{name.split(',')[0]}"
            source, out = directory / "input", directory / "out"
            rows = write_parquet_input(source, 2)
            query = variants[name](source, out, directory / "checkpoint")
            try:
                _wait_published(out, rows, query)
                taken = [_one_row_latency(source, out, query, n) for n in range(per_round)]
                _wait_idle(query)
            finally:
                query.stop()
            if number:
                samples[name] += taken
                phases.record(name, query, last=per_round)
            shutil.rmtree(directory, ignore_errors=True)
    outcome = Outcome()
    medians = {}
    for name, taken in samples.items():
        p50, p95 = statistics.median(taken), statistics.quantiles(taken, n=20)[-1]
        medians[name] = p50
        print(
            f"{name:>28}: p50 {p50 * 1000:6.0f} ms  p95 {p95 * 1000:6.0f} ms  ({len(taken)} rows)"
        )
        print(f"{'':>28}  Spark's phases of those micro-batches, median ms: {phases.medians(name)}")
    extra = medians["laminar, one-instance sink"] - medians["hand-written"]
    verdict = "met" if extra <= LATENCY_TARGET_S else "MISSED"
    outcome.lines.append(
        f"latency, laminar - hand-written at p50: {extra * 1000:+.0f} ms "
        f"(target <= +{LATENCY_TARGET_S * 1000:.0f} ms: {verdict})"
    )
    return outcome


def _continuous(writer: DataStreamWriter, checkpoint: Path) -> StreamingQuery:
    return writer.option("checkpointLocation", str(checkpoint)).start()


def _one_row_latency(source: Path, out: Path, query: StreamingQuery, number: int) -> float:
    """Add one 1-row file to partition 0, and time until its row is published."""
    time.sleep(random.uniform(0.05, 0.15))  # noqa: S311 - not in step with Spark's polling
    before = published_rows(out)
    staged = source / f"new-{number}.tmp"
    row_id = 1_000_000_000 + number
    columns = [pa.array([row_id], pa.int64()), pa.array([0], pa.int32()), pa.array([0.0])]
    pq.write_table(pa.table(columns, schema=SCHEMA), staged)
    began = time.perf_counter()
    os.replace(staged, source / f"{PARTITION_PREFIX}0" / f"{100_000 + number:06d}.parquet")
    _wait_published(out, before + 1, query)
    return time.perf_counter() - began


def _wait_idle(query: StreamingQuery, timeout_s: float = 30) -> None:
    """Wait for the micro-batch that published the last row to end (Spark's commit log)."""
    deadline = time.monotonic() + timeout_s
    while query.status["isTriggerActive"] and time.monotonic() < deadline:
        time.sleep(0.01)


def _wait_published(out: Path, rows: int, query: StreamingQuery, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while published_rows(out) < rows if out.exists() else True:
        if query.exception() is not None:
            raise RuntimeError(f"the query failed: {query.exception()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{rows} rows not published in {out} after {timeout_s} s")
        time.sleep(0.002)


# -- (d) memory ---------------------------------------------------------------------------------


def bench_memory(spark: SparkSession, args: argparse.Namespace, work: Path) -> Outcome:
    """Peak RSS of a huge micro-batch through a one-instance sink; a backlog in byte budgets."""
    row_bytes = 1024  # in Arrow: the id (8 bytes), the payload's offset (4) and its bytes
    rows = args.memory_bytes // row_bytes
    print(
        f"\n== memory: one micro-batch of {args.memory_bytes / 2**30:.1f} GiB "
        f"({rows:,} rows of {row_bytes} B) into a one-instance sink (bench-payload)",
        flush=True,
    )
    payload = {"connector": "bench-payload", "rows": str(rows // 2), "partitions": "2"}
    with PeakRss() as rss:
        began = time.perf_counter()
        query = laminar_query(
            spark,
            payload | {"payload_bytes": str(row_bytes - 12)},
            {"connector": "bench-payload", "path": str(work / "counts.jsonl")},
            work / "huge",
            max_bytes_per_batch=str(args.memory_bytes + (1 << 20)),
        )
        micro_batches = finish(query)
        elapsed = time.perf_counter() - began
    counts = [json.loads(line) for line in (work / "counts.jsonl").read_text().splitlines()]
    assert sum(count["rows"] for count in counts) == rows // 2 * 2, counts
    counted = ", ".join(f"{c['rows']:,} rows ({c['bytes'] / 2**30:.2f} GiB)" for c in counts)
    print(f"{micro_batches} micro-batch(es) in {elapsed:.1f} s, the sink counted {counted}")
    print("peak RSS by process:")
    print_peaks(rss)
    worst = max(rss.by_role().values())
    outcome = Outcome()
    verdict = "met" if worst < RSS_TARGET_BYTES else "MISSED"
    outcome.lines.append(
        f"memory, {args.memory_bytes / 2**30:.1f} GiB micro-batch: the largest Python process "
        f"peaked at {worst / 2**20:.0f} MiB (target < 1024 MiB: {verdict})"
    )
    backlog_rows = args.backlog_bytes // row_bytes
    print(
        f"a polled source's backlog of {args.backlog_bytes / 2**30:.1f} GiB "
        f"({backlog_rows:,} rows) into noop, default options",
        flush=True,
    )
    polled = payload | {
        "connector": "bench-payload-polled",
        "rows": str(backlog_rows // 2),
        "payload_bytes": str(row_bytes - 12),
    }
    with PeakRss() as rss:
        began = time.perf_counter()
        query = laminar_query(spark, polled, None, work / "backlog")
        query.awaitTermination()
        elapsed = time.perf_counter() - began
    sizes = [p["numInputRows"] * row_bytes for p in query.recentProgress if p["numInputRows"]]
    print(
        f"{len(sizes)} micro-batches in {elapsed:.1f} s, the largest {max(sizes) / 2**20:.1f} "
        "MiB; peak RSS:"
    )
    print_peaks(rss)
    outcome.lines.append(
        f"memory, {args.backlog_bytes / 2**30:.1f} GiB backlog: {len(sizes)} micro-batches of "
        f"at most {max(sizes) / 2**20:.0f} MiB"
    )
    return outcome


# -- issue 4: range reads and distributed commit ------------------------------------------------


def bench_ranges(spark: SparkSession, args: argparse.Namespace, work: Path) -> Outcome:
    """``generator`` -> ``files`` (range reads, distributed commit) against hand-written."""
    print(f"\n== ranges: {args.range_rows:,} rows, generator -> files (Parquet)", flush=True)

    def run(rows: int, directory: Path, first: int = 0) -> dict[str, Timing]:
        def laminar() -> None:
            generator = {"connector": "generator", "rows": str(rows // 2), "partitions": "2"}
            generator["batch_size"] = GENERATED_BATCH_ROWS
            files = {"connector": "files", "path": str(directory / "laminar-out")}
            finish(laminar_query(spark, generator, files | {"format": "parquet"}, directory / "l"))

        def hand_written() -> None:
            query = (
                spark.readStream.format("handwritten")
                .options(rows=str(rows), batch_size=GENERATED_BATCH_ROWS)
                .load()
                .writeStream.format("handwritten")
                .options(format="parquet", out=str(directory / "handwritten-out"))
                .option("checkpointLocation", str(directory / "handwritten"))
                .trigger(availableNow=True)
                .start()
            )
            finish(query)

        def native() -> None:
            query = (
                _native_rows(spark, rows)
                .writeStream.format("parquet")
                .option("path", str(directory / "native-out"))
                .option("checkpointLocation", str(directory / "native"))
                .trigger(availableNow=True)
                .start()
            )
            finish(query)

        pipelines = [("laminar", laminar), ("hand-written", hand_written), ("native", native)]
        return timed_in_turn(pipelines, first)

    run(max(4, args.range_rows // 20), work / "warm-up")
    seconds = median_rounds(
        lambda number, directory: run(args.range_rows, directory, number),
        args.repeat,
        work,
        args.range_rows,
    )
    outcome = Outcome()
    outcome.ratio(
        "ranges, generator -> files / hand-written", seconds["hand-written"] / seconds["laminar"]
    )
    outcome.lines.append(
        f"ranges, for reference: laminar / native {seconds['native'] / seconds['laminar']:.2f}x"
    )
    return outcome


RUNNERS: dict[str, Callable[[SparkSession, argparse.Namespace, Path], Outcome]] = {
    "basic": bench_basic,
    "reads": bench_reads,
    "latency": bench_latency,
    "memory": bench_memory,
    "ranges": bench_ranges,
}


@contextmanager
def bench_session(work: Path) -> Iterator[SparkSession]:
    """The benchmarks' plugins installed, the hand-written sources registered, a session."""
    install_plugin(work / "site", "laminar-bench-files", "basic_files")
    install_plugin(work / "site", "laminar-bench-payload", "payload_source")
    spark = build_session(**{"spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(HandWritten)
    spark.dataSource.register(HandWrittenParquet)
    try:
        yield spark
    finally:
        spark.stop()


def main() -> None:
    """Parse the arguments, run the benches and print every figure and ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(BENCHES), help="comma-separated benches")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--basic-rows", type=int, default=6_000_000)
    parser.add_argument("--read-rows", type=int, default=4_000_000)
    parser.add_argument("--short-read-rows", type=int, default=10_000)
    parser.add_argument("--range-rows", type=int, default=10_000_000)
    parser.add_argument("--latency-samples", type=int, default=48)
    parser.add_argument("--latency-rounds", type=int, default=8, help="queries per variant")
    parser.add_argument("--memory-bytes", type=parse_size, default=parse_size("4g"))
    parser.add_argument("--backlog-bytes", type=parse_size, default=parse_size("2g"))
    args = parser.parse_args()
    chosen = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(BENCHES))
    if unknown:
        parser.error(f"--only: unknown bench(es) {unknown}; choose from {', '.join(BENCHES)}")
    work = Path(tempfile.mkdtemp(prefix="laminar-bench-"))
    summary: list[str] = []
    try:
        with bench_session(work) as spark:
            print(f"on {spark.sparkContext.master}; load {os.getloadavg()}", flush=True)
            for name in chosen:
                summary += RUNNERS[name](spark, args, work / name).lines
                print(f"(load {os.getloadavg()})", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n== summary")
    for line in summary:
        print(line)


if __name__ == "__main__":
    main()
