"""Throughput of laminar's PostgreSQL sink and keyset source against Spark's own JDBC.

One run starts a PostgreSQL server (``laminar_conformance.services.postgres_service()``: the
server named by ``LAMINAR_POSTGRES_DSN``, else a throw-away local cluster — ``fsync=off``, the
same for every variant), fetches the PostgreSQL JDBC driver from Maven Central with ``mvn``,
and times, in one Spark session (``local[2]``), all in this run:

- **laminar sink**: the ``generator`` source (``format("laminar")``) → the ``postgres`` sink,
  exactly once (``mode=append``: ``COPY`` and a marker row per micro-batch, in the driver);
- **laminar sink, two-phase**: the same into the ``postgres-2pc`` sink (each write task
  prepares its share; the driver commits them), for reference;
- **Spark JDBC**: the same ``generator`` stream → ``foreachBatch`` + ``df.write.jdbc`` (batched
  ``INSERT``s, at least once) into an identical table;
- **laminar keyset source**: the ``postgres`` source (range partitions, read in parallel
  tasks) → Spark's ``noop`` sink, one micro-batch;
- **spark.read.jdbc**: a partitioned batch read of the same table (``partitionColumn``,
  ``lowerBound``, ``upperBound``, ``numPartitions``) → ``noop``;
- for reference, what the SDK's Spark bridge costs without PostgreSQL: the ``generator`` into
  the SDK's ``null`` sink (the one-process commit path the ``append`` mode takes), and into
  Spark's ``noop`` sink (a Python source read in parallel tasks).

Each sink variant writes ``--rows`` rows (``id int64, partition int32, value double``) in
micro-batches of ``--batch-rows``, into an empty table, after an untimed warm-up of
``--warm-up`` rows (JVM and Python workers started); every table is counted afterwards (the
laminar ones must hold every id exactly once, else the run fails). The read variants each read
the laminar sink's table twice, the faster run counting.

Usage::

    python bench/postgres_sink.py [--rows 5000000] [--batch-rows 1000000] [--partitions 2]
        [--warm-up 200000] [--jdbc-version 42.7.4]
        [--variants sink,two-phase,jdbc-sink,source,jdbc-read,bridge]

``--variants`` runs only those named (the read variants then read a table filled in SQL).
Prints each variant's time and rows/s, and the ratios. Targets (issue 39): each laminar sink,
exactly once, >= 2.5x Spark's JDBC writer; the keyset source >= 1.0x ``spark.read.jdbc``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from laminar_conformance.services import postgres_service, resolve_maven_jars
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import DataStreamReader

from laminar_sdk.spark import build_session

COLUMNS = "id bigint, partition integer, value double precision"


def jdbc_jar(version: str) -> str:
    libs = resolve_maven_jars(
        [f"org.postgresql:postgresql:{version}"],
        f"postgresql-jdbc/{version}",
        what=f"the PostgreSQL JDBC driver {version}",
    )
    return str(next(libs.glob("postgresql-*.jar")))


class Server:
    """The benchmark's server: its dsn, password, and a connection for setup and counts."""

    def __init__(self, dsn: str, password_file: Path | None) -> None:
        self.dsn = dsn
        self.password_file = password_file
        self.password = password_file.read_text().strip() if password_file else None
        self.connection = psycopg.connect(dsn, password=self.password, autocommit=True)

    def connector_options(self) -> dict[str, str]:
        options = {"dsn": self.dsn}
        if self.password_file is not None:
            options["password.file"] = str(self.password_file)
        return options

    def jdbc(self) -> tuple[str, dict[str, str]]:
        parts = conninfo_to_dict(self.dsn)
        url = f"jdbc:postgresql://{parts.get('host', 'localhost')}:{parts.get('port', 5432)}/"
        url += str(parts.get("dbname", "postgres"))
        properties = {"user": str(parts.get("user", "")), "driver": "org.postgresql.Driver"}
        if self.password is not None:
            properties["password"] = self.password
        return url, properties

    def new_table(self, prefix: str) -> str:
        name = f"bench_{prefix}_{uuid.uuid4().hex[:8]}"
        self.connection.execute(
            sql.SQL("CREATE TABLE {} ({})").format(sql.Identifier(name), sql.SQL(COLUMNS))
        )
        return name

    def counts(self, table: str) -> tuple[int, int]:
        row = self.connection.execute(
            sql.SQL("SELECT count(*), count(DISTINCT id) FROM {}").format(sql.Identifier(table))
        )
        total, distinct = row.fetchone() or (0, 0)
        return int(total), int(distinct)

    def drop(self, table: str) -> None:
        self.connection.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))


def generator(
    spark: SparkSession, rows: int, partitions: int, batch_rows: int, state: Path
) -> DataFrame:
    reader: DataStreamReader = spark.readStream
    return (
        reader.format("laminar")
        .option("connector", "generator")
        .option("rows", str(rows // partitions))
        .option("partitions", str(partitions))
        .option("laminar.max.records.per.batch", str(batch_rows))
        .option("checkpointLocation", str(state))
        .load()
    )


def laminar_sink(
    spark: SparkSession, server: Server, args: argparse.Namespace, rows: int, mode: str
) -> tuple[float, str]:
    table = server.new_table(mode.replace("-", "_"))
    with tempfile.TemporaryDirectory(prefix="bench-postgres-") as state:
        started = time.perf_counter()
        writer = (
            generator(spark, rows, args.partitions, args.batch_rows, Path(state))
            .writeStream.format("laminar")
            .option("connector", "postgres" if mode == "append" else "postgres-2pc")
            .options(**server.connector_options())
            .option("table", table)
            .option("laminar.delivery", "exactly-once")
            .option("checkpointLocation", state)
            .trigger(availableNow=True)
        )
        writer.start().awaitTermination()
        seconds = time.perf_counter() - started
    return seconds, table


def spark_jdbc_sink(
    spark: SparkSession, server: Server, args: argparse.Namespace, rows: int
) -> tuple[float, str]:
    table = server.new_table("jdbc")
    url, properties = server.jdbc()

    def write(batch: DataFrame, _batch_id: int) -> None:
        batch.write.jdbc(url, table, mode="append", properties=properties)

    with tempfile.TemporaryDirectory(prefix="bench-postgres-") as state:
        started = time.perf_counter()
        query = (
            generator(spark, rows, args.partitions, args.batch_rows, Path(state))
            .writeStream.foreachBatch(write)
            .option("checkpointLocation", state)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        seconds = time.perf_counter() - started
    return seconds, table


def bridge_floor(spark: SparkSession, args: argparse.Namespace, rows: int, sink: str) -> float:
    """The generator into the SDK's ``null`` sink (``sink="null"``) or Spark's ``noop``."""
    with tempfile.TemporaryDirectory(prefix="bench-postgres-") as state:
        stream = generator(spark, rows, args.partitions, args.batch_rows, Path(state))
        writer = (
            stream.writeStream.format("noop")
            if sink == "noop"
            else stream.writeStream.format("laminar").option("connector", sink)
        )
        started = time.perf_counter()
        query = writer.option("checkpointLocation", state).trigger(availableNow=True).start()
        query.awaitTermination()
        return time.perf_counter() - started


def laminar_keyset_read(spark: SparkSession, server: Server, table: str, rows: int) -> float:
    bounds = ",".join(str(rows * i // 2) for i in range(1, 2))
    with tempfile.TemporaryDirectory(prefix="bench-postgres-") as state:
        started = time.perf_counter()
        query = (
            spark.readStream.format("laminar")
            .option("connector", "postgres")
            .options(**server.connector_options())
            .option("table", table)
            .option("key", "id")
            .option("partition.bounds", bounds)
            .option("laminar.max.records.per.batch", str(rows))
            .option("checkpointLocation", state)
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", state)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        seconds = time.perf_counter() - started
        progress: list[Any] = query.recentProgress
    read = sum(int(p["numInputRows"]) for p in progress)
    if read != rows:
        raise SystemExit(f"the keyset source read {read} rows, not {rows}")
    return seconds


def spark_jdbc_read(spark: SparkSession, server: Server, table: str, rows: int) -> float:
    url, properties = server.jdbc()
    started = time.perf_counter()
    frame = spark.read.jdbc(
        url,
        table,
        column="id",
        lowerBound=0,
        upperBound=rows,
        numPartitions=2,
        properties={**properties, "fetchsize": "10000"},
    )
    frame.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def report(name: str, seconds: float, rows: int) -> None:
    print(f"{name:<32} {seconds:8.2f} s  {rows / seconds:>12,.0f} rows/s", flush=True)


VARIANTS = ("sink", "two-phase", "jdbc-sink", "source", "jdbc-read", "bridge")
"""What ``--variants`` may name: the laminar sinks, Spark's JDBC writer, the keyset source,
``spark.read.jdbc``, and the bridge's floors."""


def fill(server: Server, rows: int) -> str:
    """A table of ``rows`` rows like the sinks write, made in SQL (when no sink variant runs)."""
    table = server.new_table("read")
    server.connection.execute(
        sql.SQL("INSERT INTO {} SELECT g, g % 2, g * 0.5 FROM generate_series(0, {}) g").format(
            sql.Identifier(table), sql.Literal(rows - 1)
        )
    )
    return table


def run_sinks(
    spark: SparkSession, server: Server, args: argparse.Namespace, selected: set[str]
) -> tuple[dict[str, float], dict[str, str]]:
    """Time the selected sink variants (after their warm-up); check what they wrote."""
    sinks = {
        "sink": (
            "laminar sink (exactly once)",
            lambda rows: laminar_sink(spark, server, args, rows, "append"),
        ),
        "two-phase": (
            "laminar sink, two-phase",
            lambda rows: laminar_sink(spark, server, args, rows, "two-phase"),
        ),
        "jdbc-sink": (
            "Spark JDBC (foreachBatch)",
            lambda rows: spark_jdbc_sink(spark, server, args, rows),
        ),
    }
    chosen = [variant for variant in sinks if variant in selected]
    if chosen:
        print("warming up (untimed)...", flush=True)
    for variant in chosen:
        server.drop(sinks[variant][1](args.warm_up)[1])
    times: dict[str, float] = {}
    tables: dict[str, str] = {}
    for variant in chosen:
        name, write = sinks[variant]
        times[variant], tables[variant] = write(args.rows)
        report(name, times[variant], args.rows)
    for variant in chosen:
        total, distinct = server.counts(tables[variant])
        if variant == "jdbc-sink":
            print(f"Spark JDBC wrote {total:,} rows ({total - distinct:,} duplicated)")
        elif total != args.rows or distinct != args.rows:
            raise SystemExit(f"{variant}: {total} rows, {distinct} ids; {args.rows} expected")
    return times, tables


def run(args: argparse.Namespace) -> None:
    selected = set(args.variants)
    jar = jdbc_jar(args.jdbc_version)
    with postgres_service() as service:
        server = Server(service.dsn, service.password_file)
        spark = build_session(
            **{"spark.jars": jar, "spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"}
        )
        print(
            f"PostgreSQL {server.connection.info.server_version} ({service.provider.value}), "
            f"Spark {spark.version} {spark.sparkContext.master}, {os.cpu_count()} cores; "
            f"{args.rows:,} rows in micro-batches of {args.batch_rows:,}",
            flush=True,
        )
        times, tables = run_sinks(spark, server, args, selected)

        if selected & {"source", "jdbc-read"}:
            if "sink" not in tables:
                tables["read"] = fill(server, args.rows)
            read = tables.get("sink", tables.get("read", ""))
            server.connection.execute(
                sql.SQL("CREATE INDEX ON {} (id)").format(sql.Identifier(read))
            )
            server.connection.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(read)))
            if "source" in selected:
                times["source"] = min(
                    laminar_keyset_read(spark, server, read, args.rows) for _ in range(2)
                )
                report("laminar keyset source", times["source"], args.rows)
            if "jdbc-read" in selected:
                times["jdbc-read"] = min(
                    spark_jdbc_read(spark, server, read, args.rows) for _ in range(2)
                )
                report("spark.read.jdbc (2 partitions)", times["jdbc-read"], args.rows)

        if "bridge" in selected:
            for sink in ("null", "noop"):
                seconds = bridge_floor(spark, args, args.rows, sink)
                report(f"bridge: generator -> {sink}", seconds, args.rows)

        print()
        if {"sink", "jdbc-sink"} <= selected:
            print(
                f"sink:   laminar exactly-once / Spark JDBC = "
                f"{times['jdbc-sink'] / times['sink']:.2f}x  (target >= 2.5x)"
            )
        if {"two-phase", "jdbc-sink"} <= selected:
            print(
                f"        laminar two-phase / Spark JDBC    = "
                f"{times['jdbc-sink'] / times['two-phase']:.2f}x  (target >= 2.5x)"
            )
        if {"source", "jdbc-read"} <= selected:
            print(
                f"source: laminar keyset / spark.read.jdbc  = "
                f"{times['jdbc-read'] / times['source']:.2f}x  (target >= 1.0x)"
            )
        for table in tables.values():
            server.drop(table)
        server.connection.close()
        with contextlib.suppress(Exception):
            spark.stop()


def variants(text: str) -> list[str]:
    """``--variants``: a comma-separated list of :data:`VARIANTS`."""
    chosen = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in VARIANTS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(
            f"unknown variant(s) {unknown}; choose among {', '.join(VARIANTS)}"
        )
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--batch-rows", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--warm-up", type=int, default=200_000)
    parser.add_argument("--jdbc-version", default="42.7.4")
    parser.add_argument(
        "--variants",
        type=variants,
        default=list(VARIANTS),
        help=f"the variants to run, comma-separated (default: all of {','.join(VARIANTS)})",
    )
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    run(args)


if __name__ == "__main__":
    main()
