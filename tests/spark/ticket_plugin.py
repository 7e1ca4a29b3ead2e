"""A source that is not deterministic, for the SDK's recovery tests: ``ticket``.

It claims to replay (``supports_replay`` keeps its default) but is not deterministic — an
author's mistake the runtime must not turn into duplicates: restored to a position, it hands
out *new* records for it, each carrying a random id. Its checkpoint counts the records handed
out, up to ``limit``. Every id it hands out is journaled with the time, in ``<path>/journal``,
so a test can tell which run handed out the records a micro-batch holds.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

import pyarrow as pa

from laminar_sdk import (
    ConfigKeySpec,
    ConnectorConfig,
    SourceBatch,
    SourceCheckpoint,
    SourceConnector,
    hookimpl,
)

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("value", pa.float64(), nullable=False),
    ]
)
PER_POLL = 10


def journal(directory: Path) -> dict[int, float]:
    """Every id handed out, with when."""
    lines = (directory / "journal").read_text().splitlines()
    return {int(i): float(t) for i, t in (line.split(",") for line in lines)}


class TicketSource(SourceConnector):
    """Hands out ``limit`` records in all, with ids drawn anew each time."""

    def __init__(self) -> None:
        self._directory = Path()
        self._limit = 0
        self._position = 0

    async def open(self, config: ConnectorConfig) -> None:
        self._directory = Path(config.require("path"))
        self._limit = config.get_parsed("limit", int, 100)

    async def poll_batch(self, max_records: int) -> SourceBatch | None:
        count = min(max_records, PER_POLL, self._limit - self._position)
        if count <= 0:
            return None
        ids = [secrets.randbits(62) for _ in range(count)]
        now = time.time()
        lines = "".join(f"{i},{now}\n" for i in ids).encode()
        descriptor = os.open(self._directory / "journal", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            os.write(descriptor, lines)
        finally:
            os.close(descriptor)
        self._position += count
        values = [float(self._position)] * count
        return SourceBatch(pa.record_batch([ids, [0] * count, values], schema=SCHEMA))

    def schema(self) -> pa.Schema:
        return SCHEMA

    def checkpoint(self) -> SourceCheckpoint:
        return SourceCheckpoint({"0": str(self._position)})

    async def restore(self, checkpoint: SourceCheckpoint) -> None:
        self._position = int(checkpoint.get_offset("0") or 0)

    async def close(self) -> None:
        pass


@hookimpl
def laminar_register_connectors(registry):  # type: ignore[no-untyped-def]
    """Register ``ticket``."""
    registry.add_source(
        "ticket",
        TicketSource,
        description="random ids; claims replay, is not deterministic",
        config_keys=[
            ConfigKeySpec("path", required=True, description="where the journal is kept"),
            ConfigKeySpec("limit", default="100", value_type=int, description="records in all"),
        ],
    )
