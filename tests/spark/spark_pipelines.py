"""Generator → laminar → memory pipelines, shared by the tests, and their runs in children.

The pipeline runs in the tests' shared session (:func:`run_exactly_once`) or in child
processes that the crash hook kills (:func:`crash_children`) — the conformance kit's runner in
both, so the SDK's tests and the kit run pipelines the same way.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from laminar_conformance.spark import SparkPipeline, run_pipeline, start_child
from pyspark.sql import SparkSession

from laminar_sdk.reference import IDS_SCHEMA

PARTITIONS = 2
BATCH_SIZE = 10
MAX_RECORDS_PER_BATCH = 25


def laminar(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the ``laminar`` command with ``args``, as a user would; its output, captured."""
    return subprocess.run(
        [sys.executable, "-m", "laminar_sdk", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def expected_ids(rows: int) -> list[int]:
    """Every id a generator of ``rows`` rows per partition produces."""
    return list(range(rows * PARTITIONS))


def ids_batch(first: int, count: int) -> pa.RecordBatch:
    """``count`` rows of the reference connectors' schema, ids from ``first`` on."""
    ids = list(range(first, first + count))
    return pa.RecordBatch.from_pydict(
        {"id": ids, "partition": [0] * count, "value": [0.5] * count}, schema=IDS_SCHEMA
    )


def committed_epochs(work: Path) -> list[str]:
    """The epochs the memory sink at ``work/sink`` has committed, by directory name."""
    committed = work / "sink" / "committed"
    return sorted(path.name for path in committed.iterdir()) if committed.exists() else []


def exactly_once_pipeline(work: Path, rows: int, timeout_s: float = 180) -> SparkPipeline:
    """Generator → memory with exactly-once, until the generator is drained.

    The checkpoint is ``work/checkpoint``, the sink ``work/sink``: running it again resumes.
    Micro-batches hold at most 25 rows, so 2 x ``rows`` rows take several epochs.
    """
    return SparkPipeline(
        source="generator",
        source_options={
            "rows": str(rows),
            "partitions": str(PARTITIONS),
            "batch_size": str(BATCH_SIZE),
        },
        sink="memory",
        sink_options={"path": str(work / "sink")},
        checkpoint_location=str(work / "checkpoint"),
        delivery="exactly-once",
        max_records_per_batch=MAX_RECORDS_PER_BATCH,
        timeout_s=timeout_s,
    )


def run_exactly_once(spark: SparkSession, work: Path, rows: int, timeout_s: float = 180) -> None:
    """Run :func:`exactly_once_pipeline` in ``spark`` (this process) until it is drained."""
    run_pipeline(spark, exactly_once_pipeline(work, rows, timeout_s))


@dataclass(frozen=True)
class CrashedRun:
    """A child that ran :func:`exactly_once_pipeline` to be killed: its exit and output."""

    work: Path
    returncode: int
    log: str
    crashed: bool


def crash_children(
    works: Mapping[str, Path], rows: int, timeout_s: float = 180
) -> dict[str, CrashedRun]:
    """Run the pipeline in one child per crash point (``STEP:EPOCH`` → its work directory).

    The children start at once, to overlap their JVMs' start-up; each is killed by the crash
    hook at its point.
    """
    children = {
        crash_at: start_child(
            exactly_once_pipeline(work, rows, timeout_s), work, "crashed", crash=crash_at
        )
        for crash_at, work in works.items()
    }
    runs = {crash_at: child.wait() for crash_at, child in children.items()}
    return {
        crash_at: CrashedRun(works[crash_at], run.returncode, run.tail(), run.crashed)
        for crash_at, run in runs.items()
    }
