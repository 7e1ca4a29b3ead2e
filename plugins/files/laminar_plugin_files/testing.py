"""Test contexts for the conformance kit (``laminar_conformance_context``).

They need nothing from ``laminar-conformance``: the kit checks them structurally, so the plugin
loads and works without the kit installed.

Imported only by the plugin's ``laminar_conformance_context`` hook, when the conformance kit asks
for a context: never when a pipeline runs.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from laminar_sdk import ConnectorConfig, make_dirs, write_file_atomically
from laminar_sdk.reference import S3_KEYS, StorageLocation, ids_batch, storage_location

from laminar_plugin_files._location import SOURCE_PATH_KEY

_CONNECTOR = "files"
SOURCE_URI_VARIABLE = "LAMINAR_FILES_SOURCE_URI"
"""Environment variable: run the source context on an object store, under this URI."""
SOURCE_S3_ENDPOINT_VARIABLE = "LAMINAR_FILES_SOURCE_S3_ENDPOINT"
"""Environment variable: the ``s3.endpoint`` of that store (S3-compatible servers)."""
# Small row groups and batches, so that restoring lands inside, between and after them.
_ROW_GROUP_SIZE = 3
_BATCH_SIZE = "4"


class FilesSinkContext:
    """The ``files`` sink writing Parquet to ``workdir/files-sink``, read as a dataset.

    :meth:`committed_ids` reads the directory as a downstream reader would:
    ``pyarrow.dataset`` over the whole of it, which skips the ``_staging`` directory.
    """

    def __init__(self, workdir: Path) -> None:
        self.path = workdir / "files-sink"

    def config(self) -> ConnectorConfig:
        """``path`` = this context's directory; Parquet; the ``ids`` schema."""
        return ConnectorConfig(_CONNECTOR, {"path": str(self.path), "format": "parquet"})

    def batch(self, ids: Sequence[int]) -> pa.RecordBatch:
        """An ``ids`` batch."""
        return ids_batch(ids)

    def committed_ids(self) -> list[int]:
        """The ids of every row a ``pyarrow.dataset`` reader of the directory sees."""
        # Imported here: it takes ~40 ms, and every process that loads the installed plugins
        # (each Spark worker and planner) imports this module, which only the kit's runs use.
        import pyarrow.dataset as ds  # noqa: PLC0415

        if not self.path.exists():
            return []
        dataset = ds.dataset(str(self.path), format="parquet")
        if not dataset.files:
            return []
        ids: list[int] = dataset.to_table(columns=["id"]).column("id").to_pylist()
        return ids

    def close(self) -> None:
        """Nothing to release: the directory is the kit's."""


class FilesSourceContext:
    """The ``files`` source reading Parquet files from ``workdir/files-source``.

    Each :meth:`append` writes one new file, atomically (a hidden temporary file renamed into
    place), named so that it sorts after every earlier one. Files appended while a source
    runs reach it (``live_appends``).

    With the environment variable ``LAMINAR_FILES_SOURCE_URI`` set (``s3://bucket/prefix``),
    the files are objects under a fresh prefix below it instead, each uploaded whole;
    ``LAMINAR_FILES_SOURCE_S3_ENDPOINT`` names an S3-compatible server. Credentials come from
    the AWS credential chain (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ...).
    """

    live_appends = True

    def __init__(self, workdir: Path) -> None:
        base = os.environ.get(SOURCE_URI_VARIABLE)
        self._options: dict[str, str] = {}
        self._store: StorageLocation | None = None
        if base is None:
            self.path = str(workdir / "files-source")
            make_dirs(Path(self.path))
        else:
            self.path = f"{base.rstrip('/')}/{workdir.name}-{uuid.uuid4().hex[:12]}"
            endpoint = os.environ.get(SOURCE_S3_ENDPOINT_VARIABLE)
            if endpoint:
                self._options["s3.endpoint"] = endpoint
                self._options["s3.allow_http"] = str(endpoint.startswith("http://")).lower()
            config = ConnectorConfig(_CONNECTOR, {"path": self.path, **self._options})
            # The source's own notion of the location: the context writes where it reads.
            self._store = storage_location(
                "files source context", config.validate((SOURCE_PATH_KEY, *S3_KEYS))
            )
        self._files = 0

    def config(self) -> ConnectorConfig:
        """``path`` = this context's directory (or prefix); Parquet; small batches."""
        return ConnectorConfig(
            _CONNECTOR,
            {"path": self.path, "format": "parquet", "batch_size": _BATCH_SIZE, **self._options},
        )

    def append(self, ids: Sequence[int], partition: int | None = None) -> None:
        """Write ``ids`` as the next file (even when empty); the source has one partition."""
        if partition:
            raise ValueError(f"the files source has one partition, not partition {partition}")
        buffer = pa.BufferOutputStream()
        pq.write_table(
            pa.Table.from_batches([ids_batch(ids)]), buffer, row_group_size=_ROW_GROUP_SIZE
        )
        name = f"part-{self._files:06d}.parquet"
        if self._store is None:
            write_file_atomically(Path(self.path) / name, buffer.getvalue().to_pybytes())
        else:
            # One PUT: an object appears whole, so no temporary name is needed.
            with self._store.filesystem.open_output_stream(self._store.path(name)) as stream:
                stream.write(buffer.getvalue())
        self._files += 1

    def ids(self, records: pa.RecordBatch) -> list[int]:
        """The ``id`` column."""
        return [int(value) for value in records.column("id").to_pylist()]

    def close(self) -> None:
        """Nothing to release (objects stay under their prefix, as local files do)."""
