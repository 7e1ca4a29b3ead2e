"""Writing the sink's staged files: Parquet or JSON Lines, rolling over at a row count."""

from __future__ import annotations

import datetime
import decimal
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from laminar_sdk import SerdeError, fsync_path

from laminar_plugin_files._config import FileFormat


def _json_value(value: object) -> str:
    """The JSON text of a value :func:`json.dumps` has no encoding for."""
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()  # what Arrow's JSON reader parses back for these types
    if isinstance(value, decimal.Decimal):
        return str(value)
    raise TypeError(f"a {type(value).__name__} has no JSON representation")


def json_lines(label: str, batch: pa.RecordBatch) -> bytes:
    """``batch`` as JSON Lines: one object per row, keys in column order.

    :raises SerdeError: for a value JSON cannot hold (binary data, NaN, infinities).
    """
    try:
        return b"".join(
            json.dumps(
                row, default=_json_value, allow_nan=False, ensure_ascii=False, separators=(",", ":")
            ).encode()
            + b"\n"
            for row in batch.to_pylist()
        )
    except (TypeError, ValueError) as error:
        raise SerdeError(
            f"{label}: a record cannot be written as JSON Lines ({error}); write format "
            "'parquet' instead, or cast the column to a type JSON can hold"
        ) from error


class StagedFiles:
    """The files one writer stages in a directory: ``<prefix>-00000<ext>``, and so on.

    A new file starts when the current one holds ``rows_per_file`` rows (``None``: never).
    Nothing is durable before :meth:`finish`.

    :param label: the connector, for messages.
    :param directory: the staging directory (it exists).
    :param prefix: the start of every file name; unique to this writer within the directory.
    """

    def __init__(
        self,
        label: str,
        directory: Path,
        *,
        prefix: str,
        file_format: FileFormat,
        schema: pa.Schema,
        rows_per_file: int | None,
    ) -> None:
        self.names: list[str] = []
        self.rows = 0
        self._label = label
        self._directory = directory
        self._prefix = prefix
        self._format = file_format
        self._schema = schema
        self._rows_per_file = rows_per_file
        self._rows_in_file = 0
        self._parquet: pq.ParquetWriter | None = None

    def write(self, batch: pa.RecordBatch) -> None:
        """Append ``batch`` (already in the schema) to the staged files."""
        offset = 0
        while offset < batch.num_rows:
            if not self.names or self._rows_in_file == self._rows_per_file:
                self._start_file()
            count = batch.num_rows - offset
            if self._rows_per_file is not None:
                count = min(count, self._rows_per_file - self._rows_in_file)
            self._append(batch.slice(offset, count))
            offset += count
            self._rows_in_file += count
            self.rows += count

    def _start_file(self) -> None:
        self._close_file()
        name = f"{self._prefix}-{len(self.names):05d}{self._format.extension}"
        self.names.append(name)
        self._rows_in_file = 0
        if self._format is FileFormat.PARQUET:
            self._parquet = pq.ParquetWriter(str(self._directory / name), self._schema)
        else:
            # Truncate: a file left by an earlier attempt under this name is replaced.
            (self._directory / name).write_bytes(b"")

    def _append(self, batch: pa.RecordBatch) -> None:
        if self._parquet is not None:
            self._parquet.write_batch(batch)
            return
        with (self._directory / self.names[-1]).open("ab") as file:
            file.write(json_lines(self._label, batch))

    def _close_file(self) -> None:
        if self._parquet is not None:
            self._parquet.close()
            self._parquet = None

    def finish(self) -> list[str]:
        """Close the files and make them, and their names, durable; return their names."""
        self._close_file()
        for name in self.names:
            fsync_path(self._directory / name)
        fsync_path(self._directory)
        return list(self.names)

    def abandon(self) -> None:
        """Close the open file without making anything durable (it is discarded later)."""
        self._close_file()
