"""Test contexts for the conformance kit (``laminar_conformance_context``).

They need nothing from ``laminar-conformance``: the kit checks them structurally, so the plugin
loads and works without the kit installed. Imported only by the plugin's
``laminar_conformance_context`` hook, when the conformance kit asks for a context.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
from laminar_sdk import ConnectorConfig
from laminar_sdk.reference import IDS_SCHEMA, ids_batch

_CONNECTOR = "delta"


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
    """

    def __init__(self, workdir: Path) -> None:
        self.path = workdir / "delta-sink"

    def config(self) -> ConnectorConfig:
        """``path`` = this context's table, created with the ``ids`` schema; ``sink.id`` kit."""
        return ConnectorConfig(
            _CONNECTOR,
            {
                "path": str(self.path),
                "sink.id": "conformance",
                "table.create": "true",
                "schema": ids_schema_text(),
                "table.properties": "delta.enableChangeDataFeed=true",
            },
        )

    def batch(self, ids: Sequence[int]) -> pa.RecordBatch:
        """An ``ids`` batch."""
        return ids_batch(ids)

    def committed_ids(self) -> list[int]:
        """The ids of every row any version of the table inserted (none before it exists)."""
        import pyarrow.compute as pc  # noqa: PLC0415
        from deltalake import DeltaTable  # noqa: PLC0415

        if not DeltaTable.is_deltatable(str(self.path)):
            return []
        changes = pa.table(DeltaTable(str(self.path)).load_cdf(starting_version=0))
        # delta-rs gives the change type as string_view, which pyarrow (26) cannot compare.
        change_type = changes.column("_change_type").cast(pa.string())
        inserted = pc.filter(changes.column("id"), pc.equal(change_type, "insert"))
        ids: list[int] = inserted.to_pylist()
        return ids

    def close(self) -> None:
        """Nothing to release: the table is in the kit's directory."""
