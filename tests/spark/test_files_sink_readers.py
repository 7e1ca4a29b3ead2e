"""The files sink's directory, read by Spark's batch readers with their defaults.

The directory is written by the sink itself, in this process (the layout is the same whether
Spark's tasks or one instance write it); Spark reads it in the suite's shared session.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from laminar_plugin_files import FilesSink
from laminar_plugin_files.testing import FilesSinkContext
from pyspark.sql import SparkSession

from laminar_sdk import ConnectorConfig

pytestmark = pytest.mark.spark


def sink_directory(path: Path, file_format: str) -> Path:
    """Epochs 0 and 2 published (1 is empty), 3 pre-committed, 4 half written."""

    async def write() -> None:
        config = ConnectorConfig("files", {"path": str(path), "format": file_format})
        sink = FilesSink()
        await sink.open(config)
        for epoch, ids in ((0, [0, 1, 2]), (1, []), (2, [3, 4]), (3, [90, 91])):
            await sink.begin_epoch(epoch)
            await sink.write_batch(FilesSinkContext(path).batch(ids))
            await sink.pre_commit(epoch)
            if epoch < 3:
                await sink.commit_epoch(epoch)
        crashed = FilesSink()
        await crashed.open(config)
        await crashed.begin_epoch(4)
        await crashed.write_batch(FilesSinkContext(path).batch([92]))

    asyncio.run(write())
    return path


@pytest.mark.parametrize("file_format", ["parquet", "jsonl"])
def test_spark_reads_the_sink_directory_as_it_is(
    spark: SparkSession, tmp_path: Path, file_format: str
) -> None:
    directory = sink_directory(tmp_path / "out", file_format)
    reader = spark.read.parquet if file_format == "parquet" else spark.read.json
    frame = reader(str(directory))
    assert set(frame.columns) == {"id", "partition", "value", "epoch"}
    rows = sorted((row.id, row.epoch) for row in frame.select("id", "epoch").collect())
    assert rows == [(0, 0), (1, 0), (2, 0), (3, 2), (4, 2)], "published epochs only"
