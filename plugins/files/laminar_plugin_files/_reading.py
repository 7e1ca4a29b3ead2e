"""Reading the source's files: which files there are, and one file's rows in the schema."""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Generator, Iterator

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.fs as pafs
import pyarrow.json as pa_json
import pyarrow.parquet as pq
from laminar_sdk import CheckpointError, ConnectorError, ReadError, SchemaMismatch, SerdeError
from laminar_sdk.reference import StorageLocation

from laminar_plugin_files._config import FileFormat

_IGNORED_PREFIXES = (".", "_")
# Messages of pyarrow's CSV and JSON readers for a value that does not convert to the declared
# column type: the file's columns do not fit the schema (anything else is a broken file).
_CONVERSION_FAILURES = ("conversion error", "changed from")
_REMOTE_HINT = (
    "; check that the endpoint is reachable (s3.endpoint, s3.region), that the credentials are "
    "valid and may list and read the prefix, and that the bucket exists"
)


def list_files(label: str, location: StorageLocation, pattern: str) -> list[str]:
    """The files under ``location`` that match ``pattern``, as sorted relative paths.

    Paths use ``/`` and are matched with :func:`fnmatch.fnmatchcase` (``*`` also matches
    ``/``). Files and directories whose names start with ``.`` or ``_`` are ignored, with
    everything below them (they are not even listed).

    :raises ReadError: when the directory cannot be listed, naming it.
    """
    filesystem = location.filesystem
    local = isinstance(filesystem, pafs.LocalFileSystem)
    found: list[str] = []
    pending = [""]
    while pending:
        prefix = pending.pop()
        # Under an object store, a prefix with no objects is simply empty; a local
        # subdirectory removed while listing holds no files any more.
        selector = pafs.FileSelector(
            location.path(prefix.rstrip("/")), allow_not_found=location.remote or bool(prefix)
        )
        try:
            entries = filesystem.get_file_info(selector)
        except FileNotFoundError:
            raise ReadError(
                f"{label}: the directory {location.shown} is gone; restore it (the source "
                "resumes where it stopped) or point 'path' at the new one"
            ) from None
        except OSError as error:
            raise ReadError(
                f"{label}: cannot list {location.show(prefix)}: {error}"
                + (_REMOTE_HINT if location.remote else "")
            ) from error
        for entry in entries:
            if entry.base_name.startswith(_IGNORED_PREFIXES):
                continue
            relative = prefix + entry.base_name
            if entry.type is pafs.FileType.Directory:
                # pyarrow's local filesystem follows symbolic links; a linked directory is not
                # descended into (it may link back up, and its files belong elsewhere).
                if not (local and os.path.islink(entry.path)):
                    pending.append(relative + "/")
            elif entry.type is pafs.FileType.File and fnmatch.fnmatchcase(relative, pattern):
                found.append(relative)
    return sorted(found)


def file_batches(
    label: str,
    location: StorageLocation,
    name: str,
    *,
    file_format: FileFormat,
    schema: pa.Schema,
    batch_size: int,
    skip: int,
) -> Generator[pa.RecordBatch, None, None]:
    """The rows of the file ``name`` after its first ``skip`` rows, in batches of ``schema``.

    ``name`` is relative to ``location``. Columns are picked by name and cast to the schema's
    types; columns the schema does not name are ignored. An empty (0-byte) file holds no rows.
    Errors surface while iterating.

    :raises SchemaMismatch: naming the file when its columns do not fit ``schema``.
    :raises SerdeError: naming the file when it cannot be parsed as ``file_format``.
    :raises ReadError: when the file cannot be opened (gone, not readable, store unreachable).
    :raises CheckpointError: when the file has fewer than ``skip`` rows.
    """
    shown = location.show(name)
    try:
        if _is_empty(location, name):
            batches: Iterator[pa.RecordBatch] = iter(())
        elif file_format is FileFormat.PARQUET:
            batches = _parquet_batches(
                label, location, name, schema, batch_size=batch_size, skip=skip
            )
            skip = 0  # the parquet reader skipped the rows itself
        elif file_format is FileFormat.CSV:
            batches = _csv_batches(location, name, schema)
        else:
            batches = _jsonl_batches(location, name, schema)
        remaining = skip
        for batch in batches:
            if remaining >= batch.num_rows:
                remaining -= batch.num_rows
                continue
            yield conform_file_batch(label, shown, schema, batch.slice(remaining))
            remaining = 0
    except (OSError, pa.ArrowException) as error:
        raise _unreadable(label, location, name, file_format, error) from error
    if remaining:
        raise CheckpointError(
            f"{label}: the checkpoint is {skip} rows into {shown}, but the file has only "
            f"{skip - remaining}; files must not change once they are in the directory"
        )


def count_rows(
    label: str,
    location: StorageLocation,
    name: str,
    *,
    file_format: FileFormat,
    schema: pa.Schema,
    batch_size: int,
) -> int:
    """How many rows the file ``name`` holds: a Parquet footer says; other files are read.

    :raises SchemaMismatch: naming the file when its columns do not fit ``schema``.
    :raises SerdeError: naming the file when it cannot be parsed as ``file_format``.
    :raises ReadError: when the file cannot be opened (gone, not readable, store unreachable).
    """
    if file_format is not FileFormat.PARQUET:
        batches = file_batches(
            label,
            location,
            name,
            file_format=file_format,
            schema=schema,
            batch_size=batch_size,
            skip=0,
        )
        return sum(batch.num_rows for batch in batches)
    try:
        if _is_empty(location, name):
            return 0
        with (
            location.filesystem.open_input_file(location.path(name)) as handle,
            pq.ParquetFile(handle) as parquet,
        ):
            _require_columns(label, location.show(name), schema, parquet.schema_arrow.names)
            return int(parquet.metadata.num_rows)
    except (OSError, pa.ArrowException) as error:
        raise _unreadable(label, location, name, file_format, error) from error


def _is_empty(location: StorageLocation, name: str) -> bool:
    """Whether the file is 0 bytes long (a file written empty: no rows, in every format).

    :raises FileNotFoundError: when the file is gone.
    """
    info = location.filesystem.get_file_info(location.path(name))
    if info.type is pafs.FileType.NotFound:
        raise FileNotFoundError(f"no such file: {location.show(name)}")
    return bool(info.size == 0)


def _parquet_batches(
    label: str,
    location: StorageLocation,
    name: str,
    schema: pa.Schema,
    *,
    batch_size: int,
    skip: int,
) -> Iterator[pa.RecordBatch]:
    shown = location.show(name)
    with (
        location.filesystem.open_input_file(location.path(name)) as handle,
        pq.ParquetFile(handle) as parquet,
    ):
        _require_columns(label, shown, schema, parquet.schema_arrow.names)
        metadata = parquet.metadata
        total = metadata.num_rows
        if skip > total:
            raise CheckpointError(
                f"{label}: the checkpoint is {skip} rows into {shown}, but the file has only "
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


def _csv_batches(
    location: StorageLocation, name: str, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    convert = pa_csv.ConvertOptions(
        column_types={field.name: field.type for field in schema}, include_columns=schema.names
    )
    with (
        location.filesystem.open_input_stream(location.path(name)) as stream,
        pa_csv.open_csv(stream, convert_options=convert) as reader,
    ):
        yield from reader


def _jsonl_batches(
    location: StorageLocation, name: str, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    # A key absent from a line reads as null; keys the schema does not name are ignored.
    # Every column is read as nullable: conform_file_batch names a null where none may be.
    nullable = pa.schema([field.with_nullable(True) for field in schema])
    parse = pa_json.ParseOptions(explicit_schema=nullable, unexpected_field_behavior="ignore")
    with (
        location.filesystem.open_input_stream(location.path(name)) as stream,
        pa_json.open_json(stream, parse_options=parse) as reader,
    ):
        yield from reader


def _require_columns(label: str, shown: str, schema: pa.Schema, names: list[str]) -> None:
    missing = [name for name in schema.names if name not in names]
    if missing:
        raise SchemaMismatch(
            f"{label}: {shown} has no column(s) {', '.join(missing)} of the declared schema "
            f"(it has {', '.join(names) or 'none'}); fix the file, or declare its columns with "
            "the 'schema' key"
        )


def conform_file_batch(
    label: str, shown: str, schema: pa.Schema, batch: pa.RecordBatch
) -> pa.RecordBatch:
    """``batch``, read from the file messages call ``shown``, with exactly ``schema``.

    Columns are picked by name and cast safely.

    :raises SchemaMismatch: naming the file and the column that is missing, does not cast
        to its declared type, or holds nulls where the schema allows none.
    """
    _require_columns(label, shown, schema, batch.schema.names)
    columns = []
    for field in schema:
        column = batch.column(field.name)
        if not column.type.equals(field.type):
            try:
                column = column.cast(field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
                raise SchemaMismatch(
                    f"{label}: column {field.name!r} of {shown} is {column.type} and does not "
                    f"convert to the declared {field.type} ({error}); fix the file, or "
                    "declare its type with the 'schema' key"
                ) from error
        if not field.nullable and column.null_count:
            raise SchemaMismatch(
                f"{label}: column {field.name!r} of {shown} holds {column.null_count} null(s), "
                "but the declared schema makes it non-nullable; fix the file, or declare the "
                "column nullable"
            )
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _unreadable(
    label: str,
    location: StorageLocation,
    name: str,
    file_format: FileFormat,
    error: OSError | pa.ArrowException,
) -> ConnectorError:
    shown = location.show(name)
    if isinstance(error, FileNotFoundError | PermissionError):
        return ReadError(
            f"{label}: cannot open {shown}: {error}; a file must stay in place and readable "
            "until the source has read it"
        )
    if isinstance(error, KeyError) or any(text in str(error) for text in _CONVERSION_FAILURES):
        return SchemaMismatch(
            f"{label}: {shown} does not fit the declared schema: {error}; fix the file, or "
            "declare the schema it has with the 'schema' key"
        )
    if location.remote and isinstance(error, OSError) and not isinstance(error, ValueError):
        # An object store's request failed (network, access, throttling): the object may be fine.
        return ReadError(f"{label}: cannot read {shown}: {error}{_REMOTE_HINT}")
    return SerdeError(
        f"{label}: {shown} is not a readable {file_format.value} file: {error}; replace it "
        "with a complete, valid file (write files elsewhere and rename them into the "
        "directory, so that the source never sees one half-written)"
    )
