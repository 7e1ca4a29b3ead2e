"""The read log: a polled micro-batch's records, stored in slices, read back, deleted."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pyarrow as pa
import pytest
from spark_pipelines import ids_batch

from laminar_sdk import CheckpointError, CheckpointId, ReadError, open_checkpointer
from laminar_sdk._spark import read_log
from laminar_sdk._spark.read_log import ReadLog, ReadLogEntry
from laminar_sdk.reference import IDS_SCHEMA


def log_at(directory: Path, source: str = "my source/1") -> ReadLog:
    return ReadLog(open_checkpointer(str(directory)), source)


def read_ids(log: ReadLog, entry: ReadLogEntry) -> list[int]:
    async def read() -> list[int]:
        ids: list[int] = []
        for logged in entry.slices:
            for batch in await log.read(logged):
                assert batch.schema.equals(IDS_SCHEMA)
                ids += batch.column("id").to_pylist()
        return ids

    return asyncio.run(read())


def test_a_micro_batch_is_logged_in_slices_and_read_back_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches = [ids_batch(first, 100) for first in range(0, 1000, 100)]
    monkeypatch.setattr(read_log, "SLICE_BYTES", batches[0].nbytes * 3)
    log = log_at(tmp_path)

    entry = asyncio.run(log.append(batches, IDS_SCHEMA))

    assert [logged.rows for logged in entry.slices] == [300, 300, 300, 100]
    assert entry.rows == 1000
    assert read_ids(log, entry) == list(range(1000))
    assert all("/operators/source.my_source_1/" in s.path for s in entry.slices)
    assert ReadLogEntry.from_dict(entry.to_dict()) == entry, "it travels in Spark's offsets"


def test_a_corrupted_slice_is_an_error_naming_it(tmp_path: Path) -> None:
    log = log_at(tmp_path)
    entry = asyncio.run(log.append([ids_batch(0, 10)], IDS_SCHEMA))
    stored = tmp_path / entry.slices[0].path
    data = bytearray(stored.read_bytes())
    data[-1] ^= 0xFF
    stored.write_bytes(bytes(data))

    with pytest.raises(ReadError, match="corrupted") as error:
        read_ids(log, entry)

    assert entry.slices[0].path in str(error.value)
    assert "Spark's checkpoint" in str(error.value)


def test_discarding_a_committed_entry_deletes_it_and_old_orphans_only(tmp_path: Path) -> None:
    log = log_at(tmp_path)
    other = log_at(tmp_path, "another")
    orphan = asyncio.run(log.append([ids_batch(0, 5)], IDS_SCHEMA))
    committed = asyncio.run(log.append([ids_batch(5, 5)], IDS_SCHEMA))
    planned = asyncio.run(log.append([ids_batch(10, 5)], IDS_SCHEMA))
    not_ours = asyncio.run(other.append([ids_batch(0, 5)], IDS_SCHEMA))

    def left() -> set[str]:
        return {path.relative_to(tmp_path).as_posix() for path in tmp_path.rglob("*.snap")}

    asyncio.run(log.discard(committed))
    kept = {orphan.slices[0].path, planned.slices[0].path, not_ours.slices[0].path}
    assert left() == kept, "a recent orphan may still be in flight"
    asyncio.run(log.discard(committed, grace_s=0))
    assert left() == {planned.slices[0].path, not_ours.slices[0].path}
    assert read_ids(log, planned) == list(range(10, 15))
    assert orphan.checkpoint_id < committed.checkpoint_id < planned.checkpoint_id


def test_an_orphan_younger_than_the_grace_is_kept(tmp_path: Path) -> None:
    log = log_at(tmp_path)
    orphan = asyncio.run(log.append([ids_batch(0, 5)], IDS_SCHEMA))
    committed = asyncio.run(log.append([ids_batch(5, 5)], IDS_SCHEMA))
    stored = tmp_path / orphan.slices[0].path
    an_hour_ago = time.time() - 3600
    os.utime(stored, (an_hour_ago, an_hour_ago))  # age is the id's, not the file's

    asyncio.run(log.discard(committed))

    assert stored.exists()


@pytest.mark.parametrize(
    "logged",
    [
        None,
        {"id": "nope", "slices": []},
        {"id": str(CheckpointId.new()), "slices": [{"path": "x", "sha256": "y", "rows": 1}]},
        {"id": str(CheckpointId.new())},
    ],
)
def test_a_malformed_entry_in_the_offset_log_is_an_error(logged: object) -> None:
    with pytest.raises(CheckpointError, match="offset log edited by hand"):
        ReadLogEntry.from_dict(logged)


def test_the_log_holds_every_column_type_spark_hands_over(tmp_path: Path) -> None:
    schema = pa.schema([("s", pa.string()), ("t", pa.timestamp("us", tz="UTC"))])
    batch = pa.record_batch(
        [pa.array(["a", None]), pa.array([1, 2], pa.timestamp("us", "UTC"))], schema=schema
    )
    log = log_at(tmp_path)
    entry = asyncio.run(log.append([batch], schema))

    async def read() -> pa.Table:
        return (await log.read(entry.slices[0])).read_all()

    assert asyncio.run(read()).to_batches()[0].equals(batch)
