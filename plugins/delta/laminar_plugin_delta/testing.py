"""Test contexts for the conformance kit (``laminar_conformance_context``).

They need nothing from ``laminar-conformance``: the kit checks them structurally, so the plugin
loads and works without the kit installed. Imported only by the plugin's
``laminar_conformance_context`` hook, when the conformance kit asks for a context.
"""

from __future__ import annotations

import os
import urllib.parse
import uuid
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
from laminar_sdk import ConnectorConfig
from laminar_sdk.reference import IDS_SCHEMA, ids_batch

from laminar_plugin_delta._sink import SINK_KEYS
from laminar_plugin_delta._table import table_location

_CONNECTOR = "delta"
SINK_URI_VARIABLE = "LAMINAR_DELTA_SINK_URI"
"""Environment variable: run the sink context on an object store, under this ``s3://`` URI."""
SINK_S3_ENDPOINT_VARIABLE = "LAMINAR_DELTA_SINK_S3_ENDPOINT"
"""Environment variable: the ``s3.endpoint`` of that store (``http://host:port``)."""


def ids_schema_text() -> str:
    """The SDK's ``ids`` schema as the sink's ``schema`` key writes it."""
    return ", ".join(f"{field.name} {field.type}" for field in IDS_SCHEMA)


class DeltaSinkContext:
    """The ``delta`` sink creating a table of ``ids`` rows at ``workdir/delta-sink``.

    The table has its change data feed enabled, and :meth:`committed_ids` reads it as an
    incremental reader does (a Delta streaming source, ``DeltaTable.load_cdf``): every row
    inserted by any version. A snapshot reader sees a file committed twice once — Delta
    keeps one ``add`` per path — but an incremental reader sees its rows twice, so this read
    is the one that shows a sink committing an epoch's files again.

    With the environment variables ``LAMINAR_DELTA_SINK_URI`` (``s3://bucket/prefix``) and
    ``LAMINAR_DELTA_SINK_S3_ENDPOINT`` set, the table is under a fresh prefix below that URI
    on that S3-compatible server instead (credentials from ``AWS_ACCESS_KEY_ID`` and
    ``AWS_SECRET_ACCESS_KEY``), and the context names the server as its
    ``network_endpoint``, so the kit's network-fault checks run with a proxy in between.
    """

    def __init__(self, workdir: Path) -> None:
        base = os.environ.get(SINK_URI_VARIABLE)
        self._endpoint = os.environ.get(SINK_S3_ENDPOINT_VARIABLE)
        if base is None or self._endpoint is None:
            self.path = str(workdir / "delta-sink")
            self._endpoint = None
        else:
            self.path = f"{base.rstrip('/')}/{workdir.name}-{uuid.uuid4().hex[:12]}"

    @property
    def network_endpoint(self) -> str | None:
        """The S3 server's ``host:port`` when the table is on one; ``None`` on local disk."""
        if self._endpoint is None:
            return None
        return urllib.parse.urlsplit(self._endpoint).netloc

    def config_through(self, address: str) -> ConnectorConfig:
        """:meth:`config`, reaching the S3 server at ``address`` (``host:port``), timeouts short.

        The kit's network-fault checks put a proxy at ``address``.
        """
        return self._config(f"http://{address}", timeout_s="2")

    def _s3_options(self, endpoint: str, timeout_s: str = "5") -> dict[str, str]:
        return {
            "s3.endpoint": endpoint,
            "s3.allow_http": str(endpoint.startswith("http://")).lower(),
            "s3.access_key": os.environ.get("AWS_ACCESS_KEY_ID", ""),
            "s3.secret_key": os.environ.get("AWS_SECRET_ACCESS_KEY", ""),
            "s3.timeout_s": timeout_s,
        }

    def config(self) -> ConnectorConfig:
        """``path`` = this context's table, created with the ``ids`` schema; ``sink.id`` kit."""
        return self._config(self._endpoint)

    def _config(self, endpoint: str | None, timeout_s: str = "5") -> ConnectorConfig:
        properties = {
            "path": self.path,
            "sink.id": "conformance",
            "table.create": "true",
            "schema": ids_schema_text(),
            "table.properties": "delta.enableChangeDataFeed=true",
        }
        if endpoint is not None:
            properties.update(self._s3_options(endpoint, timeout_s))
        return ConnectorConfig(_CONNECTOR, properties)

    def batch(self, ids: Sequence[int]) -> pa.RecordBatch:
        """An ``ids`` batch."""
        return ids_batch(ids)

    def committed_ids(self) -> list[int]:
        """The ids of every row any version of the table inserted (none before it exists)."""
        import pyarrow.compute as pc  # noqa: PLC0415
        from deltalake import DeltaTable  # noqa: PLC0415

        config = self.config().validate(SINK_KEYS)
        options = table_location("delta sink context", config).storage_options or None
        if not DeltaTable.is_deltatable(self.path, storage_options=options):
            return []
        table = DeltaTable(self.path, storage_options=options)
        changes = pa.table(table.load_cdf(starting_version=0))
        # delta-rs gives the change type as string_view, which pyarrow (26) cannot compare.
        change_type = changes.column("_change_type").cast(pa.string())
        inserted = pc.filter(changes.column("id"), pc.equal(change_type, "insert"))
        ids: list[int] = inserted.to_pylist()
        return ids

    def close(self) -> None:
        """Nothing to release: the table is in the kit's directory."""


class DeltaSourceContext:
    """The ``delta`` source reading a table of ``ids`` rows at ``workdir/delta-source``.

    The table is created with the context (version 0, no rows), partitioned by its
    ``partition`` column. Each :meth:`append` commits one new version with
    ``deltalake.write_deltalake(mode="append")``: its first half of ids with ``partition``
    1, the rest with 0, so that a version holds two data files — in the order delta-rs lists
    their ``add`` actions, which is the order the source reads them — each in row groups of
    three rows, and the kit's restores land inside files, between files and between versions.
    Versions committed while a source runs reach it (``live_appends``).
    """

    live_appends = True

    def __init__(self, workdir: Path) -> None:
        from deltalake import DeltaTable  # noqa: PLC0415 - imported for the kit only

        self.path = str(workdir / "delta-source")
        DeltaTable.create(self.path, IDS_SCHEMA, partition_by=["partition"])

    def config(self) -> ConnectorConfig:
        """``path`` = this context's table; small batches."""
        return ConnectorConfig(_CONNECTOR, {"path": self.path, "batch_size": "4"})

    def append(self, ids: Sequence[int], partition: int | None = None) -> None:
        """Commit ``ids`` as the next version of the table; the source has one partition."""
        from deltalake import WriterProperties, write_deltalake  # noqa: PLC0415

        if partition:
            raise ValueError(f"the delta source has one partition, not partition {partition}")
        half = len(ids) // 2
        batch = pa.concat_batches([ids_batch(ids[:half], partition=1), ids_batch(ids[half:])])
        write_deltalake(
            self.path,
            pa.Table.from_batches([batch]),
            mode="append",
            writer_properties=WriterProperties(max_row_group_size=3),
        )

    def ids(self, records: pa.RecordBatch) -> list[int]:
        """The ``id`` column."""
        return [int(value) for value in records.column("id").to_pylist()]

    def close(self) -> None:
        """Nothing to release: the table is in the kit's directory."""
