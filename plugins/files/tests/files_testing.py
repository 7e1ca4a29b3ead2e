"""Helpers shared by the files plugin's tests: writing source files, opening connectors, reading."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from laminar_sdk import ConnectorConfig, SourceCheckpoint
from laminar_sdk.reference import ids_batch

from laminar_plugin_files import FilesSink, FilesSource

FORMATS = ("parquet", "csv", "jsonl")


def write_source_file(
    path: Path, ids: Sequence[int], file_format: str, *, row_group_size: int | None = None
) -> Path:
    """Write ``ids`` as an ``ids``-schema file in ``file_format`` at ``path`` (parents made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_batches([ids_batch(ids)])
    if file_format == "parquet":
        pq.write_table(table, path, row_group_size=row_group_size)
    elif file_format == "csv":
        pa_csv.write_csv(table, path)
    else:
        lines = [json.dumps(row) + "\n" for row in table.to_pylist()]
        path.write_text("".join(lines), encoding="utf-8")
    return path


def open_source(directory: Path, **options: str) -> FilesSource:
    """A ``files`` source opened on ``directory`` (Parquet unless ``format`` is given)."""
    source = FilesSource()
    config = ConnectorConfig("files", {"path": str(directory), **options})
    asyncio.run(source.open(config))
    return source


def open_sink(directory: Path, **options: str) -> FilesSink:
    """A ``files`` sink opened on ``directory`` (Parquet unless ``format`` is given)."""
    sink = FilesSink()
    asyncio.run(sink.open(ConnectorConfig("files", {"path": str(directory), **options})))
    return sink


def drain(source: FilesSource, max_records: int = 1000) -> tuple[list[int], list[SourceCheckpoint]]:
    """Poll until nothing comes: the ids returned, and the checkpoint after every batch."""
    ids: list[int] = []
    checkpoints: list[SourceCheckpoint] = []
    while (batch := asyncio.run(source.poll_batch(max_records))) is not None:
        assert batch.records.schema.equals(source.schema())
        ids += batch.records.column("id").to_pylist()
        checkpoints.append(source.checkpoint())
    return ids, checkpoints


def visible_ids(directory: Path, file_format: str = "parquet") -> list[int]:
    """The ids a ``pyarrow.dataset`` reader of the whole directory sees, sorted."""
    dataset = ds.dataset(str(directory), format="json" if file_format == "jsonl" else "parquet")
    if not dataset.files:
        return []
    ids: list[Any] = dataset.to_table(columns=["id"]).column("id").to_pylist()
    return sorted(ids)


def write_epoch(sink: FilesSink, epoch: int, *batches: Sequence[int], commit: bool = True) -> None:
    """Begin ``epoch``, write each id list as a batch, pre-commit, and commit unless told not to."""

    async def run() -> None:
        await sink.begin_epoch(epoch)
        for ids in batches:
            await sink.write_batch(ids_batch(ids))
        await sink.pre_commit(epoch)
        if commit:
            await sink.commit_epoch(epoch)

    asyncio.run(run())
