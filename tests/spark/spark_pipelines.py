"""Generator → laminar → memory pipelines, shared by the tests and their child processes."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

PARTITIONS = 2
BATCH_SIZE = 10
MAX_RECORDS_PER_BATCH = 25


def expected_ids(rows: int) -> list[int]:
    """Every id a generator of ``rows`` rows per partition produces."""
    return list(range(rows * PARTITIONS))


def committed_epochs(work: Path) -> list[str]:
    """The epochs the memory sink at ``work/sink`` has committed, by directory name."""
    committed = work / "sink" / "committed"
    return sorted(path.name for path in committed.iterdir()) if committed.exists() else []


def run_exactly_once(spark: SparkSession, work: Path, rows: int, timeout_s: float = 180) -> None:
    """Run generator → memory with exactly-once until the generator is drained.

    The checkpoint is ``work/checkpoint``, the sink ``work/sink``: running it again resumes.
    Micro-batches hold at most 25 rows, so 2 x ``rows`` rows take several epochs.
    """
    source = (
        spark.readStream.format("laminar")
        .option("connector", "generator")
        .options(rows=str(rows), partitions=str(PARTITIONS), batch_size=str(BATCH_SIZE))
        .option("laminar.delivery", "exactly-once")
        .option("laminar.max.records.per.batch", str(MAX_RECORDS_PER_BATCH))
        .load()
    )
    query = (
        source.writeStream.format("laminar")
        .option("connector", "memory")
        .option("path", str(work / "sink"))
        .option("laminar.delivery", "exactly-once")
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        finished = query.awaitTermination(timeout_s)
    finally:
        query.stop()
    assert finished, f"the query did not finish within {timeout_s}s"
