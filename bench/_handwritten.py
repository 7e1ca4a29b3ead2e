"""Hand-written Spark Python data sources: the baselines laminar is measured against.

Each is what a Spark user would write by hand for the same job, with no SDK in between:

- ``handwritten`` (:class:`GeneratedReader`): the generator's columns (``id: int64, partition:
  int32, value: double``) made as Arrow batches in two partitions, one task each; every row is
  there from the start and a micro-batch reads everything available unless ``batch_rows`` says
  otherwise;
- ``handwritten-parquet`` (:class:`ParquetFilesReader`): the Parquet files of a directory laid
  out as the ``bench-parquet`` source reads them, one task per source partition, each reading
  its partition's new files with :func:`basic_files.read_files` — the source's own I/O;
- their writer (:class:`StagingWriter`): each task writes its batches to a file of its own in a
  staging directory (Parquet through :class:`basic_files.ParquetFileWriter`, or Arrow IPC, or
  nothing), and the commit renames the files into ``epoch-<batch id>/``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from basic_files import SCHEMA, ParquetFileWriter, partition_files, read_files
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

SPARK_SCHEMA = "id long, partition int, value double"
WRITER_FORMATS = ("parquet", "arrow", "none")


@dataclass
class _Range(InputPartition):
    partition: int
    start: int
    end: int


class GeneratedReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``rows`` rows in two partitions, in batches of ``batch_size`` rows, made on the tasks."""

    def __init__(self, options: dict[str, str]) -> None:
        self.rows = int(options["rows"]) // 2
        self.batch_size = int(options["batch_size"])
        self.batch_rows = int(options["batch_rows"]) if "batch_rows" in options else None

    def initialOffset(self) -> dict[str, int]:
        return {"next": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadAllAvailable() if self.batch_rows is None else ReadMaxRows(self.batch_rows)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        per_partition = self.rows
        if isinstance(limit, ReadMaxRows):
            per_partition = limit.max_rows // 2
        return {"next": min(self.rows, start["next"] + per_partition)}

    def prepareForTriggerAvailableNow(self) -> None:
        pass  # every row is there from the start

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[_Range]:
        return [_Range(p, start["next"], end["next"]) for p in (0, 1) if end != start]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _Range)
        for first in range(partition.start, partition.end, self.batch_size):
            stop = min(partition.end, first + self.batch_size)
            # first*2+p, first*2+p+2, ...: Arrow kernels, no Python object per row
            twos = pa.repeat(pa.scalar(2, pa.int64()), stop - first)
            ids = pc.add(pc.cumulative_sum(twos), first * 2 + partition.partition - 2)
            yield pa.RecordBatch.from_arrays(
                [
                    ids,
                    pa.repeat(pa.scalar(partition.partition, pa.int32()), len(ids)),
                    ids.cast(pa.float64()),
                ],
                schema=SCHEMA,
            )


@dataclass
class _Files(InputPartition):
    directory: str
    names: list[str]


class ParquetFilesReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The new files of each source partition of ``path``; offsets: files read per partition."""

    def __init__(self, options: dict[str, str]) -> None:
        self.root = Path(options["path"])

    def initialOffset(self) -> dict[str, int]:
        return {}

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        return {partition: len(names) for partition, names in partition_files(self.root).items()}

    def prepareForTriggerAvailableNow(self) -> None:
        pass  # latestOffset names the files there now; the benchmark adds none meanwhile

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[_Files]:
        files = partition_files(self.root)
        return [
            _Files(str(self.root / f"p={partition}"), files[partition][start.get(partition, 0) : n])
            for partition, n in sorted(end.items())
            if n > start.get(partition, 0)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _Files)
        return read_files([Path(partition.directory) / name for name in partition.names])


@dataclass(frozen=True)
class _Written(WriterCommitMessage):
    staged: str | None


class StagingWriter(DataSourceStreamArrowWriter):
    """One file per task in a staging directory, renamed into ``epoch-<n>/`` at the commit."""

    def __init__(self, file_format: str, out: Path) -> None:
        self.file_format = file_format
        self.out = out

    def write(self, iterator: Iterator[pa.RecordBatch]) -> _Written:
        if self.file_format == "none":
            for _ in iterator:
                pass
            return _Written(None)
        context = TaskContext.get()
        assert context is not None
        path = self.out / "_staging" / f"part-{context.partitionId()}-{uuid.uuid4().hex}"
        if self.file_format == "parquet":
            writer = ParquetFileWriter(path.with_suffix(".parquet"))
            for batch in iterator:
                writer.write(batch)
            return _Written(str(writer.path) if writer.close() else None)
        path.parent.mkdir(parents=True, exist_ok=True)
        with pa.OSFile(str(path), "wb") as file, pa.ipc.new_file(file, SCHEMA) as ipc:
            for batch in iterator:
                ipc.write_batch(batch)
        return _Written(str(path))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803 - Spark's name
        epoch = self.out / f"epoch-{batchId}"
        epoch.mkdir(parents=True, exist_ok=True)
        for message in messages:
            if isinstance(message, _Written) and message.staged is not None:
                os.replace(message.staged, epoch / Path(message.staged).name)


class HandWritten(DataSource):
    """``format("handwritten")``: :class:`GeneratedReader` and :class:`StagingWriter`."""

    @classmethod
    def name(cls) -> str:
        return "handwritten"

    def schema(self) -> str:
        return SPARK_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return GeneratedReader(dict(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> StagingWriter:
        return StagingWriter(self.options["format"], Path(self.options["out"]))


class HandWrittenParquet(HandWritten):
    """``format("handwritten-parquet")``: :class:`ParquetFilesReader` and the same writer."""

    @classmethod
    def name(cls) -> str:
        return "handwritten-parquet"

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return ParquetFilesReader(dict(self.options))
