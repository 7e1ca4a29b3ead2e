"""Running a pipeline file on Spark: what ``laminar run PIPELINE.toml`` does."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql.streaming.query import StreamingQuery

from laminar_sdk._pipeline_file import PipelineFile
from laminar_sdk._spark.options import (
    CHECKPOINT_STORE,
    DELIVERY,
    MAX_BYTES_PER_BATCH,
    MAX_RECORDS_PER_BATCH,
)
from laminar_sdk._spark.session import build_session

SOURCE_VIEW = "source"
"""The temporary view a pipeline's SQL transform reads the source from."""


@dataclass(frozen=True, slots=True)
class EpochProgress:
    """One micro-batch as Spark reported it: its epoch, rows, and commit time."""

    epoch: int
    rows: int
    commit_ms: int

    def __str__(self) -> str:
        return f"epoch {self.epoch}: {self.rows} rows, committed in {self.commit_ms} ms"


def start_pipeline(pipeline: PipelineFile) -> StreamingQuery:
    """Build the Spark session and start the pipeline's streaming query."""
    spark = build_session(
        master=pipeline.master,
        app_name=f"laminar {pipeline.path.stem}",
        # Each epoch is reported as it commits; Spark's own progress bar would garble that.
        **{"spark.ui.showConsoleProgress": "false"},
    )
    spark.sparkContext.setLogLevel("ERROR")
    delivery = str(pipeline.delivery)
    checkpoint_location = str(pipeline.checkpoint_location)
    reader = (
        spark.readStream.format("laminar")
        .option("connector", pipeline.source)
        .options(**pipeline.source_options)
        .option(DELIVERY, delivery)
        # Both sides keep what must survive a crash under it (a polled source: its read log).
        .option("checkpointLocation", checkpoint_location)
    )
    if pipeline.max_bytes_per_batch is not None:
        reader = reader.option(MAX_BYTES_PER_BATCH, str(pipeline.max_bytes_per_batch))
    if pipeline.max_records_per_batch is not None:
        reader = reader.option(MAX_RECORDS_PER_BATCH, str(pipeline.max_records_per_batch))
    if pipeline.checkpoint_store is not None:
        reader = reader.option(CHECKPOINT_STORE, pipeline.checkpoint_store)
    frame = reader.load()
    if pipeline.transform_sql is not None:
        frame.createOrReplaceTempView(SOURCE_VIEW)
        frame = spark.sql(pipeline.transform_sql)
    writer = (
        frame.writeStream.format("laminar")
        .option("connector", pipeline.sink)
        .options(**pipeline.sink_options)
        .option(DELIVERY, delivery)
        .option("checkpointLocation", checkpoint_location)
    )
    if pipeline.checkpoint_store is not None:
        writer = writer.option(CHECKPOINT_STORE, pipeline.checkpoint_store)
    if pipeline.trigger == "available-now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{pipeline.interval_s} seconds")
    return writer.start()


def follow(query: StreamingQuery, report: Callable[[EpochProgress], None]) -> None:
    """Wait for ``query`` to end, reporting each micro-batch once as it completes.

    On Ctrl-C the query is stopped: Spark aborts the micro-batch in flight, whose epoch is
    rolled back unless its commit was already decided (then the next start finishes it).

    :raises pyspark.errors.StreamingQueryException: when the query failed.
    """
    reported: set[int] = set()
    try:
        while True:
            finished = query.awaitTermination(1)
            for progress in query.recentProgress:
                if progress.batchId not in reported and progress.numInputRows > 0:
                    reported.add(progress.batchId)
                    commit_ms = int(progress.durationMs.get("addBatch", 0))
                    report(EpochProgress(progress.batchId, progress.numInputRows, commit_ms))
            if finished:
                return
    except KeyboardInterrupt:
        query.stop()
        raise
