"""Reading the source's files: which files there are, and one file's rows in the schema."""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Generator, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq
from laminar_sdk import CheckpointError, ConnectorError, ReadError, SchemaMismatch, SerdeError

from laminar_plugin_files._config import FileFormat

_IGNORED_PREFIXES = (".", "_")
# Messages of pyarrow's CSV and JSON readers for a value that does not convert to the declared
# column type: the file's columns do not fit the schema (anything else is a broken file).
_CONVERSION_FAILURES = ("conversion error", "changed from")


def list_files(label: str, directory: Path, pattern: str) -> list[str]:
    """The files under ``directory`` that match ``pattern``, as sorted relative paths.

    Paths use ``/`` and are matched with :func:`fnmatch.fnmatchcase` (``*`` also matches
    ``/``). Files and directories whose names start with ``.`` or ``_`` are ignored, with
    everything below them.

    :raises ReadError: when ``directory`` cannot be listed.
    """
    found: list[str] = []
    pending = [("", directory)]
    while pending:
        prefix, current = pending.pop()
        try:
            with os.scandir(current) as entries:
                for entry in entries:
                    if entry.name.startswith(_IGNORED_PREFIXES):
                        continue
                    relative = prefix + entry.name
                    if entry.is_dir(follow_symlinks=False):
                        pending.append((relative + "/", Path(entry.path)))
                    elif entry.is_file() and fnmatch.fnmatchcase(relative, pattern):
                        found.append(relative)
        except FileNotFoundError:
            if current != directory:
                continue  # a subdirectory removed while listing holds no files any more
            raise ReadError(
                f"{label}: the directory {directory} is gone; restore it (the source resumes "
                "where it stopped) or point 'path' at the new one"
            ) from None
        except OSError as error:
            raise ReadError(f"{label}: cannot list {current}: {error}") from error
    return sorted(found)


def file_batches(
    label: str,
    path: Path,
    *,
    file_format: FileFormat,
    schema: pa.Schema,
    batch_size: int,
    skip: int,
) -> Generator[pa.RecordBatch, None, None]:
    """The rows of the file at ``path`` after its first ``skip`` rows, in batches of ``schema``.

    Columns are picked by name and cast to the schema's types; columns the schema does not
    name are ignored. An empty (0-byte) file holds no rows. Errors surface while iterating.

    :raises SchemaMismatch: naming the file when its columns do not fit ``schema``.
    :raises SerdeError: naming the file when it cannot be parsed as ``file_format``.
    :raises ReadError: when the file cannot be opened (gone, not readable).
    :raises CheckpointError: when the file has fewer than ``skip`` rows.
    """
    try:
        if path.stat().st_size == 0:
            batches: Iterator[pa.RecordBatch] = iter(())
        elif file_format is FileFormat.PARQUET:
            batches = _parquet_batches(label, path, schema, batch_size, skip)
            skip = 0  # the parquet reader skipped the rows itself
        elif file_format is FileFormat.CSV:
            batches = _csv_batches(path, schema)
        else:
            batches = _jsonl_batches(path, schema)
        remaining = skip
        for batch in batches:
            if remaining >= batch.num_rows:
                remaining -= batch.num_rows
                continue
            yield conform_file_batch(label, path, schema, batch.slice(remaining))
            remaining = 0
    except (OSError, pa.ArrowException) as error:
        raise _unreadable(label, path, file_format, error) from error
    if remaining:
        raise CheckpointError(
            f"{label}: the checkpoint is {skip} rows into {path}, but the file has only "
            f"{skip - remaining}; files must not change once they are in the directory"
        )


def count_rows(
    label: str, path: Path, *, file_format: FileFormat, schema: pa.Schema, batch_size: int
) -> int:
    """How many rows the file at ``path`` holds: a Parquet footer says; other files are read.

    :raises SchemaMismatch: naming the file when its columns do not fit ``schema``.
    :raises SerdeError: naming the file when it cannot be parsed as ``file_format``.
    :raises ReadError: when the file cannot be opened (gone, not readable).
    """
    if file_format is not FileFormat.PARQUET:
        batches = file_batches(
            label, path, file_format=file_format, schema=schema, batch_size=batch_size, skip=0
        )
        return sum(batch.num_rows for batch in batches)
    try:
        if path.stat().st_size == 0:
            return 0
        with pq.ParquetFile(str(path)) as parquet:
            _require_columns(label, path, schema, parquet.schema_arrow.names)
            return int(parquet.metadata.num_rows)
    except (OSError, pa.ArrowException) as error:
        raise _unreadable(label, path, file_format, error) from error


def _parquet_batches(
    label: str, path: Path, schema: pa.Schema, batch_size: int, skip: int
) -> Iterator[pa.RecordBatch]:
    with pq.ParquetFile(str(path)) as parquet:
        _require_columns(label, path, schema, parquet.schema_arrow.names)
        metadata = parquet.metadata
        total = metadata.num_rows
        if skip > total:
            raise CheckpointError(
                f"{label}: the checkpoint is {skip} rows into {path}, but the file has only "
                f"{total}; files must not change once they are in the directory"
            )
        # Whole row groups before the position are not read at all.
        groups: list[int] = []
        for group in range(metadata.num_row_groups):
            rows = metadata.row_group(group).num_rows
            if not groups and skip >= rows:
                skip -= rows
                continue
            groups.append(group)
        if not groups:
            return
        batches = parquet.iter_batches(
            batch_size=batch_size, row_groups=groups, columns=schema.names
        )
        for batch in batches:
            if skip >= batch.num_rows:
                skip -= batch.num_rows
                continue
            yield batch.slice(skip)
            skip = 0


def _csv_batches(path: Path, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    convert = pa_csv.ConvertOptions(
        column_types={field.name: field.type for field in schema}, include_columns=schema.names
    )
    with pa_csv.open_csv(str(path), convert_options=convert) as reader:
        yield from reader


def _jsonl_batches(path: Path, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    # A key absent from a line reads as null; keys the schema does not name are ignored.
    # Every column is read as nullable: conform_file_batch names a null where none may be.
    nullable = pa.schema([field.with_nullable(True) for field in schema])
    parse = pa_json.ParseOptions(explicit_schema=nullable, unexpected_field_behavior="ignore")
    with pa_json.open_json(str(path), parse_options=parse) as reader:
        yield from reader


def _require_columns(label: str, path: Path, schema: pa.Schema, names: list[str]) -> None:
    missing = [name for name in schema.names if name not in names]
    if missing:
        raise SchemaMismatch(
            f"{label}: {path} has no column(s) {', '.join(missing)} of the declared schema "
            f"(it has {', '.join(names) or 'none'}); fix the file, or declare its columns with "
            "the 'schema' key"
        )


def conform_file_batch(
    label: str, path: Path, schema: pa.Schema, batch: pa.RecordBatch
) -> pa.RecordBatch:
    """``batch`` read from ``path`` with exactly ``schema``: columns by name, cast safely.

    :raises SchemaMismatch: naming the file and the column that is missing, does not cast
        to its declared type, or holds nulls where the schema allows none.
    """
    _require_columns(label, path, schema, batch.schema.names)
    columns = []
    for field in schema:
        column = batch.column(field.name)
        if not column.type.equals(field.type):
            try:
                column = column.cast(field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
                raise SchemaMismatch(
                    f"{label}: column {field.name!r} of {path} is {column.type} and does not "
                    f"convert to the declared {field.type} ({error}); fix the file, or "
                    "declare its type with the 'schema' key"
                ) from error
        if not field.nullable and column.null_count:
            raise SchemaMismatch(
                f"{label}: column {field.name!r} of {path} holds {column.null_count} null(s), "
                "but the declared schema makes it non-nullable; fix the file, or declare the "
                "column nullable"
            )
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _unreadable(
    label: str, path: Path, file_format: FileFormat, error: OSError | pa.ArrowException
) -> ConnectorError:
    if isinstance(error, FileNotFoundError | PermissionError):
        return ReadError(
            f"{label}: cannot open {path}: {error}; a file must stay in place and readable "
            "until the source has read it"
        )
    if isinstance(error, KeyError) or any(text in str(error) for text in _CONVERSION_FAILURES):
        return SchemaMismatch(
            f"{label}: {path} does not fit the declared schema: {error}; fix the file, or "
            "declare the schema it has with the 'schema' key"
        )
    return SerdeError(
        f"{label}: {path} is not a readable {file_format.value} file: {error}; replace it "
        "with a complete, valid file (write files elsewhere and rename them into the "
        "directory, so that the source never sees one half-written)"
    )
