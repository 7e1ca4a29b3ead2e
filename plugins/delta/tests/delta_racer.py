"""One of two writers racing to commit the same epochs to one Delta table (a child process).

``python delta_racer.py CONFIG_JSON WRITER EPOCHS``: for each epoch in turn, a new ``delta``
sink instance stages rows of its own — ids ``WRITER * 100000 + epoch * 100 + k``, the epoch in
``value`` — and commits them as that epoch. Run two at once: each epoch must end up holding
one writer's rows, once.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator

import pyarrow as pa
from laminar_sdk import ConnectorConfig
from laminar_sdk.reference import IDS_SCHEMA

from laminar_plugin_delta import DeltaSink

ROWS_PER_EPOCH = 5


def rows(writer: int, epoch: int) -> pa.RecordBatch:
    ids = [writer * 100000 + epoch * 100 + k for k in range(ROWS_PER_EPOCH)]
    columns = [ids, [0] * len(ids), [float(epoch)] * len(ids)]
    return pa.RecordBatch.from_arrays(
        [pa.array(c, f.type) for c, f in zip(columns, IDS_SCHEMA, strict=True)], schema=IDS_SCHEMA
    )


async def race(properties: dict[str, str], writer: int, epochs: int) -> None:
    for epoch in range(epochs):
        sink = DeltaSink()
        await sink.open(ConnectorConfig("delta", properties))

        async def batches(epoch: int = epoch) -> AsyncIterator[pa.RecordBatch]:
            yield rows(writer, epoch)

        descriptor = await sink.stage(epoch, f"writer-{writer}", batches())
        await sink.commit_aggregated(epoch, [descriptor])
        await sink.close()


if __name__ == "__main__":
    asyncio.run(race(json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])))
