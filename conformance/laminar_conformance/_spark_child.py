"""``python -m laminar_conformance._spark_child PIPELINE.json``: run a pipeline on Spark.

The child process of :func:`~laminar_conformance._spark_pipeline.run_in_child`: it builds a
Spark session (local, tuned to start fast; with ``--spark-connect``, a Spark Connect client of
a local server it starts), runs the :class:`SparkPipeline` until its source has nothing more,
and exits 0 — or dies where ``LAMINAR_SPARK_CRASH_AT`` says, when set.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
import shutil
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession, functions
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.types import DoubleType, IntegerType, LongType

from laminar_conformance._spark_pipeline import (
    CONTEXT_IDS,
    RECORD_KEY,
    RELEASE,
    SPARK_CONNECT_VARIABLE,
    STANDBY_FLAG,
    TAKE_RECORDS,
    IdsTransform,
    SparkPipeline,
    record_id,
)
from laminar_conformance.services import LocalSparkConnect
from laminar_sdk.faults import CRASH_AT_FILE_PREFIX, CRASH_AT_VARIABLE
from laminar_sdk.spark import build_session

FAST_START = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""JVM options for a driver that lives for one short query: the JIT's fast tier and a serial
collector start it seconds sooner, which matters with several children sharing the cores."""


DRIVER_SETTINGS = {
    "spark.driver.extraJavaOptions": FAST_START,
    "spark.ui.showConsoleProgress": "false",
}


def connected() -> bool:
    """Whether this child runs its pipeline from a Spark Connect client (``--spark-connect``)."""
    return bool(os.environ.get(SPARK_CONNECT_VARIABLE))


def session(
    pipeline: SparkPipeline, servers: contextlib.ExitStack, server_log: Path
) -> SparkSession:
    """A Spark session for ``pipeline``: its master, a quickly started driver, no progress bar.

    With ``--spark-connect``, a Spark Connect client of a server this child starts (stopped by
    ``servers``, its output in ``server_log``), whose driver runs on ``pipeline.master`` and
    whose Python workers run this interpreter: a crash point kills that driver, and this child
    exits as soon as the server is gone (its client would retry for minutes).
    """
    if connected():
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        server = LocalSparkConnect(server_log, master=pipeline.master, conf=DRIVER_SETTINGS)
        servers.enter_context(server)
        _exit_when_it_dies(server)
        return SparkSession.builder.remote(server.url).getOrCreate()
    spark = build_session(master=pipeline.master, app_name="laminar-conformance", **DRIVER_SETTINGS)
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _exit_when_it_dies(server: LocalSparkConnect) -> None:
    process = server.process
    assert process is not None, "the server was started"

    def watch() -> None:
        code = process.wait()
        if server.process is process:  # not stopped by this child
            print(f"the Spark Connect server died (exit {code})", file=sys.stderr, flush=True)
            os._exit(1)

    threading.Thread(target=watch, name="connect-server-watch", daemon=True).start()


def start_query(spark: SparkSession, pipeline: SparkPipeline) -> StreamingQuery:
    """Start ``pipeline``'s streaming query in ``spark`` (``availableNow``).

    ``spark`` is made the active session of this thread's JVM peer first. Forking a child
    (a crash case's driver) can break this thread's Py4J connection; the new connection's JVM
    thread has no active session, and without one ``writeStream.start()`` cannot find Python
    data sources (``DATA_SOURCE_NOT_FOUND``: seen when a pytest-xdist worker restarted a
    pipeline in the session that had just forked crash children).
    """
    if not connected():  # a Connect server's sessions are its own
        jvm_session = spark._jvm.org.apache.spark.sql.SparkSession  # type: ignore[union-attr]  # no public API
        jvm_session.setActiveSession(spark._jsparkSession)
    frame = (
        spark.readStream.format("laminar")
        .option("connector", pipeline.source)
        .options(**pipeline.source_options)
        .option("laminar.delivery", pipeline.delivery)
        .option("laminar.max.records.per.batch", str(pipeline.max_records_per_batch))
        # A polled source keeps its read log there, beside the sink's manifests.
        .option("checkpointLocation", pipeline.checkpoint_location)
        .load()
    )
    if pipeline.transform is not None:
        frame = _transformed(frame, pipeline.transform)
    return (
        frame.writeStream.format("laminar")
        .option("connector", pipeline.sink)
        .options(**pipeline.sink_options)
        .option("laminar.delivery", pipeline.delivery)
        .option("checkpointLocation", pipeline.checkpoint_location)
        .trigger(availableNow=True)
        .start()
    )


def run(spark: SparkSession, pipeline: SparkPipeline) -> None:
    """Run ``pipeline`` in ``spark`` until its source has nothing more.

    :raises TimeoutError: when it runs longer than ``pipeline.timeout_s``.
    """
    query = start_query(spark, pipeline)
    try:
        finished = query.awaitTermination(round(pipeline.timeout_s))
    finally:
        query.stop()
    if not finished:
        raise TimeoutError(f"the query did not finish within {pipeline.timeout_s:g}s")


def _transformed(frame: DataFrame, transform: IdsTransform) -> DataFrame:
    # Plain Spark SQL and a row-wise Python UDF: mapInArrow would need pandas.
    if transform.kind == TAKE_RECORDS:
        records = frame.sparkSession.read.parquet(transform.path)
        keys = frame.select(functions.col("id").alias(RECORD_KEY))
        return keys.join(records, RECORD_KEY).drop(RECORD_KEY)
    if transform.kind == CONTEXT_IDS:
        ids = pickle.loads(Path(transform.path).read_bytes())  # noqa: S301 - the kit's own file
        schema = to_arrow_schema(frame.schema, timezone="UTC").serialize().to_pybytes()
        id_of = functions.udf(functools.partial(record_id, ids, schema), LongType(), useArrow=False)
        ids_of_records = id_of(functions.struct(*[functions.col(c) for c in frame.columns]))
        return frame.select(ids_of_records.alias("id")).select(
            functions.col("id"),
            functions.lit(0).cast(IntegerType()).alias("partition"),
            functions.col("id").cast(DoubleType()).alias("value"),
        )
    raise ValueError(f"unknown transform {transform.kind!r}")


WARM_UP_IDS_PER_BATCH = 2
"""Two partitions of as many ids: two micro-batches."""


def warm_up(spark: SparkSession, directory: Path, like: SparkPipeline) -> None:
    """Run a pipeline of the reference connectors in ``spark``, ``directory`` its only files.

    A driver standing by does, before its crash point is set: the JVM loads and compiles what
    a laminar pipeline's first micro-batch needs and Spark starts the Python workers it keeps
    for the next queries (the installed plugins loaded in them), which otherwise takes most of
    a short run. ``generator`` -> ``memory`` on ``like``'s master, two micro-batches; nothing
    of ``like``'s checkpoint or connectors is touched.
    """
    pipeline = SparkPipeline(
        source="generator",
        source_options={"rows": str(WARM_UP_IDS_PER_BATCH), "partitions": "2", "batch_size": "1"},
        sink="memory",
        sink_options={"path": str(directory / "sink")},
        checkpoint_location=str(directory / "checkpoint"),
        max_records_per_batch=WARM_UP_IDS_PER_BATCH,
        master=like.master,
        timeout_s=like.timeout_s,
    )
    try:
        run(spark, pipeline)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def set_crash_point(point: str) -> None:
    """Write ``point`` to the file ``LAMINAR_SPARK_CRASH_AT=@FILE`` names, whole at once."""
    path = Path(os.environ[CRASH_AT_VARIABLE].removeprefix(CRASH_AT_FILE_PREFIX))
    written = path.with_suffix(".writing")
    written.write_text(point, encoding="utf-8")
    written.replace(path)  # Python workers may read it at any moment


def main(argv: Sequence[str] | None = None) -> int:
    """Run the pipeline in the file ``argv[-1]``; 0 when it finished.

    With ``--standby`` first, the Spark session is built and warmed up (:func:`warm_up`), and
    the query starts only when a line ``go [CRASH]`` arrives on standard input, after
    :func:`set_crash_point` when it names one; at its end instead, the child exits with 0.
    """
    arguments = list(sys.argv[1:] if argv is None else argv)
    standby = arguments[:1] == [STANDBY_FLAG]
    if len(arguments) != 1 + standby:
        print(
            f"usage: python -m laminar_conformance._spark_child [{STANDBY_FLAG}] PIPELINE.json",
            file=sys.stderr,
        )
        return 2
    spec = Path(arguments[-1])
    pipeline = SparkPipeline.from_json(spec.read_text(encoding="utf-8"))
    servers = contextlib.ExitStack()
    with servers:
        spark = session(pipeline, servers, spec.with_suffix(".connect-server.log"))
        return _run_in(spark, pipeline, spec, standby=standby)


def _run_in(spark: SparkSession, pipeline: SparkPipeline, spec: Path, *, standby: bool) -> int:
    try:
        if standby:
            warm_up(spark, spec.with_suffix(".warm-up"), pipeline)
            print("standing by", flush=True)
            order = sys.stdin.readline().split()
            if order[:1] != [RELEASE]:
                return 0
            if order[1:]:
                set_crash_point(order[1])
            # Released with the pipeline to run, when it was not known at the start.
            pipeline = SparkPipeline.from_json(spec.read_text(encoding="utf-8"))
        run(spark, pipeline)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
