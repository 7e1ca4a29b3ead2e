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

    :meth:`committed_ids` reads the table as a downstream reader would: ``deltalake``'s
    newest version, as Arrow.
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
            },
        )

    def batch(self, ids: Sequence[int]) -> pa.RecordBatch:
        """An ``ids`` batch."""
        return ids_batch(ids)

    def committed_ids(self) -> list[int]:
        """The ids of every row of the table's newest version (none before it exists)."""
        from deltalake import DeltaTable  # noqa: PLC0415

        if not DeltaTable.is_deltatable(str(self.path)):
            return []
        ids: list[int] = (
            DeltaTable(str(self.path)).to_pyarrow_table(columns=["id"])["id"].to_pylist()
        )
        return ids

    def close(self) -> None:
        """Nothing to release: the table is in the kit's directory."""
