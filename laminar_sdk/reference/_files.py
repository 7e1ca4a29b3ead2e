"""Arrow IPC files holding one batch, as the memory connectors store them."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa


def arrow_file_bytes(batch: pa.RecordBatch) -> bytes:
    """Encode ``batch`` as an Arrow IPC file holding that one batch."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)
    data: bytes = sink.getvalue().to_pybytes()
    return data


def read_arrow_file(path: Path) -> pa.RecordBatch:
    """Read the batch of a file holding :func:`arrow_file_bytes` output, into memory."""
    with pa.OSFile(str(path)) as file:
        return pa.ipc.open_file(file).get_batch(0)
